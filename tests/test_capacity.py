"""The capacity model against hand arithmetic and against what vLLM itself reported.

Published vLLM start-up figures used here:

* llm-d/llm-d-benchmark, config_explorer/empirical-vllm-memory-results.md (commit 2593348):
  vLLM V1 on one H100 (79.18 GiB), gpu-memory-utilization 0.9 (71.26 GiB), max-model-len 16000:
  Llama-3.1-8B-Instruct weights 14.99 GiB, KV cache 51.38 GiB; Llama-3.3-70B-Instruct-FP8-dynamic
  TP=2 weights 33.88 GiB per GPU, KV cache 32.0 GiB; the same at TP=1 loads 67.72 GiB and fails
  with no memory for the cache blocks; Qwen3-32B weights 61.03 GiB, KV cache 4.45 GiB at
  max-model-len 16000 and fails to start at 32000.
* vllm-project/vllm#12569: "# GPU blocks: 1381" -> "Maximum concurrency for 2048 tokens per
  request: 10.79x".
* vllm-project/vllm#13596: 127626 blocks -> "GPU KV cache size: 2,042,016 tokens",
  "Maximum concurrency for 2,048 tokens per request: 997.08x".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.capacity import planner as cap
from inferwatch.cli import main

pytestmark = pytest.mark.unit

GIB = cap.GIB
H100 = cap.gpu_preset("H100")
LLM_D = cap.ServingSpec(gpu_memory_utilization=0.9, max_model_len=16000)

LLAMA_2_7B_CONFIG = {
    "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
    "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
    "max_position_embeddings": 4096,
}  # fmt: skip


def test_llama_3_1_8b_kv_bytes_per_token_is_hand_computed() -> None:
    result = cap.compute(cap.model_preset("llama-3.1-8b"), H100, LLM_D)
    assert result.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


def test_fp8_kv_cache_halves_bytes_per_token() -> None:
    serving = dataclasses.replace(LLM_D, kv_cache_dtype="fp8")
    result = cap.compute(cap.model_preset("llama-3.1-8b"), H100, serving)
    assert result.kv_bytes_per_token == 65536


def test_7b_fp16_model_has_about_14_gb_of_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_2_7B_CONFIG))
    model = cap.model_preset(str(tmp_path))
    # per layer 4*4096^2 + 3*4096*11008 + 2*4096, 32 layers, 2*32000*4096 embeddings, final norm
    assert (
        model.params == 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096
    )
    assert model.params == 6_738_415_616  # Llama-2-7b's published parameter count
    result = cap.compute(model, H100, cap.ServingSpec(max_model_len=4096))
    assert result.weight_bytes == 2 * 6_738_415_616
    assert 13e9 < result.weight_bytes < 14.5e9


@pytest.mark.parametrize(
    ("name", "params"),
    [  # the parameter counts published with each checkpoint (safetensors metadata)
        ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),
        ("meta-llama/Llama-3.1-70B-Instruct", 70_553_706_496),
        ("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
        ("Qwen/Qwen3-32B", 32_762_123_264),
        ("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46_702_792_704),
    ],
)
def test_preset_parameter_counts_match_the_checkpoints(name: str, params: int) -> None:
    assert cap.model_preset(name).params == params


def test_mixtral_active_parameters_are_two_of_eight_experts() -> None:
    model = cap.model_preset("mixtral-8x7b")
    assert model.active_params == 12_879_925_248  # "12.9B active" on the model card
    assert model.params - model.active_params == 32 * 6 * 3 * 4096 * 14336


def test_llama_8b_on_h100_matches_vllm_start_up() -> None:
    result = cap.compute(cap.model_preset("meta-llama/Llama-3.1-8B-Instruct"), H100, LLM_D)
    assert result.gpu.memory_bytes / GIB == pytest.approx(79.18, abs=0.005)
    assert result.budget_bytes / GIB == pytest.approx(71.26, abs=0.005)
    assert result.weight_bytes / GIB == pytest.approx(14.99, rel=0.005)
    assert result.kv_bytes / GIB == pytest.approx(51.38, rel=0.005)
    assert result.num_blocks == result.kv_bytes // (16 * 131072)


def test_llama_70b_fp8_needs_two_h100s_as_vllm_found() -> None:
    model = cap.model_preset("meta-llama/Llama-3.1-70B-Instruct")  # same shape as Llama-3.3-70B
    tp2 = dataclasses.replace(LLM_D, tensor_parallel=2, weight_dtype="fp8")
    result = cap.compute(model, H100, tp2)
    assert result.weight_bytes / GIB == pytest.approx(33.88, rel=0.005)
    assert result.kv_bytes / GIB == pytest.approx(32.0, rel=0.01)
    assert result.kv_bytes_per_token_per_gpu == result.kv_bytes_per_token // 2
    one_gpu = dataclasses.replace(tp2, tensor_parallel=1)
    assert cap.weight_bytes_per_gpu(model, "fp8", 1) / GIB == pytest.approx(67.72, rel=0.005)
    with pytest.raises(cap.CapacityError, match="no memory left for the KV cache"):
        cap.compute(model, H100, one_gpu)


def test_qwen3_32b_starts_at_16000_but_not_32000_tokens_as_vllm_found() -> None:
    model = cap.model_preset("Qwen/Qwen3-32B")
    result = cap.compute(model, H100, LLM_D)
    assert result.weight_bytes / GIB == pytest.approx(61.03, rel=0.005)
    assert result.kv_bytes / GIB == pytest.approx(4.45, rel=0.01)
    with pytest.raises(cap.CapacityError, match="cannot hold one 32000-token sequence"):
        cap.compute(model, H100, dataclasses.replace(LLM_D, max_model_len=32000))


def test_concurrency_formula_reproduces_vllm_log_lines() -> None:
    result = cap.compute(cap.model_preset("llama-3.1-8b"), H100, LLM_D)
    assert round(dataclasses.replace(result, num_blocks=1381).max_concurrency(2048), 2) == 10.79
    logged = dataclasses.replace(result, num_blocks=127626)
    assert logged.kv_tokens == 2_042_016
    assert round(logged.max_concurrency(2048), 2) == 997.08


def test_oom_boundary_is_the_reported_minimum_utilization() -> None:
    model = cap.model_preset("qwen2.5-7b")
    result = cap.compute(model, cap.gpu_preset("L4"), cap.ServingSpec(max_model_len=32768))
    lowest = result.min_gpu_memory_utilization
    above = cap.ServingSpec(max_model_len=32768, gpu_memory_utilization=lowest + 0.002)
    below = cap.ServingSpec(max_model_len=32768, gpu_memory_utilization=lowest - 0.002)
    assert cap.compute(model, cap.gpu_preset("L4"), above).max_sequences(32768) == 1
    with pytest.raises(cap.CapacityError):
        cap.compute(model, cap.gpu_preset("L4"), below)


def test_max_sequences_is_where_preemption_starts() -> None:
    result = cap.compute(cap.model_preset("llama-3.1-8b"), H100, LLM_D)
    for context in (1, 15, 16, 17, 4000, 16000):
        per_sequence = result.blocks_per_sequence(context)
        fits = result.max_sequences(context)
        assert fits * per_sequence <= result.num_blocks < (fits + 1) * per_sequence


def test_kv_heads_are_replicated_beyond_their_count() -> None:
    model = cap.model_preset("llama-3.1-70b")  # 8 KV heads
    assert cap.kv_heads_per_gpu(model, 4) == 2
    assert cap.kv_heads_per_gpu(model, 16) == 1


def test_hugging_face_config_reads_like_the_preset(tmp_path: Path) -> None:
    config = dict(cap.MODEL_CONFIGS["Qwen/Qwen2.5-7B-Instruct"], _name_or_path="my/qwen")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = cap.model_preset(str(path))
    assert model.name == "my/qwen"
    assert dataclasses.replace(model, name="x") == dataclasses.replace(
        cap.model_preset("qwen2.5-7b"), name="x"
    )


def test_multimodal_config_uses_its_text_config(tmp_path: Path) -> None:
    text = cap.MODEL_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": text}))
    assert cap.model_preset(str(tmp_path)).params == 8_030_261_248


def test_config_missing_fields_names_them(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    with pytest.raises(
        cap.CapacityError, match="missing num_hidden_layers, vocab_size, intermediate_size"
    ):
        cap.model_preset(str(path))


def test_cli_prints_a_table() -> None:
    result = CliRunner().invoke(main, ["capacity", "--gpu-memory-utilization", "0.9",
                                       "--max-model-len", "16000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "KV blocks" in result.output
    assert "max concurrency" in result.output
    expected = cap.compute(cap.model_preset("llama-3.1-8b"), H100, LLM_D)
    assert f"{expected.num_blocks:,} x 16" in result.output


def test_cli_json_has_the_figures() -> None:
    args = ["capacity", "--model", "mixtral-8x7b", "--gpu", "H200", "-tp", "2", "--json",
            "--context", "8192"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["kv_bytes_per_token"] == 131072
    assert data["kv_bytes_per_token_per_gpu"] == 65536
    assert data["context"] == 8192
    assert data["max_sequences"] == data["num_blocks"] // 512
    assert data["preemption_from_sequences"] == data["max_sequences"] + 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "is neither a preset"),
        (["--gpu", "TPU"], "unknown GPU 'TPU'"),
        (["--model", "llama-3.1-8b", "-tp", "3"], "must divide the 32 attention heads"),
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["capacity", *args])
    assert result.exit_code == 2
    assert result.output.startswith("Error: ")
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_config_without_fields_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{}")
    result = CliRunner().invoke(main, ["capacity", "--model", str(path)])
    assert result.exit_code == 2
    assert "does not describe a model: missing num_hidden_layers" in result.output


# --- a configuration that does not fit -------------------------------------------------------
def _serving_option(flag: str) -> click.Option:
    from inferwatch.capacity.cli import capacity

    return next(p for p in capacity.params if isinstance(p, click.Option) and flag in p.opts)


def _within_flag_ranges(flags: str) -> None:
    words = flags.split()
    for flag, value in zip(words[::2], words[1::2], strict=True):
        _serving_option(flag).type.convert(value, None, None)  # raises outside the range


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "llama-3.1-70b", "--gpu", "L4"],  # weights alone exceed the GPU
        ["--model", "llama-3.1-8b", "--gpu", "L4"],  # 131072 tokens do not fit one sequence
        ["--model", "qwen2.5-7b", "--gpu", "L4", "--gpu-memory-utilization", "0.5"],
        ["--model", "Qwen/Qwen3-32B", "--gpu", "H100", "--max-model-len", "32000"],
    ],
)
def test_a_config_that_does_not_fit_prints_the_table_and_changes_that_work(
    args: list[str],
) -> None:
    result = CliRunner().invoke(main, ["capacity", *args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    for row in ("weights", "KV cache", "KV blocks", "max concurrency", "start-up needs"):
        assert f"\n{row} " in result.output
    assert "does not fit: " in result.output
    fixes = result.output.split("it would start with any one of:\n")[1].splitlines()
    assert fixes
    for fix in fixes:
        _within_flag_ranges(fix)
        fixed = CliRunner().invoke(main, ["capacity", *args, *fix.split()])
        assert fixed.exit_code == 0, (fix, fixed.output)
        assert "does not fit" not in fixed.output


def test_a_hopeless_config_says_so_and_names_no_impossible_value() -> None:
    args = ["capacity", "--model", "llama-3.1-70b", "--gpu", "L4", "--gpu-memory-utilization",
            "0.1"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "no change of one or two serving flags makes it fit" in result.output
    assert "more than the GPU has" in result.output  # not "utilization >= 7.84"
    assert "utilization >= " not in result.output
    data = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert data["fits"] is False and data["suggestions"] == [] and data["problem"]


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(sorted(cap.MODEL_CONFIGS)),
    gpu=st.sampled_from(sorted(cap.GPU_PRESETS)),
    utilization=st.floats(0.05, 1.0),
    max_model_len=st.integers(1, 262_144),
    kv_fp8=st.booleans(),
)
def test_every_suggestion_fits_and_stays_in_its_flags_range(
    model: str, gpu: str, utilization: float, max_model_len: int, kv_fp8: bool
) -> None:
    spec, device = cap.model_preset(model), cap.gpu_preset(gpu)
    serving = cap.ServingSpec(
        gpu_memory_utilization=utilization,
        max_model_len=max_model_len,
        kv_cache_dtype="fp8" if kv_fp8 else "auto",
    )
    if cap.size(spec, device, serving).problem is None:
        assert cap.suggest(spec, device, serving) == []  # nothing asked, nothing offered
        return
    for suggestion in cap.suggest(spec, device, serving):
        _within_flag_ranges(suggestion.flags)
        assert cap.size(spec, device, suggestion.serving).problem is None, suggestion.flags
