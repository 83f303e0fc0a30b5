"""``--gpu replay=PATH``: the NVML collector reading a recording instead of a GPU.

The collector code is the real one (``nvml``); only the driver is ``FakeNvml``, answering from
the recording (``recording``) with pynvml's own types and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferwatch.exporters.gpu.fake_nvml import FakeNvml
from inferwatch.exporters.gpu.nvml import NvmlTelemetry
from inferwatch.exporters.gpu.recording import Recording


class ReplayTelemetry(NvmlTelemetry):
    """The NVML collector reading a recording instead of a GPU (``--gpu replay=PATH``)."""

    backend = "replay"

    def __init__(self, path: Path, *, fake: FakeNvml | None = None, **kwargs: Any) -> None:
        self.fake = fake if fake is not None else FakeNvml(Recording.load(path))
        kwargs.setdefault("proc_root", None)  # recorded PIDs belong to another machine
        super().__init__(self.fake, **kwargs)
