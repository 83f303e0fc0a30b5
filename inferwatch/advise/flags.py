"""How each engine spells the settings the advice proposes.

vLLM's names are its ``vllm serve`` flags (checked against vLLM's own argument parser by the
realengine tier); SGLang's and TGI's are their launchers' equivalents. An engine missing
here, or a setting it has no flag for, gets the setting named without a flag.
"""

from __future__ import annotations

#: the settings, in the order they are shown
SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len")

FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "max_num_seqs": "--max-num-seqs",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "gpu_memory_utilization": "--gpu-memory-utilization",
        "max_model_len": "--max-model-len",
    },
    "sglang": {
        "max_num_seqs": "--max-running-requests",
        "max_num_batched_tokens": "--chunked-prefill-size",
        "gpu_memory_utilization": "--mem-fraction-static",
        "max_model_len": "--context-length",
    },
    "tgi": {
        "max_num_seqs": "--max-concurrent-requests",
        "max_num_batched_tokens": "--max-batch-prefill-tokens",
        "gpu_memory_utilization": "--cuda-memory-fraction",
        "max_model_len": "--max-total-tokens",
    },
}


def flag(engine: str, setting: str) -> str | None:
    """The command-line flag of ``setting`` on ``engine``, or None when it has none."""
    return FLAGS.get(engine, {}).get(setting)
