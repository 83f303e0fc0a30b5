"""SLOs as data: per-model objectives in the alert config, and ``inferwatch generate slo``'s
Sloth, OpenSLO and Pyrra specs, validated against the published schemas read in place from
``../shared/fixtures/slo/`` and built from the objectives the burn-rate alerts use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from referencing import Registry, Resource

from inferwatch.alerts import config, slo, slo_specs, writer
from inferwatch.cli import main
from inferwatch.dashboards import queries
from inferwatch.dashboards import writer as boards
from inferwatch.mixin import objectives
from support.shared import shared_path

pytestmark = pytest.mark.unit

FIXTURES = shared_path("fixtures/slo")
OUT = writer.default_out() / "slo"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


CLASSES = {"premium": {"tenants": ["acme", "globex"], "ttft": 0.995, "availability": 0.9995}}


def load(tmp_path: Path, document: dict[str, Any]) -> config.Config:
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(document))
    return config.load(path)


@pytest.fixture
def classes(tmp_path: Path) -> config.Config:
    return load(tmp_path, {"slo": {"tenant_classes": CLASSES}})


@pytest.fixture
def per_model(tmp_path: Path) -> config.Config:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "slo": {
                    "ttft": {"models": {MODEL: 0.995}},
                    "availability": {"models": {MODEL: 0.9995}},
                }
            }
        )
    )
    return config.load(path)


def crd_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def openslo_validator() -> jsonschema.Draft7Validator:
    """The OpenSLO root schema, its parts registered under their absolute ``$id``s."""
    schemas = FIXTURES / "openslo" / "schemas" / "v1"
    resources = []
    for path in [schemas / "openslo.schema.json", *sorted((schemas / "parts").glob("*.json"))]:
        document = json.loads(path.read_text(encoding="utf-8"))
        resources.append((document["$id"], Resource.from_contents(document)))
    registry: Registry[Any] = Registry().with_resources(resources)
    root = json.loads((schemas / "openslo.schema.json").read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator(root, registry=registry)


def documents(text: str) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(text) if document]


@pytest.fixture(params=["defaults", "per-model", "tenant-classes"])
def files(
    request: pytest.FixtureRequest, per_model: config.Config, classes: config.Config
) -> dict[str, str]:
    chosen = {"defaults": config.load(), "per-model": per_model, "tenant-classes": classes}
    return slo_specs.render(chosen[request.param])


def test_the_committed_specs_are_fresh() -> None:
    for name, text in slo_specs.render(config.load()).items():
        assert (OUT / name).read_text(encoding="utf-8") == text, f"{name} is stale"
        assert text.startswith(slo_specs.MARKER)
    result = CliRunner().invoke(main, ["generate", "slo", "--out", str(OUT), "--check"])
    assert result.exit_code == 0, result.output


def test_a_stale_spec_fails_the_check(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["generate", "slo", "--out", str(tmp_path)]).exit_code == 0
    (tmp_path / "pyrra.yaml").write_text("stale\n")
    result = runner.invoke(main, ["generate", "slo", "--out", str(tmp_path), "--check"])
    assert result.exit_code == 1
    assert "pyrra.yaml" in result.output


def test_the_sloth_resource_matches_its_crd_and_the_plain_spec(files: dict[str, str]) -> None:
    validator = jsonschema.Draft7Validator(
        crd_schema(FIXTURES / "sloth" / "sloth.slok.dev_prometheusservicelevels.yaml")
    )
    resource = yaml.safe_load(files["sloth-prometheusservicelevel.yaml"])
    validator.validate(resource)
    broken = yaml.safe_load(files["sloth-prometheusservicelevel.yaml"])
    del broken["spec"]["slos"][0]["sli"]["events"]["errorQuery"]
    assert not validator.is_valid(broken)
    plain = yaml.safe_load(files["sloth.yaml"])
    assert plain["version"] == "prometheus/v1"
    assert resource["spec"]["slos"] == slo_specs._camel(plain["slos"])


def test_the_plain_sloth_spec_uses_only_sloths_field_names(files: dict[str, str]) -> None:
    go = (FIXTURES / "sloth" / "prometheus-v1-spec.go.txt").read_text(encoding="utf-8")
    known = set(re.findall(r'json:"([a-z_]+)', go))

    def keys(node: Any) -> set[str]:
        if isinstance(node, dict):
            inner = set().union(
                *(keys(v) for k, v in node.items() if k not in ("labels", "annotations"))
            )
            return set(node) | inner
        if isinstance(node, list):
            return set().union(*(keys(item) for item in node))
        return set()

    assert keys(yaml.safe_load(files["sloth.yaml"])) <= known


def test_the_openslo_specs_match_the_v1_schema(files: dict[str, str]) -> None:
    validator = openslo_validator()
    specs = documents(files["openslo.yaml"])
    assert specs
    for spec in specs:
        validator.validate(spec)
    broken = documents(files["openslo.yaml"])[0]
    broken["spec"]["timeWindow"][0]["duration"] = "30 days"
    assert not validator.is_valid(broken)


def test_the_pyrra_specs_match_its_crd(files: dict[str, str]) -> None:
    validator = jsonschema.Draft7Validator(
        crd_schema(FIXTURES / "pyrra" / "pyrra.dev_servicelevelobjectives.yaml")
    )
    specs = documents(files["pyrra.yaml"])
    assert specs
    for spec in specs:
        validator.validate(spec)
    del specs[0]["spec"]["window"]
    assert not validator.is_valid(specs[0])


def test_a_models_own_objective_is_its_own_slo_and_its_own_burn_alerts(
    per_model: config.Config,
) -> None:
    ttft = objectives.objectives(per_model, "ttft")
    assert [(o.model, o.objective, o.matchers) for o in ttft] == [
        (None, 0.99, ('model!~"Qwen/Qwen2\\\\.5-7B-Instruct"',)),
        (MODEL, 0.995, (f'model="{MODEL}"',)),
    ]
    sloth = {s["name"]: s for s in slo_specs.sloth(per_model)["slos"]}
    assert sorted(sloth) == [
        "availability",
        "availability-qwen-qwen2-5-7b-instruct",
        "ttft",
        "ttft-qwen-qwen2-5-7b-instruct",
    ]
    assert sloth["ttft-qwen-qwen2-5-7b-instruct"]["objective"] == 99.5
    assert (
        f'model="{MODEL}"' in sloth["ttft-qwen-qwen2-5-7b-instruct"]["sli"]["events"]["total_query"]
    )
    assert "model!~" in sloth["ttft"]["sli"]["events"]["error_query"]
    (pyrra_own,) = [p for p in slo_specs.pyrra(per_model) if "qwen" in p["metadata"]["name"]]
    assert pyrra_own["spec"]["target"] == "99.5"
    burns = [a for a in slo.alerts(per_model) if a.name == "InferwatchTTFTSLOBurn"]
    windows = len(per_model.burn_windows)
    own = [a for a in burns if f'{{model="{MODEL}"}} / 0.005 >' in a.expr]
    default = [a for a in burns if "{model!~" in a.expr and " / 0.01 >" in a.expr]
    assert len(own) == len(default) == windows and len(burns) == 2 * windows


def test_the_default_config_keeps_one_objective_per_slo() -> None:
    assert [(o.model, o.matchers) for o in objectives.objectives(config.load(), "ttft")] == [
        (None, ())
    ]


def test_a_tenant_class_is_measured_on_the_proxys_series_of_its_tenants(
    classes: config.Config,
) -> None:
    (premium,) = [o for o in objectives.objectives(classes, "ttft") if o.tenant_class]
    assert (premium.objective, premium.tenants) == (0.995, ("acme", "globex"))
    sloth = {s["name"]: s for s in slo_specs.sloth(classes)["slos"]}
    events = sloth["ttft-class-premium"]["sli"]["events"]
    assert "inferwatch_tenancy_time_to_first_token_seconds_count" in events["total_query"]
    assert 'tenant=~"acme|globex"' in events["error_query"]
    availability = sloth["availability-class-premium"]["sli"]["events"]
    assert (
        'outcome=~"engine_error|upstream_error|shutdown_cancelled"' in availability["error_query"]
    )
    assert "rejected" not in availability["total_query"]
    recorded = writer.render(classes)["recording.yaml"]
    assert "tenant_class:inferwatch_tenancy_requests:slo_error_ratio_rate1h" in recorded
    burns = [a for a in slo.alerts(classes) if a.labels.get("tenant_class") == "premium"]
    assert len(burns) == 2 * len(classes.burn_windows)
    assert all(
        '{tenant_class="premium"} / 0.005 >' in a.expr for a in burns if a.labels["slo"] == "ttft"
    )
    assert all("inferwatch_tenancy_requests_total{tenant=~" in a.expr for a in burns)
    (pyrra_class,) = [p for p in slo_specs.pyrra(classes) if "class" in p["metadata"]["name"]]
    success = pyrra_class["spec"]["indicator"]["latency"]["success"]["metric"]
    assert success.startswith("inferwatch_tenancy_time_to_first_token_seconds_bucket{tenant=~")


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"slo": {"tenant_classes": {"Premium!": {"tenants": ["a"], "ttft": 0.99}}}}, "Premium!"),
        ({"slo": {"tenant_classes": {"gold": {"tenants": [], "ttft": 0.99}}}}, "gold.tenants"),
        ({"slo": {"tenant_classes": {"gold": {"tenants": ["a"]}}}}, "slo.tenant_classes.gold"),
        ({"slo": {"tenant_classes": {"gold": {"tenants": ["a"], "ttft": 1.5}}}}, "gold.ttft"),
        ({"slo": {"tenant_classes": {"gold": {"tenants": ["a"], "latency": 0.9}}}}, "latency"),
        ({"slo": {"ttft": {"models": {MODEL: 1.5}}}}, f"slo.ttft.models.{MODEL}"),
        (
            {"slo": {"availability": {"models": {MODEL: "high"}}}},
            f"slo.availability.models.{MODEL}",
        ),
        ({"slo": {"period": "1d"}}, "slo.period"),
    ],
)
def test_a_bad_objective_or_period_is_one_clear_error(
    tmp_path: Path, document: dict[str, Any], field: str
) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert field in str(caught.value) and str(path) in str(caught.value)
    result = CliRunner().invoke(
        main, ["generate", "slo", "--config", str(path), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert field in result.output


def test_the_budget_panels_span_the_period_with_each_objectives_budget(
    per_model: config.Config,
) -> None:
    board = json.loads(boards.render(per_model)["latency.json"])
    (panel,) = [
        p for p in queries.panels(board) if p["title"] == "TTFT error budget remaining (30d)"
    ]
    default, own = (target["expr"] for target in panel["targets"])
    assert "model!~" in default and default.endswith("[30d]) / 0.01")
    assert f'model="{MODEL}"' in own and own.endswith("[30d]) / 0.005")
    assert "slo_error_ratio_rate5m" in default
