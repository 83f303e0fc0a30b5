"""The scrape path's bounded memos: pages of ever-new names must not grow memory."""

from __future__ import annotations

from inferwatch.exporters import textformat
from inferwatch.exporters.engines import mapping
from inferwatch.exporters.fastpath import Memo


def test_a_memo_forgets_everything_at_its_limit_and_keeps_answering() -> None:
    memo: Memo[str, int] = Memo(3)
    for i in range(3):
        assert memo.remember(f"k{i}", i) == i
    assert dict(memo) == {"k0": 0, "k1": 1, "k2": 2}
    assert memo.remember("k3", 3) == 3
    assert dict(memo) == {"k3": 3}


def test_every_scrape_path_memo_is_bounded_by_one_policy() -> None:
    """Ever-new series heads, label pieces and names (a hostile page) stay under the bound."""
    memos = [textformat._series, textformat._label_pieces, textformat._legacy_names]
    memos += [textformat._line_starts, *textformat._comments.values(), mapping._FOLDED]
    assert all(isinstance(memo, Memo) for memo in memos)
    limit = textformat._series.limit
    page = "".join(f'x{i}{{a{i}="v"}} 1\n# HELP h{i} h\n' for i in range(limit + 10))
    textformat.parse(page)
    for i in range(mapping._FOLDED.limit + 10):
        mapping.fold(f"vllm:name_{i}_total")
    assert all(len(memo) <= memo.limit for memo in memos)
    assert mapping.fold("vllm:prompt_tokens_total") == "vllm_prompt_tokens"
    textformat.clear_caches()
