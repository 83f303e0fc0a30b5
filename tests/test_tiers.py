"""The tier guard refuses what a unit test may not do, and every test must carry one tier."""

from __future__ import annotations

import socket
import subprocess

import pytest

from support.tiers import Guard, TierClock, TierViolation

pytestmark = pytest.mark.unit


def test_starting_a_process_is_refused_naming_the_command() -> None:
    with Guard() as active, pytest.raises(TierViolation, match=r"started a process: true -v"):
        subprocess.run(["true", "-v"], check=False)
    assert len(active.violations) == 1


def test_a_socket_beyond_loopback_is_refused_and_loopback_is_not() -> None:
    with Guard(), socket.socket() as sock:
        with pytest.raises(TierViolation, match=r"socket\.connect\(\('192\.0\.2\.1', 9\)"):
            sock.connect(("192.0.2.1", 9))
        with socket.socket() as local:
            local.bind(("127.0.0.1", 0))
            assert local.getsockname()[1] > 0


def test_a_test_without_a_tier_or_with_two_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["support.tiers"]')
    pytester.makepyfile(
        """
        import pytest

        def test_none():
            pass

        @pytest.mark.unit
        @pytest.mark.proc
        def test_two():
            pass

        @pytest.mark.unit
        def test_one():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*2 do not:*", "*::test_none: no tier", "*::test_two: proc, unit"])


def test_the_tiers_run_cheapest_first_keeping_file_order_within_each(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest('pytest_plugins = ["support.tiers"]')
    pytester.makepyfile(
        test_a="import pytest\n\npytestmark = pytest.mark.e2e\n\ndef test_a():\n    pass\n",
        test_b="import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_b():\n    pass\n",
        test_c="import pytest\n\npytestmark = pytest.mark.proc\n\ndef test_c():\n    pass\n",
        test_d="import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_d():\n    pass\n",
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v")
    assert result.ret == pytest.ExitCode.OK
    ran = [line.split("::")[1].split()[0] for line in result.outlines if " PASSED" in line]
    assert ran == ["test_b", "test_d", "test_c", "test_a"]


def test_a_tiers_time_counts_the_tests_that_ran_side_by_side_once() -> None:
    clock = TierClock()
    clock.phases["proc"] = [(20.0, 21.0), (0.0, 10.0), (5.0, 12.0), (6.0, 7.0)]
    assert clock.seconds("proc") == 13.0
    assert clock.seconds("e2e") == 0.0
