"""Several clusters, one store: the kit's multi-cluster setup, run on loopback.

Two Prometheus servers, configured from the multi-cluster overlay's values (the ``cluster``
external label, the remote write and its queue settings), scrape two replicas each and
remote-write into a third started with ``--web.enable-remote-write-receiver``, which loads
the generated rule files (``bench/localfleet.py`` runs the topology, shared with the fleet
benchmark). There, every fleet-overview panel query answers with series from both clusters
when ``$cluster`` selects both, and only that cluster's when it selects one.

The replicas' page is a real sidecar's: in front of the shared vLLM capture and a
dcgm-exporter capture, after one failed engine scrape (the capture was not there yet), so
that the scrape-errors panel has a series to show as well.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import localfleet
import pytest

from support.shared import shared_path
from support.wait import wait_for

pytestmark = pytest.mark.e2e

ENGINE = shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")
DCGM = shared_path("fixtures/gpu/dcgm/dcgm-rtx4000ada-k8s-pod.prom")
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("pages")
    shutil.copy(DCGM, folder / "dcgm")
    with (
        localfleet.static_pages(folder) as base,
        localfleet.sidecar(f"{base}/engine", f"{base}/dcgm") as url,
    ):
        failed = httpx.get(f"{url}/metrics", timeout=10).text
        assert re.search(r"^inferwatch_engine_up\{.*\} 0", failed, re.M)
        shutil.copy(ENGINE, folder / "engine")
        httpx.get(f"{url}/metrics", timeout=10)
        page = httpx.get(f"{url}/metrics", timeout=10).text
    assert re.search(r"^inferwatch_engine_up\{.*\} 1", page, re.M)
    assert 'inferwatch_engine_scrape_errors_total{reason="http_status"}' in page
    return page


def test_every_fleet_panel_spans_both_clusters_in_the_central_store(
    template: str, tmp_path: Path, prometheus_bin: str
) -> None:
    # every panel but the firing-alerts table, which shows whatever happens to fire, and the
    # advice, which no replica serves (inferwatch advisor reads a query API; none runs here)
    queries = localfleet.panel_queries(absent=("ALERTS", "inferwatch_advise_setting"))
    assert len(queries) >= 20
    with localfleet.two_clusters(template, 2, tmp_path, interval="1s") as central:
        missing: list[str] = []

        def complete() -> list[tuple[str, dict[str, dict[str, int]]]] | None:
            nonlocal missing
            rows = localfleet.panels_by_cluster(central, queries)
            # a panel is complete when both clusters answer, together and alone, with as
            # many series alone as together: series keep arriving from each cluster's
            # Prometheus (a rate shows a series from its second sample on), so two queries a
            # moment apart may count differently until they have all arrived
            missing = [
                title
                for title, counts in rows
                if not all(counts["both"].get(c) for c in localfleet.CLUSTERS)
                or not all(counts[c].get(c) == counts["both"][c] for c in localfleet.CLUSTERS)
            ]
            return None if missing else rows

        rows = wait_for(
            complete,
            lambda: (
                f"every panel to span both clusters alike, together and alone; not yet: {missing}"
            ),
            DEADLINE_S,
            interval=1,
        )
        for title, counts in rows:
            assert set(counts["both"]) == set(localfleet.CLUSTERS), (title, counts)
            for cluster in localfleet.CLUSTERS:
                # one cluster selected: that cluster's series only
                assert set(counts[cluster]) == {cluster}, (title, counts)
        groups = httpx.get(f"{central}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert {g["file"] for g in groups} == {str(p) for p in localfleet.RULE_FILES}
        broken = [
            (rule["name"], rule.get("lastError"))
            for group in groups
            for rule in group["rules"]
            if rule["health"] != "ok"
        ]
        assert not broken
