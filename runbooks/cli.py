"""``inferwatch runbooks``: serve the Alertmanager receiver, check its config, reset its breaker."""

from __future__ import annotations

import json
import logging
import os
import socket
from importlib import resources
from pathlib import Path
from typing import Any

import click
import httpx

from inferwatch.auth import TokenError
from inferwatch.clikit import (
    BadInput,
    CannotRun,
    Failed,
    bind,
    cannot_write,
    config_option,
    listen_option,
    parse_listen,
    required_token,
    token_file_option,
)
from inferwatch.logs import log_event
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import inventory, lint, local, pages, registry
from inferwatch.runbooks.actions.base import Action
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher, Leader
from inferwatch.runbooks.server import MAX_BODY_BYTES, Receiver
from inferwatch.runbooks.state import DirectoryStore, MemoryStore, StateError, StateStore
from inferwatch.serving import bounded_request, uvicorn_server

logger = logging.getLogger("inferwatch.runbooks")

TOKEN_ENV = "INFERWATCH_RUNBOOKS_TOKEN"
#: seconds reset-breaker waits for the receiver's whole answer
RESET_DEADLINE_S = 30.0
DEFAULT_CONFIG = "actions.yaml (shipped)"


def _token(path: Path | None) -> str:
    """The receiver's bearer token: ``--token-file`` when given, else ``$TOKEN_ENV``."""
    return required_token(
        None if path else os.environ.get(TOKEN_ENV),
        path,
        "--token-file",
        what="token",
        missing=f"a bearer token is required: --token-file or ${TOKEN_ENV}",
    )


def _config(path: str | None) -> mapping.Config:
    try:
        if path is None:
            shipped = resources.files("inferwatch.runbooks").joinpath("actions.yaml")
            with resources.as_file(shipped) as file:
                return mapping.load(file)
        return mapping.load(path)
    except mapping.ConfigError as exc:
        raise BadInput(str(exc)) from None


@click.group()
def runbooks() -> None:
    """Act on Alertmanager alerts, safely: the runbook receiver."""


@runbooks.command()
@config_option(
    "runbooks serve",
    "Mapping config (YAML): rules from alert to action, guards, action settings.",
    show_default=DEFAULT_CONFIG,
    path_type=str,
)
@listen_option("127.0.0.1:9405")
@click.option(
    "--execute/--dry-run",
    default=None,
    show_envvar=True,
    show_default="the config's execute (false: dry-run)",
    help="Act on targets, or only record the plans in the audit log.",
)
@token_file_option(
    "--token-file", f"File holding the bearer token Alertmanager sends (else ${TOKEN_ENV})."
)
@click.option(
    "--audit-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runbooks-audit.jsonl"),
    show_envvar=True,
    help="Append-only JSONL file of every decision (fsync'd per line).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Folder of the receiver's state (idempotency, breakers, episodes, pending rollbacks), "
    "kept across restarts and shared by every receiver naming the same folder. "
    "Unset: memory only.",
)
@click.option(
    "--state-configmap",
    metavar="NAMESPACE/NAME",
    default=None,
    show_envvar=True,
    help="In Kubernetes: keep the state in this ConfigMap (conflicts retried) and elect the "
    "replica that acts through the Lease of the same name (needs the kubernetes extra).",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=MAX_BODY_BYTES,
    show_envvar=True,
    help="Webhook bodies larger than this are refused with 413 while being read.",
)
@uvicorn_server.limit_options
def serve(
    config_path: str | None,
    listen: str,
    execute: bool | None,
    token_file: Path | None,
    audit_log: Path,
    state_dir: Path | None,
    state_configmap: str | None,
    max_body_bytes: int,
    **server_limits: Any,
) -> None:
    """Receive Alertmanager webhooks (v4) and run the mapped actions, dry-run by default.
    Also serves the runbook pages at /runbooks/<AlertName> (HTML, or Markdown for
    Accept: text/markdown), where the generated rules' runbook_url points by default."""
    host, port = parse_listen(listen)
    config = _config(config_path)
    token = _token(token_file)
    acting = config.execute if execute is None else execute
    actions: dict[str, Action] = {}
    try:
        for name in sorted({rule.action for rule in config.rules}):
            actions[name] = registry.create(name, config.action_settings.get(name, {}))
        targets = inventory.build(config.inventory)
    except registry.MissingExtra as exc:
        raise CannotRun(str(exc)) from None
    except (ValueError, TokenError) as exc:
        raise BadInput(str(exc)) from None
    leader: Leader | None = None
    try:
        if state_configmap is not None:
            store, leader = _kubernetes_state(state_configmap, state_dir)
        else:
            store = DirectoryStore(state_dir) if state_dir is not None else MemoryStore()
        audit = AuditLog(audit_log)
    except OSError as exc:
        raise cannot_write(exc) from None
    except StateError as exc:
        raise CannotRun(str(exc)) from None
    sock = bind((host, port))
    dispatcher = Dispatcher(
        config, actions, audit, execute=acting, store=store, inventory=targets, leader=leader
    )
    log_event(
        logger,
        logging.INFO,
        "runbook receiver starting",
        listen="{}:{}".format(*sock.getsockname()[:2]),
        mode="execute" if acting else "dry-run",
        rules=len(config.rules),
        audit_log=str(audit_log),
    )
    app = Receiver(dispatcher, token, max_body_bytes).app()
    app.router.routes.append(pages.route(pages.load()))
    uvicorn_server.serve(app, sock, uvicorn_server.limits_from(server_limits))


