"""How an identity label value that nobody knows is spelled, everywhere.

Engine series, tenant series and probe series join on ``model`` and ``model_version``
(``... * on(model, model_version) group_left ...``). A value that is "" in one place and
"unknown" in another never joins, and an empty value vanishes from legends, so every
component writes an unknown or absent identity value as ``unknown``.

Labels that Prometheus service discovery supplies (``pod``, ``namespace``, ``node``) are
not identity values in this sense: where the sidecar leaves them out they stay empty, which
Prometheus reads as absent, so that the target's own labels fill them without a clash.
"""

from __future__ import annotations

from typing import Final

__all__ = ["KEYS", "UNKNOWN", "or_unknown"]

UNKNOWN: Final = "unknown"

#: identity labels that take ``UNKNOWN`` when no value is known
KEYS: Final = ("model", "model_version", "engine", "engine_version", "prompt_version")


def or_unknown(text: str | None) -> str:
    """``text``, or ``unknown`` when it is empty or missing."""
    return text or UNKNOWN
