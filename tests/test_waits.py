"""Tests wait for events through ``support.wait`` (``wait_for``, in a coroutine ``wait_until``),
never through loops of their own.

A hand-written deadline loop drifts: one forgets its deadline and hangs, another fails without
saying what it waited for. This guard reads every test module and finds them.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import httpx
import pytest

from support.wait import wait_for, wait_until

pytestmark = pytest.mark.unit

TESTS = Path(__file__).parent
WAIT = TESTS / "support" / "wait.py"
#: names of the waiting helpers that live in tests/support/ only
HELPER_NAMES = {
    "wait_for", "_wait_for", "_wait", "until", "_until", "wait_line", "wait_until", "wait_async",
}  # fmt: skip


def _reads_the_clock(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "monotonic"
        for n in ast.walk(node)
    )


def _timeout_block(node: ast.AST) -> bool:
    """``with asyncio.timeout(...)`` (or ``timeout_at``), async or not."""
    return isinstance(node, ast.With | ast.AsyncWith) and any(
        isinstance(call := item.context_expr, ast.Call)
        and getattr(call.func, "attr", getattr(call.func, "id", None)) in {"timeout", "timeout_at"}
        for item in node.items
    )


def deadline_loops(source: str, in_support: bool) -> list[str]:
    """``line: what`` for each wait of the module's own: a ``while`` loop whose condition, or a
    comparison inside it, reads ``time.monotonic()``, or that runs inside an ``asyncio.timeout``
    block; a waiting helper defined outside support."""
    tree = ast.parse(source)
    timed = {n for block in ast.walk(tree) if _timeout_block(block) for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.While):
            compares = [n for n in ast.walk(node) if isinstance(n, ast.Compare)]
            if _reads_the_clock(node.test) or any(_reads_the_clock(c) for c in compares):
                found.append(f"{node.lineno}: a deadline loop")
            elif node in timed:
                found.append(f"{node.lineno}: a loop under a timeout")
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name in HELPER_NAMES
            and not in_support
        ):
            found.append(f"{node.lineno}: a waiting helper {node.name}()")
    return found


def test_the_guard_finds_a_deadline_loop_a_loop_under_a_timeout_and_a_local_helper() -> None:
    loop = "while time.monotonic() < deadline:\n    time.sleep(0.1)\n"
    inner = "while not done():\n    assert time.monotonic() < deadline\n"
    helper = "def until(check):\n    pass\n"
    timed = "async with asyncio.timeout(30):\n    while not done():\n        await sleep(0.01)\n"
    once = "async with asyncio.timeout(30):\n    await reader.read()\n"
    assert deadline_loops(loop, in_support=False) == ["1: a deadline loop"]
    assert deadline_loops(inner, in_support=False) == ["1: a deadline loop"]
    assert deadline_loops(helper, in_support=False) == ["1: a waiting helper until()"]
    assert deadline_loops(helper, in_support=True) == []
    assert deadline_loops(timed, in_support=False) == ["2: a loop under a timeout"]
    assert deadline_loops(once, in_support=False) == []
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
    offenders = [f"{name}:{w}" for name, lines in found.items() for w in lines]
    assert offenders == [], "use support.wait.wait_for or wait_until: " + "; ".join(offenders)


def test_wait_until_awaits_its_check_and_fails_as_wait_for_does() -> None:
    seen: list[int] = []

    async def third() -> int | None:
        seen.append(len(seen) + 1)
        return seen[-1] if seen[-1] == 3 else None

    def refused() -> None:
        raise httpx.ConnectError("refused")

    def what() -> str:
        return f"it ({len(seen)})"

    assert asyncio.run(wait_until(third, "a third call", interval=0)) == 3
    expected = "timed out after 0.05 s waiting for it (3) (last error: ConnectError('refused'))"
    with pytest.raises(pytest.fail.Exception) as sync:
        wait_for(refused, what, 0.05)
    with pytest.raises(pytest.fail.Exception) as in_a_coroutine:
        asyncio.run(wait_until(refused, what, 0.05))
    assert str(sync.value) == str(in_a_coroutine.value) == expected
