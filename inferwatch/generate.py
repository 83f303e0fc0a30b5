"""``inferwatch generate``: write the files derived from the metric catalogue."""

from __future__ import annotations

from pathlib import Path

import click

from inferwatch import catalog, docs


@click.group()
def generate() -> None:
    """Regenerate files derived from the metric catalogue."""


@generate.command()
@click.option(
    "--path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=Path("README.md"),
    show_envvar=True,
    help="The README whose generated metric table is rewritten.",
)
@click.option(
    "--check",
    is_flag=True,
    show_envvar=True,
    help="Fail instead of writing when the table is stale.",
)
def readme(path: Path, check: bool) -> None:
    """Rewrite the metric and porting tables in README.md."""
    if check:
        current = path.read_text(encoding="utf-8")
        try:
            fresh = docs.render_readme(current, catalog.load())
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        if fresh != current:
            raise click.ClickException(f"the generated tables in {path} are stale")
        return
    try:
        changed = docs.update_readme(path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{path}: {'updated' if changed else 'already current'}")


@generate.command()
@click.option(
    "--config",
    "config_path",
    envvar="INFERWATCH_GENERATE_ALERTS_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Alert config read on top of the shipped defaults (alerts/config.yaml).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Directory for the rule files [default: alerts/generated of this checkout].",
)
@click.option(
    "--check",
    is_flag=True,
    show_envvar=True,
    help="Fail instead of writing when a file is stale.",
)
def alerts(config_path: Path | None, out: Path | None, check: bool) -> None:
    """Write the Prometheus rule files (one per layer, recording rules), a PrometheusRule and
    the recommended Alertmanager config."""
    from inferwatch.alerts import config, writer

    try:
        files = writer.render(config.load(config_path))
    except config.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    target = out if out is not None else writer.default_out()
    if check:
        stale = writer.stale(target, files)
        if stale:
            raise click.ClickException(f"stale under {target}: {', '.join(stale)}")
        return
    changed = writer.write(target, files)
    click.echo(f"{target}: {len(changed)} of {len(files)} files updated")


@generate.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="INFERWATCH_GENERATE_DASHBOARDS_CONFIG",
    show_envvar=True,
    help="Alert config (thresholds, selectors, cluster label) read on top of the defaults.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Directory for the dashboards [default: dashboards/generated of this checkout].",
)
@click.option(
    "--check", is_flag=True, show_envvar=True, help="Fail instead of writing when a file is stale."
)
def dashboards(config_path: Path | None, out: Path | None, check: bool) -> None:
    """Write the Grafana dashboards (JSON), a ConfigMap per board and a provisioning file."""
    from inferwatch.alerts import config
    from inferwatch.alerts.writer import stale, write
    from inferwatch.dashboards import writer

    try:
        files = writer.render(config.load(config_path))
    except config.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    target = out if out is not None else writer.default_out()
    if check:
        outdated = stale(target, files)
        if outdated:
            raise click.ClickException(f"stale under {target}: {', '.join(outdated)}")
        return
    changed = write(target, files)
    click.echo(f"{target}: {len(changed)} of {len(files)} files updated")


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
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Where to write haproxy.cfg [default: standard output].",
)
@click.option(
    "--check",
    is_flag=True,
    show_envvar=True,
    help="Fail instead of writing when --out is stale.",
)
def gateway(topology_path: Path | None, out: Path | None, check: bool) -> None:
    """Write the HAProxy gateway config (routes, health checks, weights, fallbacks)."""
    from inferwatch import gateway as gw

    try:
        text = gw.demo_example() if topology_path is None else gw.render(gw.load(topology_path))
    except gw.TopologyError as exc:
        raise click.ClickException(str(exc)) from None
    if out is None:
        if check:
            raise click.UsageError("--check needs --out")
        click.echo(text, nl=False)
        return
    current = out.read_text(encoding="utf-8") if out.is_file() else None
    if check:
        if current != text:
            raise click.ClickException(f"{out} is stale: run inferwatch generate gateway")
        return
    if current != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    click.echo(f"{out}: {'already current' if current == text else 'updated'}")


@generate.command()
@click.option(
    "--dir",
    "kit",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("deploy/kubernetes"),
    envvar="INFERWATCH_GENERATE_K8S_DIR",
    show_envvar=True,
    help="The kit's folder: overlays/ are rendered from its sites/*.yaml, components/ from "
    "the generated rules and dashboards.",
)
@click.option(
    "--check",
    is_flag=True,
    show_envvar=True,
    help="Fail instead of writing when a generated file is stale.",
)
def k8s(kit: Path, check: bool) -> None:
    """Write the kustomize overlays (one per site file) and the rules/dashboards components."""
    from inferwatch import k8s as kit_files

    try:
        files = kit_files.render(kit)
    except kit_files.SiteError as exc:
        raise click.ClickException(str(exc)) from None
    if check:
        stale = kit_files.stale(kit, files)
        if stale:
            raise click.ClickException(f"stale under {kit}: {', '.join(stale)}")
        return
    changed = kit_files.write(kit, files)
    click.echo(f"{kit}: {len(changed)} of {len(files)} files updated")


@generate.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="INFERWATCH_GENERATE_CANARY_CONFIG",
    show_envvar=True,
    help="Alert config whose source selectors the queries use, read on top of the defaults.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("deploy/canary"),
    show_envvar=True,
    help="Directory for the templates.",
)
@click.option(
    "--check", is_flag=True, show_envvar=True, help="Fail instead of writing when a file is stale."
)
def canary(config_path: Path | None, out: Path, check: bool) -> None:
    """Write the canary analysis as an Argo Rollouts AnalysisTemplate and Flagger
    MetricTemplates (the checks of `inferwatch canary`)."""
    from inferwatch.alerts import config
    from inferwatch.alerts.writer import stale, write
    from inferwatch.canary import templates

    try:
        files = templates.render(config.load(config_path))
    except config.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if check:
        outdated = stale(out, files)
        if outdated:
            raise click.ClickException(f"stale under {out}: {', '.join(outdated)}")
        return
    changed = write(out, files)
    click.echo(f"{out}: {len(changed)} of {len(files)} files updated")
