"""``inferwatch generate``: write the files derived from the metric catalogue.

Every generator writes under the current directory unless told otherwise, never into the
installed package: a checkout refreshes its committed copies by naming them
(``--out alerts/generated``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from inferwatch import catalog
from inferwatch.clikit import (
    BadInput,
    F,
    Failed,
    cannot_write,
    check_option,
    config_option,
    out_file_option,
)
from inferwatch.config import ConfigError
from inferwatch.generate import docs
from inferwatch.mixin import validate
from inferwatch.mixin.files import Written

if TYPE_CHECKING:
    from inferwatch.mixin.config import Config


def _out_dir_option(what: str, default: str, relative: bool = True) -> Callable[[F], F]:
    """``--out``: the directory a generator writes ``what`` into (``relative``: ``--help``
    says that ``default`` is taken in the current directory)."""
    return click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path(default),
        show_envvar=True,
        show_default=f"{default}/ in the current directory" if relative else None,
        help=f"Directory for {what}.",
    )


def _write_or_check(
    target: Path,
    files: Mapping[str, str],
    check: bool,
    stale: Callable[[Path, Mapping[str, str]], list[str]],
    write: Callable[[Path, Mapping[str, str]], Written],
) -> None:
    """Write the files that changed, once all are valid, or with ``--check`` fail naming the
    stale ones."""
    if check:
        outdated = stale(target, files)
        if outdated:
            raise Failed(f"stale under {target}: {', '.join(outdated)}")
        return
    written = _validated(lambda: write(target, files))
    click.echo(f"{target}: {len(written.changed)} of {len(files)} files updated")


def _validated(write: Callable[[], Written]) -> Written:
    """Run ``write``: a file that fails its checks is bad input (nothing was written); the
    checks that could not run are said in one line on stderr."""
    try:
        written = write()
    except validate.Invalid as exc:
        raise BadInput(f"nothing written: {exc}") from None
    except OSError as exc:
        raise cannot_write(exc) from None
    if written.unchecked:
        click.echo(validate.unchecked_line(written.unchecked), err=True)
    return written


def _write_from_config(
    render: Callable[[Config], Mapping[str, str]],
    kinds: Mapping[str, validate.Kind],
    config_path: Path | None,
    out: Path,
    check: bool,
) -> None:
    """The files ``render`` derives from the alert config (the shipped defaults, then
    ``config_path``), written or checked under ``out``; a bad config is bad input."""
    from inferwatch.alerts import config
    from inferwatch.mixin.files import stale, write

    try:
        files = render(config.load(config_path))
    except config.ConfigError as exc:
        raise BadInput(str(exc)) from None
    _write_or_check(out, files, check, stale, _kinds_of(write, kinds))


def _kinds_of(
    write: Callable[[Path, Mapping[str, str], Mapping[str, validate.Kind]], Written],
    kinds: Mapping[str, validate.Kind],
) -> Callable[[Path, Mapping[str, str]], Written]:
    return lambda target, files: write(target, files, kinds)


@click.group()
def generate() -> None:
    """Regenerate files derived from the metric catalogue."""


@generate.command(name="docs")
@_out_dir_option("metrics.md and porting.md", "docs", relative=False)
@check_option("a page")
def docs_pages(out: Path, check: bool) -> None:
    """Write the metric table and the porting tables (docs/metrics.md, docs/porting.md)."""
    from inferwatch.mixin.files import stale, write

    _write_or_check(out, docs.render(catalog.load()), check, stale, _kinds_of(write, docs.KINDS))


@generate.command()
@config_option(
    "generate alerts",
    "Alert config read on top of the shipped defaults (inferwatch/mixin/config.yaml).",
)
@_out_dir_option("the rule files", "generated/alerts")
@check_option("a file")
def alerts(config_path: Path | None, out: Path, check: bool) -> None:
    """Write the Prometheus rule files (one per layer, recording rules) and the recommended
    Alertmanager config (the PrometheusRule is the Kubernetes kit's: generate k8s)."""
    from inferwatch.alerts import writer

    _write_from_config(writer.render, writer.KINDS, config_path, out, check)


@generate.command()
@config_option(
    "generate slo", "Alert config (its slo section) read on top of the shipped defaults."
)
@_out_dir_option("the SLO specs", "generated/slo")
@check_option("a file")
def slo(config_path: Path | None, out: Path, check: bool) -> None:
    """Write the SLOs as Sloth (prometheus/v1 and PrometheusServiceLevel), OpenSLO (v1) and
    Pyrra (ServiceLevelObjective) specs, from the objectives the burn-rate alerts use."""
    from inferwatch.alerts import slo_specs

    _write_from_config(slo_specs.render, slo_specs.KINDS, config_path, out, check)


@generate.command()
@config_option(
    "generate dashboards",
    "Alert config (thresholds, selectors, cluster label) read on top of the defaults.",
)
@_out_dir_option("the dashboards", "generated/dashboards")
@check_option("a file")
def dashboards(config_path: Path | None, out: Path, check: bool) -> None:
    """Write the Grafana dashboards (JSON) and a provisioning file (a ConfigMap per board is
    the Kubernetes kit's: generate k8s)."""
    from inferwatch.dashboards import writer

    _write_from_config(writer.render, writer.KINDS, config_path, out, check)


@generate.command()
@click.option(
    "--topology",
    "topology_path",
    envvar="INFERWATCH_GENERATE_GATEWAY_TOPOLOGY",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Fleet topology YAML (models, replicas, ports) [default: the demo fleet at "
    "--base-port 18000].",
)
@out_file_option("Where to write haproxy.cfg [default: standard output].")
@check_option("--out")
def gateway(topology_path: Path | None, out: Path | None, check: bool) -> None:
    """Write the HAProxy gateway config (routes, health checks, weights, fallbacks)."""
    from inferwatch.demo import routing
    from inferwatch.gateway import haproxy as gw
    from inferwatch.gateway import haproxycfg

    try:
        if topology_path is None:
            text = routing.demo_example()
        else:
            text = gw.render(gw.load(topology_path))
    except gw.TopologyError as exc:
        raise BadInput(str(exc)) from None
    _one_file("haproxy.cfg", text, out, check, haproxycfg.KIND, "gateway")


def _one_file(
    name: str, text: str, out: Path | None, check: bool, kind: validate.Kind, command: str
) -> None:
    """One generated file (``name`` when it has no path), checked: on standard output without
    ``--out``; written to ``out`` when it changed, or with ``--check`` failing when stale."""
    from inferwatch.mixin.files import write

    kinds = {"*": kind}  # one file, whatever --out names it
    if out is None:
        if check:
            raise click.UsageError("--check needs --out")
        _validated(lambda: Written([], validate.check({name: text}, kinds)))
        click.echo(text, nl=False)
        return
    current = out.read_text(encoding="utf-8") if out.is_file() else None
    if check:
        if current != text:
            raise Failed(f"{out} is stale: run inferwatch generate {command}")
        return
    _validated(lambda: write(out.parent, {out.name: text}, kinds))
    click.echo(f"{out}: {'already current' if current == text else 'updated'}")


@generate.command()
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65535),
    default=18000,
    show_default=True,
    show_envvar=True,
    help="The demo fleet's first port (as inferwatch demo --base-port): its sidecars, proxies "
    "and gateway are the targets.",
)
@click.option(
    "--cluster",
    default="demo",
    show_default=True,
    show_envvar=True,
    help="The external cluster label of everything the vmagents remote-write.",
)
@out_file_option("Where to write the scrape config [default: standard output].")
@check_option("--out")
def vmagent(base_port: int, cluster: str, out: Path | None, check: bool) -> None:
    """Write vmagent's -promscrape.config: the scrape jobs the demo's Prometheus runs, with
    an external cluster label (shard it with -promscrape.cluster.* flags; docs/scaling.md)."""
    from inferwatch.demo import topology

    if not 0 < len(cluster) <= MAX_CLUSTER or not cluster.isprintable():
        raise BadInput(f"--cluster {cluster!r}: a printable label value of 1 to "
                       f"{MAX_CLUSTER} characters")  # fmt: skip
    last = base_port + topology.Ports.count() - 1
    if last > 65535:
        raise BadInput(f"--base-port {base_port}: the fleet's ports would run to {last}")
    text = topology.vmagent_config(topology.Ports.assign(base_port), cluster)
    _one_file("vmagent.yml", text, out, check, validate.SCRAPE_CONFIG, "vmagent")


