"""A server process a test kills, stops and starts again (a proxy of the fleet, redis-server).

The fault tests tell a crash (``kill -9``: nothing is drained, flushed or settled) from a
shutdown (SIGTERM, and ``kill -9`` after all when it outlasts its grace); both leave the
object ready for its own ``start``.
"""

from __future__ import annotations

import signal
import subprocess
from typing import ClassVar


class Restartable:
    """What :meth:`kill` and :meth:`stop` act on: the running ``process``, None when down."""

    process: subprocess.Popen[bytes] | None
    #: seconds a SIGTERM is given before :meth:`stop` kills
    stop_timeout: ClassVar[float] = 10.0

    def kill(self) -> None:
        """``kill -9``: the process ends at once, with no chance to finish anything."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        """SIGTERM, then :meth:`kill` past ``stop_timeout``."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill()
            self.process = None
