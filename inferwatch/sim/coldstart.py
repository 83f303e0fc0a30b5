"""Cold start of a simulated replica: loading the weights, then first runs of each batch shape.

A replica is no use the moment its process starts. Its weights stream in from storage (the
checkpoint's bytes over the storage bandwidth), and until they are in GPU memory ``/health``
answers 503 and so do the completion routes. The simulator answers HTTP meanwhile, as SGLang
and llama.cpp do; vLLM answers nothing until it has loaded.

Then the first engine step of each batch-size shape pays a one-time cost (CUDA graph capture,
compilation, autotuning) that later steps of the same shape do not. Shapes are vLLM's CUDA
graph capture sizes (1, 2, 4, then multiples of 8 up to 512; larger batches run eagerly and
pay nothing). A warm-up that runs those shapes first takes the cost off user requests.
"""

from __future__ import annotations

#: the largest batch vLLM captures a CUDA graph for by default
MAX_CAPTURE_SIZE = 512


def capture_size(batch: int) -> int | None:
    """The CUDA graph a step of ``batch`` sequences runs (padded up), None when eager."""
    if batch > MAX_CAPTURE_SIZE:
        return None
    for size in (1, 2, 4):
        if batch <= size:
            return size
    return -(-batch // 8) * 8


def load_seconds(checkpoint_bytes: float, storage_bandwidth: float) -> float:
    """Simulated seconds to read the weights; 0 when no bandwidth is set (cold start off)."""
    return checkpoint_bytes / storage_bandwidth if storage_bandwidth > 0 else 0.0


class GraphCache:
    """The batch shapes one engine rank has run; a new one costs ``capture_seconds`` once."""

    def __init__(self, capture_seconds: float) -> None:
        self.capture_seconds = capture_seconds
        self.captured: set[int] = set()

    def penalty(self, batch: int) -> float:
        """Simulated seconds this step pays on top of its roofline cost."""
        size = capture_size(batch)
        if self.capture_seconds <= 0 or size is None or size in self.captured:
            return 0.0
        self.captured.add(size)
        return self.capture_seconds
