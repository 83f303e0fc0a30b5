"""The docs: a short README that links every page, links that resolve, and generated metric
and porting pages kept fresh from the catalogue."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from inferwatch import catalog
from inferwatch.cli import main
from inferwatch.drill.run import SCENARIOS
from inferwatch.generate import docs
from support.shared import REPO

pytestmark = pytest.mark.unit

README = REPO / "README.md"
DOCS = REPO / "docs"
#: a Markdown link or image target, up to a title or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)")


def generate_docs(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["generate", "docs", *args])
    return result.exit_code, result.output


def test_committed_pages_are_fresh() -> None:
    code, output = generate_docs("--check", "--out", str(DOCS))
    assert code == 0, f"{output}run `inferwatch generate docs`"


def test_a_stale_or_missing_page_fails_the_check_until_regenerated(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    out.mkdir()
    shutil.copy(DOCS / "porting.md", out / "porting.md")
    porting = out / "porting.md"
    edited = porting.read_text(encoding="utf-8").replace(
        "| vllm | `vllm:num_preemptions` |", "| vllm | `vllm:num_preempted` |"
    )
    porting.write_text(edited, encoding="utf-8")
    code, output = generate_docs("--check", "--out", str(out))
    assert code == 1
    assert "porting.md" in output and "metrics.md" in output and "Traceback" not in output
    assert generate_docs("--out", str(out))[0] == 0
    assert porting.read_text(encoding="utf-8") == (DOCS / "porting.md").read_text("utf-8")
    assert generate_docs("--check", "--out", str(out)) == (0, "")


def test_pages_are_marked_and_deterministic() -> None:
    first, second = docs.render(catalog.load()), docs.render(catalog.load())
    assert first == second and set(first) == {"metrics.md", "porting.md"}
    assert all(text.startswith(docs.MARKER) for text in first.values())
    assert "do not edit" in docs.MARKER


def test_every_catalogue_metric_has_a_row() -> None:
    table = docs.metric_table(catalog.load())
    for spec in catalog.load().values():
        assert f"| `{spec.name}` |" in table


def test_porting_table_has_a_row_for_every_source_spelling() -> None:
    from inferwatch.exporters.engine import adapters as engines

    cat = catalog.load()
    table = docs.porting_table(cat)
    assert docs.ported() == (*engines.ENGINES, "dcgm")
    for spec in cat.values():
        for source in docs.ported():
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


def test_the_readme_is_a_front_door_to_every_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert text.split("\n", 2)[2].startswith(
        "```sh\nscripts/inferwatch demo   # the demo stack on the built-in simulator"
    ), "the README starts with the commands that work on a fresh machine"
    linked = {(README.parent / target.split("#")[0]).resolve() for target in LINK.findall(text)}
    unlinked = sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked)
    assert not unlinked, f"README.md links no page {unlinked}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue  # an anchor in the page itself, or an absolute URL
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken


def test_the_link_pattern_finds_links_and_images() -> None:
    text = "see [a](docs/a.md#x) and ![b](img/b.png), not (c.md) nor [d]"
    assert LINK.findall(text) == ["docs/a.md#x", "img/b.png"]


def test_the_documented_proxy_config_is_valid(tmp_path: Path) -> None:
    from inferwatch.proxy import config

    text = (DOCS / "proxy.md").read_text(encoding="utf-8")
    example = text.split("```yaml\n# proxy.yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "proxy.yaml"
    path.write_text(example.replace("<sha256 of the API key>", "0" * 64), encoding="utf-8")
    loaded = config.load(path)
    assert loaded.max_input_tokens == 8192
    assert loaded.tenants["acme"].budget is not None


def test_the_readme_the_drill_page_and_drill_help_list_the_drills_scenarios() -> None:
    """Each lists exactly the drill's scenarios, in the order it plays them."""
    names = [s.name for s in SCENARIOS]
    bullet = re.search(r"^- `inferwatch drill` .*?(?=^- |\Z)", README.read_text(), re.M | re.S)
    assert bullet, "no `inferwatch drill` bullet in the README"
    assert re.findall(r"`([a-z]+(?:-[a-z]+)+)`", bullet[0]) == names, bullet[0]
    page = (DOCS / "drill.md").read_text()
    assert re.findall(r"^\| `([a-z-]+)` \|", page, re.M) == names
    shown = CliRunner().invoke(main, ["drill", "--help"], terminal_width=200).output
    listed = shown.split("Scenarios, in order:")[1].split("\n\n")[0]
    assert re.findall(r"^ +([a-z-]+): ", listed, re.M) == names, shown


def test_the_local_tenancy_variant_is_a_valid_proxy_against_the_demos_fixed_ports(
    tmp_path: Path,
) -> None:
    """docs/tenancy.md's local lines: the proxy config loads, and the ports, key and model it
    names are the demo's at ``--base-port 18000`` and the curl's."""
    from inferwatch.demo import topology
    from inferwatch.proxy import config

    text = (DOCS / "tenancy.md").read_text(encoding="utf-8")
    lines = text.split("### On your machine, against the demo's Redis", 1)[1].split("```sh\n")[1]
    lines = lines.split("```", 1)[0]
    document = lines.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    local = "/tmp/inferwatch-local"
    assert f"mkdir -p {local}/journal" in lines
    path = tmp_path / "proxy.yaml"
    path.write_text(document.replace(local, str(tmp_path)), encoding="utf-8")
    (tmp_path / "journal").mkdir()
    loaded = config.load(path)
    ports = topology.Ports.assign(18000)
    assert "--base-port 18000 " in lines
    assert loaded.upstream_url == f"http://127.0.0.1:{ports.sim['primary-v1']}"
    assert loaded.shared_state is not None
    assert loaded.shared_state.url == f"redis://127.0.0.1:{ports.redis}/0"
    assert f"redis-cli -p {ports.redis} --scan --pattern 'local:*'" in lines
    assert loaded.shared_state.key_prefix == "local"  # apart from the demo's own books
    key = re.search(r"Bearer (sk-\S+)'", lines)
    assert key, lines
    assert loaded.key_index[hashlib.sha256(key[1].encode()).hexdigest()] == "acme"
    assert f'"model": "{topology.PRIMARY_MODEL}"' in lines
    # the client port and the tenant metrics port are two, and the metrics are read from the
    # second
    assert "--listen 127.0.0.1:8080 --metrics-listen 127.0.0.1:9402" in lines
    assert "curl -s http://127.0.0.1:9402/metrics" in lines


def test_every_documented_engine_url_is_the_base_url_the_sidecar_appends_metrics_to() -> None:
    """The pages agree on one form of ``--engine-url`` (a base URL), and the sidecar scrapes
    its /metrics, as docs/sidecar.md says (a /metrics URL is scraped as it is)."""
    from inferwatch.exporters.sources.engine import metrics_url

    pages = [README, *sorted(DOCS.glob("*.md"))]
    found = {
        (page.name, url)
        for page in pages
        for url in re.findall(r"--engine-url[ =](https?://[^\s`)]+)", page.read_text())
    }
    assert {name for name, _ in found} >= {"sidecar.md", "tracing.md"}, found
    assert [f for f in found if urlsplit(f[1]).path not in ("", "/")] == []
    for _, url in found:
        assert metrics_url(url) == url.rstrip("/") + "/metrics"
        assert metrics_url(url.rstrip("/") + "/metrics") == url.rstrip("/") + "/metrics"
