"""The suite on two xdist workers, as ``scripts/test`` runs it: a module's fixtures start once,
the real-engine tests share one worker and go out right after the unit tier, and the guards
that judge the whole run still do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.proc

#: a test that notes where and when it ran, and a module fixture that notes each start
RECORDING = """
import json, os, time
import pytest

pytestmark = pytest.mark.{tier}

def note(what):
    with open(os.environ["RECORD"], "a") as out:
        out.write(json.dumps([what, os.environ["PYTEST_XDIST_WORKER"], time.monotonic()]) + "\\n")

@pytest.fixture(scope="module")
def stack():
    note("start {name}")
    yield

@pytest.mark.parametrize("n", range({count}))
def test_it(stack, n):
    note("{tier} {name}")
    time.sleep(0.05)
"""


def run_on_two_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, **modules: str
) -> tuple[pytest.RunResult, list[tuple[str, str, float]]]:
    pytester.makeconftest(
        'pytest_plugins = ["support.tiers", "support.parallel", "support.imports"]'
    )
    pytester.makepyfile(**modules)
    record = pytester.path / "record.jsonl"
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"
    )  # as scripts/test
    notes = [tuple(json.loads(line)) for line in record.read_text().splitlines()]
    return result, notes  # type: ignore[return-value]


def test_on_two_workers_a_module_starts_its_fixtures_once_and_the_engines_share_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = {"test_u1": ("unit", 6), "test_u2": ("unit", 6),
              "test_p1": ("proc", 4), "test_p2": ("proc", 4),
              "test_r1": ("realengine", 2), "test_r2": ("realengine", 2)}  # fmt: skip
    modules = {name: RECORDING.format(tier=tier, name=name, count=count)
               for name, (tier, count) in layout.items()}  # fmt: skip
    result, notes = run_on_two_workers(pytester, monkeypatch, **modules)
    result.assert_outcomes(passed=24)
    starts = [what for what, _, _ in notes if what.startswith("start ")]
    assert sorted(starts) == sorted(f"start {name}" for name in layout), starts
    workers = {name: {worker for what, worker, _ in notes if what.endswith(f" {name}")}
               for name in layout}  # fmt: skip
    assert all(len(ran_on) == 1 for ran_on in workers.values()), workers
    assert workers["test_r1"] == workers["test_r2"], workers
    assert len(set().union(*workers.values())) == 2, workers  # both workers had work
    order = ["unit", "realengine", "proc"]  # the engines' group right after the unit tier
    for worker in {"gw0", "gw1"}:
        tiers = [what.split()[0] for what, ran_on, _ in sorted(notes, key=lambda n: n[2])
                 if ran_on == worker and not what.startswith("start ")]  # fmt: skip
        assert tiers == sorted(tiers, key=order.index), (worker, tiers)


def test_on_two_workers_a_bare_module_imported_by_a_test_still_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = (
        "import sys, types\nimport pytest\n\npytestmark = pytest.mark.unit\n\n"
        "def test_bare():\n    sys.modules['alerts'] = types.ModuleType('alerts')\n"
    )
    fine = "import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_fine():\n    pass\n"
    pytester.makefile(".jsonl", record="")  # neither test notes anything
    result, _ = run_on_two_workers(pytester, monkeypatch, test_bare=bare, test_fine=fine)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "import-mapping guard: bare top-level modules were imported: ['alerts']" in (
        result.stdout.str()
    )


def test_a_long_module_goes_out_first_within_its_tier(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handed out in file order, the long module went last, and ran alone at the end."""
    modules = {name: RECORDING.format(tier="e2e", name=name, count=2)
               for name in ("test_e1", "test_e2")}  # fmt: skip
    modules["test_e3"] = RECORDING.format(tier="e2e", name="test_e3", count=6).replace(
        "pytestmark = pytest.mark.e2e", "pytestmark = [pytest.mark.e2e, pytest.mark.long]"
    )
    result, notes = run_on_two_workers(pytester, monkeypatch, **modules)
    result.assert_outcomes(passed=10)
    (worker,) = {ran_on for what, ran_on, _ in notes if what == "start test_e3"}
    starts = [what for what, ran_on, _ in sorted(notes, key=lambda n: n[2])
              if ran_on == worker and what.startswith("start ")]  # fmt: skip
    assert starts[0] == "start test_e3", starts
