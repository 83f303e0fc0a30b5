"""How a request reached a canary, told by the gateway to the tenancy proxy.

Both gateways (HAProxy and the Gateway API HTTPRoute) send a share of a model's traffic to
its canary by weight, every request with ``x-inferwatch-canary: true`` (testers, the new
version's golden probes) and the requests of listed users (``x-inferwatch-user``, set by the
client or an auth layer in front). On every request they set ``x-inferwatch-split`` to the
split it came through, replacing whatever a client sent, and the proxy records it as the
``split`` label of its request, token and cost series. With the version labels this makes
traffic, latency and cost attributable per version and per split.
"""

from __future__ import annotations

from typing import Final

SPLIT_HEADER: Final = "x-inferwatch-split"
CANARY_HEADER: Final = "x-inferwatch-canary"
USER_HEADER: Final = "x-inferwatch-user"
#: the values the gateways set (a bounded set: anything else is recorded as ``other``);
#: ``fail_open`` marks a request the gateway sent to a replica regardless of its readiness,
#: because neither the model nor its fallback had a ready one
WEIGHT, HEADER, USER, FAIL_OPEN = "weight", "header", "user", "fail_open"
SPLITS: Final = (WEIGHT, HEADER, USER, FAIL_OPEN)
