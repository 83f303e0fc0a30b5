"""The names components agree on over the wire: what one of them writes and another reads.

Each is defined here once, so that a component speaks to another without importing its
internals:

- **Tenants.** Quality probes are sent as the reserved tenant ``_probe`` (header
  ``X-Inferwatch-Tenant``), so that the tenancy proxy keeps their tokens out of customer cost.
- **Splits.** Both gateways (HAProxy and the Gateway API HTTPRoute) send a share of a model's
  traffic to its canary by weight, every request with ``x-inferwatch-canary: true`` (testers,
  the new version's golden probes) and the requests of listed users (``x-inferwatch-user``,
  set by the client or an auth layer in front). On every request they set
  ``x-inferwatch-split`` to the split it came through, replacing whatever a client sent, and
  the proxy records it as the ``split`` label of its request, token and cost series.
- **The gateway's names.** The HAProxy backend of each model and the name of each server in
  it, which the runbook receiver's actions, the drill and the boards address, and the response
  header that names the server that answered.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "CANARY_HEADER",
    "FAIL_OPEN",
    "FALLBACK",
    "HEADER",
    "PROBE_TENANT",
    "SERVER_HEADER",
    "SPLITS",
    "SPLIT_HEADER",
    "TENANT_HEADER",
    "USER",
    "USER_HEADER",
    "WEIGHT",
    "backend_name",
    "canary_backend_name",
    "open_backend_name",
    "parse_server_name",
]

PROBE_TENANT: Final = "_probe"
TENANT_HEADER: Final = "X-Inferwatch-Tenant"

SPLIT_HEADER: Final = "x-inferwatch-split"
CANARY_HEADER: Final = "x-inferwatch-canary"
USER_HEADER: Final = "x-inferwatch-user"
#: the values the gateways set (a bounded set: anything else is recorded as ``other``);
#: ``fail_open`` marks a request the gateway sent to a replica regardless of its readiness,
#: because neither the model nor its fallback had a ready one
WEIGHT: Final = "weight"
HEADER: Final = "header"
USER: Final = "user"
FAIL_OPEN: Final = "fail_open"
SPLITS: Final = (WEIGHT, HEADER, USER, FAIL_OPEN)

#: the response header naming the server (``<version>:<replica>``) that answered, so that a
#: client (the drill) sees where its traffic went
SERVER_HEADER: Final = "X-Served-By"
#: the server-name prefix of a fallback model's replicas inside another model's backend
FALLBACK: Final = "fallback"


def backend_name(model: str) -> str:
    """The HAProxy backend of a model: its name with ``_`` doubled and every character outside
    ``A-Z a-z 0-9 . -`` written as ``_`` and the hex of its bytes (``org/big`` is
    ``m_org_2fbig``). No two names share a backend, nor a name another's ``_open`` or
    ``_canary`` backend, so an alert's ``model`` names a backend only when it is exactly the
    model the backend was written for (``org_big`` or ``org big`` never reach ``org/big``)."""
    return "m_" + _BACKEND_ESCAPE.sub(_escape, model)


_BACKEND_ESCAPE = re.compile(r"[^A-Za-z0-9.-]")


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    if char == "_":
        return "__"
    return "".join(f"_{byte:02x}" for byte in char.encode(errors="surrogatepass"))


def canary_backend_name(model: str) -> str:
    return backend_name(model) + "_canary"


def open_backend_name(model: str) -> str:
    """The backend of a model's replicas regardless of readiness (``fail_open``)."""
    return backend_name(model) + "_open"


def parse_server_name(name: str) -> tuple[str, str]:
    """(version or ``fallback``, replica) of a generated server name."""
    version, _, replica = name.partition(":")
    return version, replica
