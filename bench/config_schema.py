"""Config schema: the layer's field reader against pydantic v2, on the largest config we load.

A proxy config of 2,000 tenants (each with key hashes and a budget) is parsed once by the
config layer, then validated by ``inferwatch.proxy.config.parse`` and by an equivalent
pydantic model of its tenants section; pydantic's import time is measured in a fresh process.
Run: ``.venv/bin/python bench/config_schema.py`` (pydantic comes with the test extras).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

from inferwatch import config as layer
from inferwatch.proxy import config as proxy_config

TENANTS = 2000


def _document() -> str:
    tenants = {
        f"tenant-{i}": {
            "key_sha256": [hashlib.sha256(f"k{i}".encode()).hexdigest()],
            "priority": "normal",
            "budget": {"tokens": 1_000_000, "window": "1h"},
        }
        for i in range(TENANTS)
    }
    return yaml.safe_dump({"tenants": tenants})


def _best(run: Callable[[], Any], rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def _import_ms(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [float(subprocess.check_output([sys.executable, "-c", code])) for _ in range(5)]
    return min(runs) * 1000


def main() -> None:
    import pydantic

    class Budget(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        tokens: int = pydantic.Field(ge=1)
        window: str = "1h"
        tolerance: int = 0

        @pydantic.field_validator("window")
        @classmethod
        def _window(cls, value: str) -> str:
            layer.Duration.parse(value)
            return value

    class Tenant(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        key_sha256: list[str] = pydantic.Field(default_factory=list)
        priority: str = "normal"
        max_concurrency: int = 0
        budget: Budget | None = None

    tenants = pydantic.TypeAdapter(dict[str, Tenant])
    text = _document()
    document = layer.parse(text, "bench.yaml")
    bad = layer.parse(text.replace("window: 1h", "window: 1.5m", 1), "bench.yaml")
    print(f"proxy config of {TENANTS} tenants, {len(text) >> 10} KiB")
    print(f"  parse YAML (config layer)      {_best(lambda: layer.parse(text, 'b')):8.1f} ms")
    print(f"  validate, field reader         {_best(lambda: proxy_config.parse(document)):8.1f} ms")
    checked = _best(lambda: tenants.validate_python(document["tenants"]))
    print(f"  validate, pydantic v2          {checked:8.1f} ms")
    print(f"  import pydantic.main (models)  {_import_ms('pydantic.main'):8.1f} ms")
    print(f"  import inferwatch.config       {_import_ms('inferwatch.config'):8.1f} ms")
    try:
        proxy_config.parse(bad, "bench.yaml")
    except proxy_config.ConfigError as exc:
        print(f"  error, field reader: {exc}")
    try:
        tenants.validate_python(bad["tenants"])
    except pydantic.ValidationError as exc:
        print(f"  error, pydantic: {exc!s}".replace("\n", "\\n"))


if __name__ == "__main__":
    main()
