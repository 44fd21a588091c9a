"""Conversations as token streams, hashed with the real chain as they grow.

A :class:`Context` is one conversation's tokens so far (system prompt, then turns of user
message and answer); it keeps the chain keys of its full pages and hashes only the pages that
new tokens complete (``HashChain.hashes`` with ``parent``). Token ids are synthetic: a segment
(system prompt k, or the n-th message of the run) is ``uid * 2**20 + 0, 1, 2 ...``; equal
segments give equal tokens, so sessions that share system prompt k share its pages.

A turn (:meth:`Context.turn`) returns the prompt's full-page keys and the keys of the full pages
of prompt + answer (positions [0, prompt + output - 1): the last answer token is never fed
back), as views of one growing array.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dsi.kvcache.hashchain import HashChain, keys_of

SEGMENT_TOKENS = 1 << 20  # token ids per segment uid


@dataclass(slots=True)
class Context:
    chain: HashChain
    tokens: int = 0
    _keys: np.ndarray = field(default_factory=lambda: np.zeros((64, 2), dtype=np.uint64))
    _pages: int = 0
    _tail: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))

    def extend(self, uid: int, count: int) -> None:
        """Append ``count`` tokens of segment ``uid``."""
        base = (uid * SEGMENT_TOKENS) & 0xFFFFFFFF
        new = (np.arange(count, dtype=np.uint64) + base).astype(np.uint32)
        data = np.concatenate([self._tail, new])
        full = len(data) // self.chain.block_size
        if full:
            parent = self._keys[self._pages - 1].tobytes() if self._pages else None
            packed = self.chain.hashes(data[: full * self.chain.block_size], parent=parent)
            self._append(keys_of(packed))
        self._tail = data[full * self.chain.block_size :]
        self.tokens += count

    def keys(self, pages: int) -> np.ndarray:
        """``[pages, 2]`` keys of the first ``pages`` full pages (a view)."""
        if pages > self._pages:
            raise ValueError(f"only {self._pages} full pages, not {pages}")
        return self._keys[:pages]

    def turn(
        self, message_uid: int, message: int, answer_uid: int, answer: int
    ) -> tuple[int, np.ndarray, np.ndarray]:
        """(prompt tokens, prompt keys, persist keys) of a turn that adds ``message`` tokens and
        is answered by ``answer`` tokens (>= 1), which stay in the context."""
        self.extend(message_uid, message)
        prompt = self.tokens
        keys = self.keys(prompt // self.chain.block_size)
        self.extend(answer_uid, answer)
        persist = self.keys((prompt + answer - 1) // self.chain.block_size)
        return prompt, keys, persist

    def _append(self, keys: np.ndarray) -> None:
        need = self._pages + len(keys)
        if need > len(self._keys):
            grown = np.zeros((max(need, 2 * len(self._keys)), 2), dtype=np.uint64)
            grown[: self._pages] = self._keys[: self._pages]
            self._keys = grown  # views handed out keep the old array, whose first pages are final
        self._keys[self._pages : need] = keys
        self._pages = need
