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
#: request fields whose content reaches the model as prompt text
_INPUT_FIELDS = ("prompt", "input", "suffix", "instructions", "system", "documents")
_SCHEMA_FIELDS = ("tools", "functions")
#: content part types that carry media rather than text (OpenAI chat and Responses, vLLM)
MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file"}
)


def byte_bound(text: str) -> int:
    """Tokens ``text`` can take at most, under any byte-level or byte-fallback vocabulary."""
    return len(text.encode("utf-8", "surrogatepass")) + 1


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

        Raises ``ValueError`` for a tool schema nested too deeply to be written out.
        """
        total = 0
        messages = body.get("messages")
        if isinstance(messages, list):
            total += REPLY_PRIMING
            for message in messages:
                total += TOKENS_PER_MESSAGE
                if isinstance(message, Mapping):
                    # the role is framing; everything else is rendered into the prompt
                    total += self._strings({k: v for k, v in message.items() if k != "role"})
                else:
                    total += self._strings(message)
        for name in _INPUT_FIELDS:
            if name in body:
                total += self._strings(body[name])
        for name in _SCHEMA_FIELDS:
            if name in body:
                # templates write schemas out as JSON text, punctuation and all
                try:
                    schema = json.dumps(body[name], ensure_ascii=False, default=str)
                except RecursionError:
                    raise ValueError(f"{name} is nested too deeply") from None
                total += self.count_text(schema)
        return total
