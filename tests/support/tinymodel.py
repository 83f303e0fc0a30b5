"""A tiny Llama that real engines load without weights: a config, a tokenizer, a chat template.

vLLM serves it with ``--load-format dummy`` (random weights, so its text is gibberish while its
scheduler, KV cache, streaming, limits, metrics and errors are vLLM's own); llama.cpp's server
reads the same shape from a GGUF with random tensors. The tokenizer is a byte-level BPE trained
here on the project's own docs, so nothing is downloaded. ``head_dim`` is 64 because vLLM's CPU
attention kernel refuses smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.shared import REPO

#: the model's context, small so that over-length prompts are cheap to build
MAX_MODEL_LEN = 1024
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
#: a Llama-3-style template reduced to what the engines render (roles, generation prompt)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def training_text() -> list[str]:
    """Any local prose will do; the project's docs are always there."""
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    return [line for page in pages for line in page.read_text(encoding="utf-8").splitlines()]


def write(folder: Path) -> Path:
    """Write the model folder (config, tokenizer, template) and return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    unk, bos, eos = (tokenizer.token_to_id(token) for token in SPECIAL_TOKENS)
    config = {**LLAMA, "vocab_size": tokenizer.get_vocab_size(), "bos_token_id": bos,
              "eos_token_id": eos}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": MAX_MODEL_LEN,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2),
                                                  encoding="utf-8")  # fmt: skip
    generation = {"bos_token_id": bos, "eos_token_id": eos}
    (folder / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    assert unk == 0
    return folder
