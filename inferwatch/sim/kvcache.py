"""A paged KV cache: fixed-size blocks with reference counts and prefix reuse, as in vLLM V1.

A full block is identified by the hash of its tokens chained to the hash of the block before
it, so two requests that share a prefix share its blocks. Freed blocks keep their hash and go
to the tail of the free queue; allocation takes from the head, evicting the least recently
freed cached block first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def block_hashes(tokens: Sequence[str], block_size: int, parent: int | None = None) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (which start at a block boundary)."""
    out: list[int] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out


class BlockPool:
    """Blocks 0..num_blocks-1; ``withheld`` blocks are unusable (the KV-exhaustion fault)."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks < 1:
            raise ValueError("a KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.withheld = 0
        self._refs = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # hash -> block id
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (cached-but-unused ones included)."""
        return max(0, len(self._free) - self.withheld)

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: the share of blocks not free."""
        return 1.0 - self.num_free / self.num_blocks

    def cached_prefix(self, hashes: Iterable[int]) -> list[int]:
        """Blocks holding the longest cached run of ``hashes`` (not yet referenced)."""
        blocks: list[int] = []
        if not self.enable_prefix_caching:
            return blocks
        for value in hashes:
            block = self._cached.get(value)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def idle_among(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` sit in the free queue (taking them uses up free space)."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def take(self, blocks: Iterable[int]) -> None:
        """Add a reference to cached blocks a request reuses."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks, or None (nothing taken) when too few are free."""
        if count > self.num_free:
            return None
        blocks = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            old = self._hash[block]
            if old is not None:
                del self._cached[old]
                self._hash[block] = None
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block; the tail of a sequence is evicted first."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if self._hash[block] is None:
                    self._free.move_to_end(block, last=False)

    def register(self, block: int, value: int) -> None:
        """Mark a now-full block as holding the block with hash ``value``."""
        if not self.enable_prefix_caching or self._hash[block] is not None:
            return
        if value not in self._cached:
            self._cached[value] = block
            self._hash[block] = value

    def check(self, owners: Iterable[Sequence[int]]) -> None:
        """Assert the bookkeeping: references match owners, free blocks are unreferenced."""
        counts = [0] * self.num_blocks
        for blocks in owners:
            for block in blocks:
                counts[block] += 1
        assert counts == self._refs, "block reference counts disagree with their owners"
        assert all(self._refs[b] == 0 for b in self._free), "a referenced block is free"
        assert len(self._free) + sum(1 for r in self._refs if r) == self.num_blocks
        for value, block in self._cached.items():
            assert self._hash[block] == value, "cache index points at a re-used block"
