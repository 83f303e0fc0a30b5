"""The committed Argo Rollouts and Flagger canary templates: fresh, deterministic, valid.

The AnalysisTemplate is validated against the Argo Rollouts CRD's openAPIV3Schema, read in
place from ../shared/fixtures/crds/ (unknown fields made errors, as for the deployment kit).
Flagger publishes no CRD fixture here, so each MetricTemplate is checked against the fields
Flagger's documentation lists for it (spec.provider.{type,address,secretRef,
insecureSkipVerify}, spec.query) and the query variables it documents. What the queries
compute, against a real Prometheus, is tested in test_canary_e2e.py.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from inferwatch.canary import templates
from inferwatch.canary.checks import CHECKS
from inferwatch.cli import main
from inferwatch.mixin import config
from support.k8s import CrdLoader, strict
from support.shared import REPO, shared_path

pytestmark = pytest.mark.unit

OUT = REPO / "deploy" / "canary"
ARGO_CRD = shared_path("fixtures/crds/argoproj.io_analysistemplates.yaml")
#: MetricTemplate fields as Flagger's documentation lists them
FLAGGER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "flagger.app/v1beta1"},
        "kind": {"const": "MetricTemplate"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["provider", "query"],
            "additionalProperties": False,
            "properties": {
                "provider": {
                    "type": "object",
                    "required": ["type"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"const": "prometheus"},
                        "address": {"type": "string", "pattern": "^https?://"},
                        "secretRef": {"type": "object"},
                        "insecureSkipVerify": {"type": "boolean"},
                    },
                },
                "query": {"type": "string"},
            },
        },
    },
}
#: Go template actions Flagger fills in: its own variables and templateVariables
FLAGGER_VARIABLES = {"name", "namespace", "target", "service", "ingress", "interval"}


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((OUT / name).read_text(encoding="utf-8")) if d]


def test_committed_templates_are_fresh() -> None:
    result = CliRunner().invoke(main, ["generate", "canary", "--out", str(OUT), "--check"])
    assert result.exit_code == 0, result.output


def test_stale_templates_are_reported(tmp_path: Any) -> None:
    (tmp_path / templates.ARGO).write_text("# edited\n")
    result = CliRunner().invoke(main, ["generate", "canary", "--out", str(tmp_path), "--check"])
    assert result.exit_code == 1 and "stale" in result.output


def test_rendering_is_deterministic_and_marked() -> None:
    first, second = templates.render(config.load()), templates.render(config.load())
    assert first == second
    for text in first.values():
        assert text.startswith(templates.MARKER)


def test_analysis_template_matches_the_argo_rollouts_crd() -> None:
    if not ARGO_CRD.exists():
        pytest.skip(f"shared fixture {ARGO_CRD} not found")
    crd = yaml.load(ARGO_CRD.read_text(encoding="utf-8"), Loader=CrdLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    (template,) = _documents(templates.ARGO)
    jsonschema.validate(template, schema)
    assert [m["name"] for m in template["spec"]["metrics"]] == [
        c.name.replace("_", "-") for c in CHECKS
    ]


def test_analysis_template_uses_only_declared_args() -> None:
    (template,) = _documents(templates.ARGO)
    declared = {a["name"] for a in template["spec"]["args"]}
    used = set(re.findall(r"\{\{args\.([a-z-]+)\}\}", (OUT / templates.ARGO).read_text()))
    assert used == declared
    # an unguarded {{{ would be read as a tag by Argo's template engine
    assert "{{{" not in (OUT / templates.ARGO).read_text()


def test_metric_templates_have_flaggers_documented_fields() -> None:
    documents = _documents(templates.FLAGGER)
    assert len(documents) == len(CHECKS)
    for document in documents:
        jsonschema.validate(document, FLAGGER_SCHEMA)
        actions = set(re.findall(r"\{\{ ([a-z.]+) \}\}", document["spec"]["query"]))
        assert actions <= FLAGGER_VARIABLES | {"variables.baseline", "variables.candidate"}
        assert "{{{" not in document["spec"]["query"]
