"""Tracing off costs nothing: a proxy built and serving without ``--otlp-endpoint`` imports no
OpenTelemetry module (checked in a fresh interpreter, since the test session imports them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.proc

PROGRAM = """
import sys
from inferwatch.proxy import cli
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.config import ProxyConfig
from inferwatch.proxy.metrics import ProxyMetrics
metrics = ProxyMetrics()
metrics.timing(("t", "m", "v", "e", "p", "s"), 0.1, 0.2)
ProxyApp(build(ProxyConfig(), access_log=False)).families()
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
print(" ".join(loaded) or "none")
"""


def test_the_proxy_without_an_endpoint_imports_no_opentelemetry_module() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "none", result.stdout
