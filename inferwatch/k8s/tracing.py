"""A site's tracing: where the kit's proxies and in-pod probes send their spans.

A site file's optional ``tracing: {otlp_endpoint, sampling_ratio}`` becomes the
``--otlp-endpoint``/``--otlp-sampling-ratio`` flags of the model pods' tenancy proxy and of
the sidecar that runs their golden-answer probes, and of the proxy injected into the site's
``models``. The containers already carry the downward
API's ``POD_NAME``, ``POD_NAMESPACE`` and ``NODE_NAME``, which become the spans' resource
attributes (``inferwatch.tracing.DOWNWARD_API``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from inferwatch.config.schema import Fields

__all__ = ["KEYS", "Tracing", "args", "load", "model_patch"]

KEYS = {"otlp_endpoint", "sampling_ratio"}
#: an OTLP/HTTP collector's base URL, without user-info (a password belongs in a Secret)
URL = re.compile(r"https?://[^\s/@]+(/[^\s@]*)?")
MAX_URL = 253
#: the containers of ``base/model``'s pod that trace, by their index in it (the patch tests
#: each name first, so a reordered pod fails to render rather than patch the wrong one)
TRACED = {1: "inferwatch-sidecar", 2: "inferwatch-proxy"}


@dataclass(frozen=True)
class Tracing:
    otlp_endpoint: str
    sampling_ratio: float = 1.0


def load(fields: Fields) -> Tracing:
    """The ``tracing`` section (present: the endpoint is required); one-line errors."""
    fields.check_keys(KEYS, required={"otlp_endpoint"})
    return Tracing(
        otlp_endpoint=fields.matching("otlp_endpoint", "", URL, "an http(s) URL", MAX_URL),
        sampling_ratio=fields.number("sampling_ratio", 1.0, 0.0, 1.0),
    )


def args(tracing: Tracing) -> list[str]:
    """The flags the proxy and the probe runner take."""
    return [
        f"--otlp-endpoint={tracing.otlp_endpoint}",
        f"--otlp-sampling-ratio={tracing.sampling_ratio:g}",
    ]


def model_patch(tracing: Tracing, template: str = "/spec/template") -> list[dict[str, Any]]:
    """JSON patch operations adding the flags to the traced containers of ``base/model``."""
    ops: list[dict[str, Any]] = []
    for index, name in TRACED.items():
        container = f"{template}/spec/containers/{index}"
        ops.append({"op": "test", "path": f"{container}/name", "value": name})
        ops += [{"op": "add", "path": f"{container}/args/-", "value": a} for a in args(tracing)]
    return ops
