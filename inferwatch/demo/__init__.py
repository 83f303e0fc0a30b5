"""``inferwatch demo``: a small inference fleet on one machine, observed the way inferwatch does.

Modules: ``topology`` (the replicas, tenants, prices and their config files), ``processes``
(starting, checking and reaping the children), ``sharedstate`` (the Redis every proxy keeps
the budgets in), ``loadgen`` (tenants' traffic through the
gateway), ``routing`` (HAProxy, the gateway, and where it sends each model), ``signals``
(rates and quantiles from /metrics deltas), ``observer`` (the fleet state read from the
endpoints), ``scenario`` (fault timelines; shipped ones in ``scenarios/``), ``view`` (the live
table and the plain summary line), ``run`` (the demo's life) and ``cli``.
"""

from inferwatch.demo.cli import demo

__all__ = ["demo"]
