"""The scrape path's bounded memos: pages of ever-new names must not grow memory."""

from __future__ import annotations

import pytest

from inferwatch.exporters.engine.adapters import mapping
from inferwatch.serving import textformat
from inferwatch.serving.fastpath import remember

pytestmark = pytest.mark.unit


def test_a_memo_forgets_everything_at_its_limit_and_keeps_answering() -> None:
    memo: dict[str, int] = {}
    for i in range(3):
        assert remember(memo, f"k{i}", i, 3) == i
    assert memo == {"k0": 0, "k1": 1, "k2": 2}
    assert remember(memo, "k3", 3, 3) == 3
    assert memo == {"k3": 3}


def test_every_scrape_path_memo_stays_under_its_bound() -> None:
    """Ever-new series heads, label pieces, comments and names (a hostile page)."""
    limit = textformat._MEMO_LIMIT
    memos = [textformat._series, textformat._label_pieces, textformat._legacy_names]
    memos += [textformat._line_starts, *textformat._comments.values()]
    page = "".join(f'x{i}{{a{i}="v"}} 1\n# HELP h{i} h\n' for i in range(limit + 10))
    textformat.parse(page)
    assert all(len(memo) <= limit for memo in memos)
    for i in range(mapping.FOLDED_LIMIT + 10):
        mapping.fold(f"vllm:name_{i}_total")
    assert len(mapping._FOLDED) <= mapping.FOLDED_LIMIT
    assert mapping.fold("vllm:prompt_tokens_total") == "vllm_prompt_tokens"
    textformat.clear_caches()
