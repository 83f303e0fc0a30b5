"""The tiny Llama as a GGUF with random weights, for llama.cpp's own server.

llama.cpp has no dummy load format: it reads every tensor from the file, so the file holds the
tiny Llama's tensors filled with small random numbers (its text is gibberish, its scheduler,
slots, limits and metrics are llama.cpp's own). The tokenizer is the one ``tinymodel`` trains,
written the way llama.cpp reads a byte-level BPE (``tokenizer.ggml.model = gpt2``): tokens,
merges, token types, bos/eos and the chat template, so both engines count the same prompt alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import tinymodel


def write(folder: Path) -> Path:
    """Write ``tiny.gguf`` under ``folder`` (beside the Hugging Face folder it comes from)."""
    import gguf
    import numpy as np

    source = tinymodel.write(folder / "hf")
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    model = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
    assert [model["vocab"][token] for token in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    path = folder / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    writer.add_name("tiny")
    writer.add_context_length(tinymodel.MAX_MODEL_LEN)
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    special = set(tinymodel.SPECIAL_TOKENS)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(tinymodel.CHAT_TEMPLATE)

    random = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, random.normal(0, 0.02, shape).astype(np.float32))

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(hidden, dtype=np.float32))

    ffn, kv = config["intermediate_size"], config["num_key_value_heads"] * config["head_dim"]
    tensor("token_embd.weight", len(tokens), hidden)
    for block in range(config["num_hidden_layers"]):
        norm(f"blk.{block}.attn_norm.weight")
        tensor(f"blk.{block}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{block}.attn_k.weight", kv, hidden)
        tensor(f"blk.{block}.attn_v.weight", kv, hidden)
        tensor(f"blk.{block}.attn_output.weight", hidden, hidden)
        norm(f"blk.{block}.ffn_norm.weight")
        tensor(f"blk.{block}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{block}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{block}.ffn_down.weight", hidden, ffn)
    norm("output_norm.weight")
    tensor("output.weight", len(tokens), hidden)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
