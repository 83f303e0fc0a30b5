"""Prompt tokens of a request, counted over every part that reaches the model.

The count decides the input limit and the budget reservation, so it must not be fooled: it
walks all messages and every field of each (content parts, names, tool calls), the system
prompt, tool and function schemas, Responses-style ``instructions``, completion prompts as
strings, lists of strings or token ids, and embedding inputs.

With a tokenizer configured (the model's ``tokenizer.json``, read by the ``tokenizers``
library) strings are counted exactly. Without one, each string counts as its UTF-8 length in
bytes plus one, a bound that never undercounts: a byte-level BPE token (GPT-2, Llama 3, Qwen)
stands for at least one byte, a SentencePiece token with byte fallback (Llama 2, Mistral)
likewise, apart from the one word-boundary marker it may prepend to a string (the ``+ 1``).
English text is overcounted about fourfold, which errs on refusing; configure the tokenizer
where limits are tight.

Media parts (images, audio, video, files) are not text: their base64 data would count a
thousand times over, and what they cost depends on the model's encoder, so they are left
out here and bounded by the body size limit instead.

A template can render any field a request carries (vLLM hands ``chat_template_kwargs``,
``documents`` and ``tools`` to it, and a custom ``chat_template`` is text of its own), so
every field counts except the sampling and transport parameters no template writes out
(:data:`NOT_RENDERED`); those the template writes as JSON (tool schemas, template arguments,
tool calls) count as their JSON text, keys and punctuation included.

The reverse, a floor, bounds what an engine may claim a reply's text took (:meth:`floor`):
the tokenizer's count, or without one a token per :data:`MAX_TOKEN_BYTES` bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: per-message framing of chat templates (role header and separators), as OpenAI's cookbook
TOKENS_PER_MESSAGE = 4
#: every reply is primed with an assistant header
REPLY_PRIMING = 3
#: request fields no chat template renders: what to sample and how to send it
NOT_RENDERED = frozenset(
    {
        "model", "messages", "stream", "stream_options", "n", "best_of", "max_tokens",
        "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
        "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty",
        "logit_bias", "logprobs", "top_logprobs", "echo", "user", "metadata", "store",
        "response_format", "tool_choice", "parallel_tool_calls", "service_tier",
        "encoding_format", "dimensions", "ignore_eos", "skip_special_tokens",
        "add_generation_prompt", "continue_final_message", "add_special_tokens",
        # vLLM's extra sampling and decoding parameters
        "min_tokens", "length_penalty", "use_beam_search", "include_stop_str_in_output",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs",
        "allowed_token_ids", "bad_words", "guided_json", "guided_regex", "guided_choice",
        "guided_grammar", "guided_decoding_backend", "structured_outputs", "priority",
        "request_id", "return_tokens_as_token_ids", "cache_salt",
    }
)  # fmt: skip
#: fields a template writes out as JSON text (at any level of a message too)
_JSON_FIELDS = frozenset({"tools", "functions", "chat_template_kwargs", "tool_calls"})
#: bytes of the longest token of the vocabularies an engine serves (GPT-2's, Llama 3's,
#: Qwen 2's and o200k's longest are shorter): a text has at least one token per this many
MAX_TOKEN_BYTES = 256
#: replies longer than this are floored by their bytes, not tokenized on the event loop
_FLOOR_TOKENIZE_CHARS = 256 << 10
#: content part types that carry media rather than text (OpenAI chat and Responses, vLLM)
MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file"}
)


def byte_bound(text: str) -> int:
    """Tokens ``text`` can take at most, under any byte-level or byte-fallback vocabulary."""
    return len(text.encode("utf-8", "surrogatepass")) + 1


def byte_floor(text: str) -> int:
    """Tokens ``text`` takes at least, whatever the vocabulary (see :data:`MAX_TOKEN_BYTES`)."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // MAX_TOKEN_BYTES)


def load_tokenizer(path: str | Path) -> Callable[[str], int]:
    """A string -> token count function from a ``tokenizer.json``; ValueError if unusable."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(
            "limits.tokenizer needs the tokenizers package (pip install 'inferwatch[tokenizer]')"
        ) from None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises plain Exception for any bad file
        raise ValueError(f"cannot load tokenizer {path}: {exc}") from None

    def count(text: str) -> int:
        try:
            return len(tokenizer.encode(text, add_special_tokens=False).ids)
        except Exception:  # text the tokenizer refuses (a lone surrogate): bound it instead
            return byte_bound(text)

    return count


class PromptCounter:
    def __init__(self, count_text: Callable[[str], int] = byte_bound) -> None:
        self.count_text = count_text

    def floor(self, text: str) -> int:
        """Tokens a reply's ``text`` took at least: the tokenizer's count, else a byte floor."""
        if self.count_text is byte_bound or len(text) > _FLOOR_TOKENIZE_CHARS:
            return byte_floor(text)
        return self.count_text(text)

    def _json(self, name: str, value: Any) -> int:
        """Tokens of ``value`` written out as JSON text, as templates write schemas."""
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except RecursionError:
            raise ValueError(f"{name} is nested too deeply") from None
        return self.count_text(text)

    def _strings(self, value: Any) -> int:
        """Tokens of every string and token id inside ``value``.

        Keys and ``type`` tags are structure the template does not write out (schemas, where
        it does, are counted as JSON text by :meth:`count`). Iterative, so that no nesting
        depth can exhaust the stack.
        """
        total = 0
        stack = [value]
        count = self.count_text
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                total += count(item)
            elif isinstance(item, Mapping):
                if item.get("type") in MEDIA_PARTS:
                    continue
                stack.extend(child for key, child in item.items() if key != "type")
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                total += 1  # a token id, or a number the template writes out
        return total

    def count(self, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a chat, completion, embedding or Responses request body.

        Raises ``ValueError`` for a field nested too deeply to be written out as JSON.
        """
        total = 0
        messages = body.get("messages")
        if isinstance(messages, list):
            total += REPLY_PRIMING
            for message in messages:
                total += TOKENS_PER_MESSAGE
                if isinstance(message, Mapping):
                    # the role is framing; everything else is rendered into the prompt
                    for key, value in message.items():
                        if key in _JSON_FIELDS:
                            total += self._json(key, value)
                        elif key != "role":
                            total += self._strings(value)
                else:
                    total += self._strings(message)
        for name, value in body.items():
            if name in _JSON_FIELDS:
                total += self._json(name, value)
            elif name not in NOT_RENDERED:
                total += self._strings(value)
        return total
