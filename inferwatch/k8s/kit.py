"""``inferwatch generate k8s``: the kustomize overlays and components of ``deploy/kubernetes``.

The kit's base (``deploy/kubernetes/base``) is written by hand. Each site file
(``sites/NAME.yaml``, :mod:`inferwatch.k8s.site`) becomes an overlay
(:mod:`inferwatch.k8s.overlay`); the components (:mod:`inferwatch.k8s.components`) carry the
generated PrometheusRule and dashboard ConfigMaps into the kit, so that ``kubectl kustomize``
needs no access outside the kit's folder, and the autoscalers
(``inferwatch/k8s/autoscaling.py``); the receiver's RBAC is :mod:`inferwatch.k8s.rbac`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from inferwatch.k8s import autoscaling, components, inject, overlay, victoria
from inferwatch.k8s.rbac import receiver_rbac
from inferwatch.k8s.site import MARKER, SiteError, load_site, site_files
from inferwatch.mixin import files as generated
from inferwatch.mixin import validate

__all__ = ["KINDS", "SiteError", "render", "stale", "write"]

#: what each generated file is, for the checks run before any is written
KINDS = {
    "components/rules/prometheusrule.yaml": validate.PROMETHEUS_RULE,
    **victoria.KINDS,
    "*.yaml": validate.YAML,
}


def render(kit: Path, config_path: Path | None = None) -> dict[str, str]:
    """Relative path (under the kit's folder) -> text, for every file this module writes;
    the rules, the dashboards and the autoscalers come from the alert config (the shipped
    defaults, then ``config_path``)."""
    from inferwatch.alerts import config as alert_config

    sites = site_files(kit)
    if not sites:
        raise SiteError(f"{kit / 'sites'}: no site files (*.yaml)")
    config = alert_config.load(config_path)
    files: dict[str, str] = {"base/receiver/rbac.yaml": receiver_rbac()}
    try:
        scaled = autoscaling.scaled_model(kit)
    except (OSError, yaml.YAMLError, KeyError, ValueError, TypeError) as exc:
        where = kit / autoscaling.DEPLOYMENT_FILE
        raise SiteError(f"{where}: no model Deployment to scale ({exc!r})") from None
    headers = overlay.proxy_headers(kit)
    monitors = victoria.kit_monitors(kit, inject.NODE_AGENT_NAMESPACE)
    for path in sites:
        site = load_site(path)
        for name, text in overlay.render_overlay(site, scaled, headers, monitors, config).items():
            files[f"overlays/{name}"] = text
    for name, text in autoscaling.render_components(config, scaled).items():
        files[f"components/{name}"] = MARKER + text
    for name, text in components.render_components(config).items():
        files[f"components/{name}"] = text
    return files


def stale(kit: Path, files: Mapping[str, str]) -> list[str]:
    """Generated files under ``kit`` that differ, are missing, or are left over."""
    differ = [
        name
        for name, text in files.items()
        if not (kit / name).is_file() or (kit / name).read_text(encoding="utf-8") != text
    ]
    return differ + [str(p.relative_to(kit)) for p in _leftovers(kit, files)]


def write(kit: Path, files: Mapping[str, str]) -> generated.Written:
    """Validate and write ``files`` under ``kit`` (nothing when one fails), then remove the
    generated files no site or source makes now."""
    leftovers = _leftovers(kit, files)
    written = generated.write(kit, files, KINDS)
    for path in leftovers:
        path.unlink()
    removed = [str(path.relative_to(kit)) for path in leftovers]
    return written._replace(changed=[*written.changed, *removed])


def _leftovers(kit: Path, files: Mapping[str, str]) -> list[Path]:
    found = [p for folder in ("overlays", "components") for p in (kit / folder).rglob("*.yaml")]
    return sorted(p for p in found if str(p.relative_to(kit)) not in files)
