"""The README's metric table is generated from the catalogue and kept fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch import catalog
from inferwatch.generate import docs

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_metric_table_is_fresh() -> None:
    text = README.read_text(encoding="utf-8")
    assert docs.render_readme(text, catalog.load()) == text, (
        "README.md's metric table is stale: run `inferwatch generate readme`"
    )


def test_every_catalogue_metric_has_a_row() -> None:
    table = docs.metric_table(catalog.load())
    for spec in catalog.load().values():
        assert f"| `{spec.name}` |" in table


def test_missing_markers_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="lacks the markers"):
        docs.render_readme("# no table here\n", catalog.load())


def test_readme_proxy_example_is_a_valid_config(tmp_path: Path) -> None:
    from inferwatch.proxy import config

    text = README.read_text(encoding="utf-8")
    example = text.split("```yaml\n# proxy.yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "proxy.yaml"
    path.write_text(example.replace("<sha256 of the API key>", "0" * 64), encoding="utf-8")
    loaded = config.load(path)
    assert loaded.max_input_tokens == 8192
    assert loaded.tenants["acme"].budget is not None


def test_porting_table_has_a_row_for_every_source_spelling() -> None:
    from inferwatch.exporters import engines

    cat = catalog.load()
    table = docs.porting_table(cat)
    for spec in cat.values():
        for source in docs.PORTED:
            for alias in spec.sources.get(source, ()):
                rows = [
                    r
                    for r in table.splitlines()
                    if r.startswith(f"| {source} | `{alias.metric}") and f"`{spec.name}" in r
                ]
                assert rows, (source, alias.metric, spec.key)
                if spec.semconv:
                    assert all(f"`{spec.semconv}`" in r for r in rows)
    for engine in engines.ENGINES:  # signals computed by an adapter are listed too
        for key in engines.derivations(engine):
            assert any(
                r.startswith(f"| {engine} |") and f"`{cat[key].name}`" in r
                for r in table.splitlines()
            ), (engine, key)
    assert '`vllm:request_success{finished_reason="error"}`' in table
    assert "`nv_inference_queue_summary_us_sum` (divided by 1000000)" in table
    assert '`inferwatch_gpu_temperature_celsius{sensor="memory"}`' in table


def test_a_stale_porting_table_is_caught() -> None:
    text = README.read_text(encoding="utf-8")
    edited = text.replace("| vllm | `vllm:num_preemptions` |", "| vllm | `vllm:num_preempted` |")
    assert edited != text
    assert docs.render_readme(edited, catalog.load()) == text
    without = text.replace(docs.PORTING_END, "")
    with pytest.raises(ValueError, match="porting table"):
        docs.render_readme(without, catalog.load())
