"""Cheap detectors for degenerate model output: text in, the signals that fired out.

These run on every probe reply and on sampled live traffic (the tenancy proxy calls
:func:`detect` through :class:`inferwatch.probes.livesample.DegeneracySampler`), so they are
pure, dependency-free and bounded: at most :data:`MAX_CHARS` characters are examined.

Signals:

``empty``         nothing but whitespace, and no tool call
``repetition``    a repetition loop: the zlib compression ratio of a 512-character window
                  exceeds 2.4 (the threshold Whisper uses to reject looping transcripts), or
                  a short unit repeated eight times or more in a row
``wrong_script``  letters from Unicode scripts the prompt did not use (Thai or Chinese in an
                  English answer, the symptom of a broken sampling kernel)
``runaway``       far longer than a correct answer would be
``finish_length`` the engine stopped at ``max_tokens`` (``finish_reason=length``)
``invalid_json``  JSON was expected and the text is not one JSON value
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
import zlib
from collections import Counter
from typing import Any, Final, Literal

Signal = Literal["empty", "repetition", "wrong_script", "runaway", "finish_length", "invalid_json"]
SIGNALS: Final[tuple[Signal, ...]] = (
    "empty",
    "repetition",
    "wrong_script",
    "runaway",
    "finish_length",
    "invalid_json",
)

MAX_CHARS: Final = 8192
COMPRESSION_RATIO_LIMIT: Final = 2.4
# Below this size zlib's own overhead hides any repetition, so the ratio is not computed.
MIN_BYTES_FOR_RATIO: Final = 96
RATIO_WINDOW_CHARS: Final = 512
WHOLE_TEXT_RATIO_LIMIT: Final = 4.0
# A unit of up to 32 characters repeated 8 times or more in a row, over 24 characters or
# more, is a loop ("|---|---|" table rules are excluded by requiring a letter or digit).
_LOOP: Final = re.compile(r"(.{1,32}?)\1{7,}", re.DOTALL)
MIN_LOOP_CHARS: Final = 24
# A long reply may carry a letter or two of another script (a name, a symbol); three such
# letters, or a stray one that makes up a large share of a short reply, count.
FOREIGN_LETTERS_MIN: Final = 3
FOREIGN_SHARE_MIN: Final = 0.3

# Scripts written together, by the script that gives the language away: Japanese mixes
# kanji, hiragana and katakana; Korean may carry hanja.
_SCRIPT_FAMILIES: Final[dict[str, frozenset[str]]] = {
    "hiragana": frozenset({"han", "hiragana", "katakana"}),
    "katakana": frozenset({"han", "hiragana", "katakana"}),
    "hangul": frozenset({"hangul", "han"}),
}
_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n(.*?)\n?```\s*$", re.DOTALL)


@functools.lru_cache(maxsize=4096)
def script_of(char: str) -> str:
    """The Unicode script of a letter, lower-cased (``latin``, ``cyrillic``, ``han``, ...).

    Derived from the character's name, which starts with its script for every alphabetic
    block that matters here ("CJK UNIFIED IDEOGRAPH" maps to ``han``).
    """
    name = unicodedata.name(char, "")
    if name.startswith("CJK"):
        return "han"
    return name.split(" ", 1)[0].lower() if name else "unknown"


def scripts_in(text: str) -> Counter[str]:
    """How many letters of each script ``text`` holds (digits and punctuation ignored)."""
    return Counter(script_of(c) for c in text[:MAX_CHARS] if c.isalpha())


def allowed_scripts(*texts: str) -> frozenset[str]:
    """Scripts a reply to these texts (prompt, reference answer) may use.

    Latin is always allowed (code, names, units); a script family is allowed as a whole.
    """
    allowed = {"latin"}
    for text in texts:
        allowed.update(scripts_in(text))
    for script in list(allowed):
        allowed |= _SCRIPT_FAMILIES.get(script, frozenset())
    return frozenset(allowed)


def compression_ratio(text: str) -> float:
    raw = text[:MAX_CHARS].encode("utf-8")
    return len(raw) / len(zlib.compress(raw))


def is_repetitive(text: str) -> bool:
    text = text[:MAX_CHARS]
    # Per window, because the ratio of healthy prose grows with its length (about 1.6 over
    # 512 characters of English, 2.3 over 8 KiB), while a loop is far above 2.4 anywhere.
    for start in range(0, len(text), RATIO_WINDOW_CHARS):
        window = text[start : start + RATIO_WINDOW_CHARS]
        long_enough = len(window.encode("utf-8")) >= MIN_BYTES_FOR_RATIO
        if long_enough and compression_ratio(window) > COMPRESSION_RATIO_LIMIT:
            return True
    # A loop with a period longer than a window shows over the whole text.
    if len(text) > RATIO_WINDOW_CHARS and compression_ratio(text) > WHOLE_TEXT_RATIO_LIMIT:
        return True
    # Short loops ("42424242...", "the the the ...") are too short for zlib to notice.
    return any(
        len(match.group(0)) >= MIN_LOOP_CHARS and any(c.isalnum() for c in match.group(1))
        for match in _LOOP.finditer(text)
    )


def has_wrong_script(text: str, allowed: frozenset[str]) -> bool:
    letters = scripts_in(text)
    total = sum(letters.values())
    foreign = sum(n for script, n in letters.items() if script not in allowed)
    return foreign >= FOREIGN_LETTERS_MIN or (foreign > 0 and foreign / total >= FOREIGN_SHARE_MIN)


def parse_json(text: str) -> Any:
    """The one JSON value in ``text`` (a surrounding Markdown code fence is tolerated).

    Raises ``ValueError`` when the text is not exactly one JSON value.
    """
    fenced = _FENCE.match(text)
    return json.loads(fenced.group(1) if fenced else text)


def detect(
    text: str,
    *,
    allowed: frozenset[str] | None = None,
    finish_reason: str = "",
    max_chars: int | None = None,
    expect_json: bool = False,
    has_tool_call: bool = False,
) -> frozenset[Signal]:
    """Every degeneracy signal that fires on ``text``.

    ``allowed`` is the set of scripts the reply may use (see :func:`allowed_scripts`; ``None``
    skips the script check); ``max_chars`` the length past which a reply is a runaway.
    """
    fired: set[Signal] = set()
    if not text.strip():
        if not has_tool_call:
            fired.add("empty")
    else:
        if is_repetitive(text):
            fired.add("repetition")
        if allowed is not None and has_wrong_script(text, allowed):
            fired.add("wrong_script")
        if max_chars is not None and len(text) > max_chars:
            fired.add("runaway")
        if expect_json:
            try:
                parse_json(text)
            except ValueError:
                fired.add("invalid_json")
    if finish_reason == "length":
        fired.add("finish_length")
    return frozenset(fired)
