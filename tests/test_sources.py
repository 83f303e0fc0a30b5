"""The sidecar's source catalogue: every source module registers once, with its own flags
and its on/off switch, which takes the source's series and readiness condition away."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import pkgutil
from typing import Any, NamedTuple

import click
import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.cli import main
from inferwatch.exporters import sidecar_cli, sources
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.exporters.sidecar_cli import sidecar
from inferwatch.exporters.sources import CATALOGUE
from inferwatch.logs import JsonFormatter
from support.shared import shared_path

pytestmark = pytest.mark.unit


def test_every_source_module_is_in_the_catalogue_once() -> None:
    modules = [m.name for m in pkgutil.iter_modules(sources.__path__)]
    registered = [
        importlib.import_module(f"{sources.__name__}.{name}").REGISTRATION for name in modules
    ]
    assert sorted(r.name for r in registered) == sorted(r.name for r in CATALOGUE)
    assert len({r.name for r in CATALOGUE}) == len(CATALOGUE)


def test_the_sidecar_command_carries_every_sources_flags() -> None:
    flags = {opt for p in sidecar.params if isinstance(p, click.Option) for opt in p.opts}

    @click.command()
    def probe() -> None: ...

    for registration in CATALOGUE:
        for option in registration.options:
            option(probe)
    contributed = {opt for p in probe.params for opt in p.opts}
    assert contributed <= flags
    assert {"--engine-url", "--gpu", "--probes", "--warmup-batch-sizes"} <= contributed


def test_every_registration_has_its_switch_and_env_twin() -> None:
    switches = {p.name: p for p in sidecar.params if isinstance(p, click.Option)}
    for registration in CATALOGUE:
        switch = switches[registration.switch_name]
        assert switch.opts == [f"--collector.{registration.name}"]
        assert switch.secondary_opts == [f"--no-collector.{registration.name}"]
        assert switch.default is registration.enabled_by_default is True
    help_text = CliRunner().invoke(main, ["sidecar", "--help"]).output
    for registration in CATALOGUE:
        assert f"INFERWATCH_SIDECAR_COLLECTOR_{registration.name.upper()}" in help_text


def test_the_sidecar_binds_every_interface_by_default_and_its_help_says_why() -> None:
    """Scraped and checked from other pods, unlike the receiver, which binds loopback."""
    from inferwatch.clikit import parse_listen

    listen = next(p for p in sidecar.params if p.name == "listen")
    assert parse_listen(str(listen.default), "--listen")[0] in ("", "0.0.0.0")
    shown = " ".join(CliRunner().invoke(main, ["sidecar", "--help"]).output.split())
    assert "Every interface by default, unlike the runbook receiver (127.0.0.1)" in shown
    assert "from other pods and nodes" in shown


#: what each source adds, and only it: a series, a readiness condition
MARKS = {
    "engine": ("inferwatch_engine_up", "engine"),
    "gpu": ("inferwatch_gpu_backend_up", "gpu"),
    "probes": ("inferwatch_probe_budget_remaining_tokens", "quality"),
    "startup": ("inferwatch_replica_startup_phase", "warmup"),
}


#: sources built on another one, which go when it is switched off
DEPENDENTS = {"engine": ("startup",)}


class Served(NamedTuple):
    series: set[str]
    conditions: set[str]
    collectors: set[str]
    start_line: dict[str, Any]


def serve(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Served:
    """Run ``inferwatch sidecar`` in-process up to where it would serve, then read its
    /metrics and /readyz."""
    made: list[Sidecar] = []

    class Recorded(Sidecar):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(sidecar_cli, "Sidecar", Recorded)
    monkeypatch.setattr(sidecar_cli.uvicorn_server, "serve", lambda app, sock, limits: sock.close())
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("inferwatch.sidecar").addHandler(handler)
    try:
        result = CliRunner().invoke(main, ["sidecar", "--listen", "127.0.0.1:0", *args], env=env)
    finally:
        logging.getLogger("inferwatch.sidecar").removeHandler(handler)
    assert result.exit_code == 0, result.output
    (served,) = made

    async def read() -> tuple[str, str]:
        transport = httpx.ASGITransport(app=served.app())
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
                return (await client.get("/metrics")).text, (await client.get("/readyz")).text
        finally:
            await served.aclose()

    metrics, ready = asyncio.run(read())
    families = list(text_string_to_metric_families(metrics))
    start = [r for r in records if r.getMessage().startswith("sidecar starting")]
    return Served(
        {s.name for f in families for s in f.samples},
        {c["name"] for c in json.loads(ready)["conditions"]},
        {
            s.labels["collector"]
            for f in families
            for s in f.samples
            if s.name == "inferwatch_collector_success"
        },
        json.loads(JsonFormatter().format(start[0])),
    )


@pytest.mark.parametrize("name", [r.name for r in CATALOGUE])
def test_switching_a_source_off_removes_its_series_and_condition(
    name: str, page_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for scope_hint in ("CUDA_VISIBLE_DEVICES", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(scope_hint, raising=False)  # --gpu-scope auto: every GPU
    gpu = [f"--gpu=replay={shared_path('fixtures/gpu/nvml-h200')}"]
    engine = [f"--engine-url={page_server.url}/fixture/vllm-generated-0.33.0-1engine/metrics"]
    # The probes and the warm-up go to the engine: without it, their flags are refused.
    needs_engine = [] if name == "engine" else ["--probes=default", "--warmup-batch-sizes=1"]
    args = [*engine, *gpu, *needs_engine]
    env = {"NODE_NAME": "n1"}
    on = serve(args, env, monkeypatch)
    series, condition = MARKS[name]
    assert series in on.series and condition in on.conditions
    assert "collectors_disabled" not in on.start_line
    for off in (
        serve([*args, f"--no-collector.{name}"], env, monkeypatch),
        serve(args, {**env, f"INFERWATCH_SIDECAR_COLLECTOR_{name.upper()}": "false"}, monkeypatch),
    ):
        assert series not in off.series and condition not in off.conditions
        assert name not in off.collectors
        # the start-up tracker watches the engine: it goes with it
        assert off.collectors == on.collectors - {name, *DEPENDENTS.get(name, ())}
        assert off.start_line["collectors_disabled"] == name


def test_switching_every_source_off_is_one_usage_error() -> None:
    result = CliRunner().invoke(main, ["sidecar", *(f"--no-collector.{r.name}" for r in CATALOGUE)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Error: every source is switched off or has nothing to do" in result.output
