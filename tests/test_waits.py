"""Tests wait for events through ``support.wait.wait_for``, never through loops of their own.

A hand-written deadline loop drifts: one forgets its deadline and hangs, another fails without
saying what it waited for. This guard reads every test module and finds them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).parent
WAIT = TESTS / "support" / "wait.py"
#: names of the waiting helpers that live in tests/support/ only
HELPER_NAMES = {"wait_for", "_wait_for", "_wait", "until", "_until", "wait_line"}
#: modules whose loops are still to be moved onto wait_for (the async ones need a waiter that
#: does not block their event loop); a module leaves this list as soon as it is clean
NOT_YET_CONVERTED: set[str] = set()


def _reads_the_clock(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "monotonic"
        for n in ast.walk(node)
    )


def deadline_loops(source: str, in_support: bool) -> list[str]:
    """``line: what`` for each wait of the module's own: a ``while`` loop whose condition, or a
    comparison inside it, reads ``time.monotonic()``; a waiting helper defined outside support."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.While):
            compares = [n for n in ast.walk(node) if isinstance(n, ast.Compare)]
            if _reads_the_clock(node.test) or any(_reads_the_clock(c) for c in compares):
                found.append(f"{node.lineno}: a deadline loop")
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name in HELPER_NAMES
            and not in_support
        ):
            found.append(f"{node.lineno}: a waiting helper {node.name}()")
    return found


def test_the_guard_finds_a_deadline_loop_and_a_local_helper() -> None:
    loop = "while time.monotonic() < deadline:\n    time.sleep(0.1)\n"
    inner = "while not done():\n    assert time.monotonic() < deadline\n"
    helper = "def until(check):\n    pass\n"
    assert deadline_loops(loop, in_support=False) == ["1: a deadline loop"]
    assert deadline_loops(inner, in_support=False) == ["1: a deadline loop"]
    assert deadline_loops(helper, in_support=False) == ["1: a waiting helper until()"]
    assert deadline_loops(helper, in_support=True) == []
    assert deadline_loops("wait_for(done, 'the event', 10)\n", in_support=False) == []


def test_no_test_module_waits_with_a_loop_of_its_own() -> None:
    found = {
        str(path.relative_to(TESTS)): where
        for path in sorted(TESTS.rglob("*.py"))
        if path != WAIT
        if (
            where := deadline_loops(
                path.read_text(encoding="utf-8"), in_support=path.parent.name == "support"
            )
        )
    }
    offenders = [f"{name}:{w}" for name, lines in found.items() if name not in NOT_YET_CONVERTED
                 for w in lines]  # fmt: skip
    assert offenders == [], "use support.wait.wait_for: " + "; ".join(offenders)
    assert sorted(NOT_YET_CONVERTED - set(found)) == [], "clean now: drop from NOT_YET_CONVERTED"
