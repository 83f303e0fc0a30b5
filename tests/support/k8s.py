"""The Kubernetes kit as ``kubectl kustomize`` renders it, and the offline schema check.

Built-in kinds are checked by kubernetes-validate's strict schemas; CRD kinds by the
openAPIV3Schema of their CRDs, read in place from ../shared/fixtures/crds/, with unknown fields
made errors (the API server would silently prune them, so a misspelt field would be lost).
"""

from __future__ import annotations

import subprocess
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from support.shared import REPO, shared_path

KIT = REPO / "deploy" / "kubernetes"
#: oldest Kubernetes the kit supports, and the newest schema kubernetes-validate ships
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
CRD_GROUPS = (
    "monitoring.coreos.com", "gateway.networking.k8s.io", "keda.sh", "inference.networking.k8s.io"
)


class CrdLoader(yaml.SafeLoader):
    """PyYAML reads a bare ``=`` (an enum value in the CRDs) as YAML 1.1's value tag."""


CrdLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_scalar)


@cache
def render(kubectl: str, overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl, "kustomize", str(KIT / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever properties are listed and
    unknown fields are not explicitly kept, and patterns in Python's regex dialect."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    tightened = {key: strict(value) for key, value in schema.items()}
    pattern = tightened.get("pattern")
    if isinstance(pattern, str) and "(?i)" in pattern[1:]:
        # Go's RE2 takes a flag group anywhere; Python's re only at the start
        tightened["pattern"] = "(?i)" + pattern.replace("(?i)", "")
    if (
        "properties" in tightened
        and "additionalProperties" not in tightened
        and not tightened.get("x-kubernetes-preserve-unknown-fields")
    ):
        tightened["additionalProperties"] = False
    return tightened


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict schema, from every CRD file of the shared fixtures."""
    schemas = {}
    for path in sorted(shared_path("fixtures/crds").glob("*.yaml")):
        crd = yaml.load(path.read_text(encoding="utf-8"), Loader=CrdLoader)
        spec = crd["spec"]
        if spec["group"] not in CRD_GROUPS:
            continue
        for version in spec["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}
            schemas[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = schema
    return schemas


def validate(document: dict[str, Any]) -> None:
    """Raise when ``document`` breaks its schema (CRD or Kubernetes, by its apiVersion)."""
    key = (document["apiVersion"], document["kind"])
    if key[0].split("/")[0] in CRD_GROUPS:
        assert key in crd_schemas(), f"no CRD schema for {key}"
        jsonschema.validate(document, crd_schemas()[key])
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(document, version, strict=True)