#: the longest ``--cluster`` value: a label on every series, kept short
MAX_CLUSTER = 128


@generate.command()
@config_option(
    "generate k8s",
    "Alert config the kit's PrometheusRule, dashboards and autoscalers are built from, read "
    "on top of the shipped defaults.",
)
@click.option(
    "--out",
    "--dir",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("deploy/kubernetes"),
    show_envvar=True,
    show_default="deploy/kubernetes/ in the current directory",
    help="The kit's folder: overlays/ are rendered from its sites/*.yaml, components/ from "
    "the alert config's rules and dashboards. A folder without a kit is first given the shipped "
    "one (base/, example sites/); files already there are kept.",
)
@check_option("a generated file")
def k8s(config_path: Path | None, out: Path, check: bool) -> None:
    """Write the kustomize overlays (one per site file) and the rules/dashboards components."""
    from inferwatch.k8s import kit as kit_files
    from inferwatch.k8s import packaged

    if not packaged.is_kit(out):
        if check:
            raise Failed(f"{out}: no kit to check ({packaged.KIT_MARKER} is missing)")
        try:
            copied = packaged.seed(out)
        except OSError as exc:
            raise cannot_write(exc) from None
        click.echo(f"{out}: {len(copied)} files of the shipped kit copied")
    try:
        files = kit_files.render(out, config_path)
    except ConfigError as exc:  # a site file's or the alert config's
        raise BadInput(str(exc)) from None
    _write_or_check(out, files, check, kit_files.stale, kit_files.write)


@generate.command()
@config_option(
    "generate canary",
    "Alert config whose source selectors the queries use, read on top of the defaults.",
)
@_out_dir_option("the templates", "deploy/canary", relative=False)
@check_option("a file")
def canary(config_path: Path | None, out: Path, check: bool) -> None:
    """Write the canary analysis as an Argo Rollouts AnalysisTemplate and Flagger
    MetricTemplates (the checks of `inferwatch canary`)."""
    from inferwatch.canary import templates

    _write_from_config(templates.render, templates.KINDS, config_path, out, check)