def _kubernetes_state(where: str, state_dir: Path | None) -> tuple[StateStore, Leader]:
    """The ConfigMap store and the Lease election of ``--state-configmap NAMESPACE/NAME``."""
    namespace, _, name = where.partition("/")
    if state_dir is not None:
        raise BadInput("--state-configmap and --state-dir: give one state store")
    if not namespace or not name or "/" in name:
        raise BadInput(f"--state-configmap {where[:200]!r}: expected NAMESPACE/NAME")
    try:
        from inferwatch.runbooks.actions.kubernetes_api import connect
        from inferwatch.runbooks.kube_state import ConfigMapStore, LeaseElector
    except ImportError as exc:
        needs = f"--state-configmap needs {exc.name}; install inferwatch[kubernetes]"
        raise CannotRun(needs) from None
    try:
        api = connect()
    except ValueError as exc:
        raise CannotRun(str(exc)) from None
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    return ConfigMapStore(api, namespace, name), LeaseElector(api, namespace, name, identity)


@runbooks.command("check-config")
@click.argument("path", type=click.Path(dir_okay=False))
def check_config(path: str) -> None:
    """Validate a mapping config and print its rules; warn (one line each, exit 1) about
    every rule that can never act against the shipped alert rules."""
    config = _config(path)
    for rule in config.rules:
        matchers = ",".join(f'{m.label}{m.op}"{m.value}"' for m in rule.matchers)
        click.echo(f"{rule.name}: {rule.alertname}{{{matchers}}} -> {rule.action}")
    rules = resources.files("inferwatch.alerts").joinpath("generated")
    with resources.as_file(rules) as folder:
        found = lint.warnings(config, lint.shipped_alerts(folder))
    for warning in found:
        click.echo(f"{path}: warning: {warning}", err=True)
    if found:
        raise Failed(f"{path}: {len(found)} warning(s): a rule that can never act")


@runbooks.command("local-config")
@click.option(
    "--sidecar",
    multiple=True,
    default=("127.0.0.1:9400",),
    show_default=True,
    show_envvar=True,
    help="HOST:PORT of a sidecar, as Prometheus scrapes it (the alerts' instance label). "
    "Repeatable: one per replica.",
)
@click.option(
    "--model",
    default="unknown",
    show_default=True,
    show_envvar=True,
    help="The model the sidecars' replicas serve (the breaker's population).",
)
def local_config(sidecar: tuple[str, ...], model: str) -> None:
    """Print a mapping config for a receiver outside Kubernetes: the shipped rules with a
    static inventory of these sidecars. It passes check-config, where the shipped
    actions.yaml, which lists no inventory, warns that no rule has a target:
    inferwatch runbooks local-config --sidecar 127.0.0.1:9400 > actions.yaml"""
    for address in sidecar:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in address:
            raise BadInput(f"--sidecar {address[:200]!r}: expected HOST:PORT")
    click.echo(local.document(sidecar, model), nl=False)


@runbooks.command("reset-breaker")
@click.option("--url", default="http://127.0.0.1:9405", show_envvar=True, help="The receiver.")
@token_file_option("--token-file", f"File holding the receiver's bearer token (else ${TOKEN_ENV}).")
def reset_breaker(url: str, token_file: Path | None) -> None:
    """Close every open circuit breaker of a running receiver (after a person has looked)."""
    token = _token(token_file)
    try:
        endpoint = httpx.URL(url.rstrip("/") + "/admin/breaker/reset")
    except httpx.InvalidURL as exc:
        raise BadInput(f"--url {url[:200]!r}: {exc}") from None
    if endpoint.scheme not in ("http", "https") or not endpoint.host:
        raise BadInput(f"--url {url[:200]!r}: expected an http(s) URL of the receiver")
    try:
        with httpx.Client() as http:
            status, body = bounded_request.fetch(
                http,
                "POST",
                str(endpoint),
                what=url,
                deadline=bounded_request.Deadline(RESET_DEADLINE_S),
                max_bytes=1 << 20,
                headers={"authorization": f"Bearer {token}"},
            )
    except bounded_request.RequestFailed as exc:
        raise CannotRun(str(exc)) from None
    if status != 200:
        shown = " ".join(body[:200].decode(errors="replace").split())
        raise CannotRun(f"{url} answered HTTP {status}: {shown}")
    try:
        closed = [(str(u), str(g)) for u, g in json.loads(body)["closed"]]
    except (ValueError, RecursionError, KeyError, TypeError):
        raise CannotRun(f"{url} answered 200 but not as a runbook receiver does") from None
    if not closed:
        click.echo("closed 0 breakers (none was open)")
        return
    click.echo(f"closed {len(closed)} breaker(s): " + ", ".join(f"{u}/{g}" for u, g in closed))
