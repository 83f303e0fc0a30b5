"""The exit statuses of every ``inferwatch`` command: one number per meaning.

A script or a pipeline branches on them: 1 says the command ran and what it checked failed,
2 that the user must fix what they gave it, 3 that something around it must be fixed first,
4 that another process holds the port. ``docs/cli.md`` carries this table; a test keeps the
two equal. The verdict commands use 0 and 1 as their verdicts; canary adds 2 for
inconclusive, so its bad input exits 3 (see ``docs/cli.md``).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    CANNOT_RUN = 3
    PORT_TAKEN = 4
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "done; a check or verdict passed",
    ExitCode.FAILED: "ran, and what it checked failed: stale generated files, a failed drill "
    "or gate check, a configuration that cannot start",
    ExitCode.BAD_INPUT: "bad flag, argument, config or input file (click's usage errors too)",
    ExitCode.CANNOT_RUN: "could not run: a required binary, extra or dependency is missing or "
    "unreachable at start, a file cannot be read or written",
    ExitCode.PORT_TAKEN: "a server's listen address is in use by another process",
    ExitCode.INTERRUPTED: "interrupted by SIGINT (Ctrl-C)",
}
