"""KeyTable: a map from 128-bit keys to int32 slots in flat numpy arrays, batch operations only.

No Python object per key: a dict of 16-byte ``bytes`` keys costs about 150 B per entry, this
costs 16 B of key plus 4-16 B of table. Open addressing with linear probing::

    table  int32[2**k]   0 = empty, -1 = deleted (tombstone), s + 1 = key in slot s
    keys   uint64[cap, 2]  the key of each slot (owned by the caller's record arrays)

A key's home position is its low word masked by ``2**k - 1`` (block hashes are uniform). Every
operation takes a batch of keys and probes all of them at once, one numpy pass per probe step,
so an 8,192-key lookup costs a few vector passes, not 8,192 Python iterations. The load factor
(live + tombstones) stays at most 1/2: past it the table is rebuilt from the live slots, at
twice the size when live keys alone pass 1/4.
"""

from __future__ import annotations

import numpy as np

_EMPTY = 0
_TOMB = -1
_MIN_BITS = 10
_WINDOW = 8
_OFFSETS = np.arange(_WINDOW, dtype=np.int64)


class KeyTable:
    """Key -> slot for keys stored in ``keys[slot]``; the caller assigns slots and owns ``keys``."""

    def __init__(self, expected: int = 0) -> None:
        bits = max(_MIN_BITS, (max(expected, 1) * 2 - 1).bit_length())
        self._table = np.zeros(1 << bits, dtype=np.int32)
        self._used = 0  # live + tombstones
        self.live = 0

    @property
    def nbytes(self) -> int:
        return self._table.nbytes

    def lookup(self, keys: np.ndarray, store: np.ndarray) -> np.ndarray:
        """``keys [n, 2] uint64`` -> ``slots [n] int64``, -1 where absent. ``store`` = keys by slot.

        The first probe is one gather per key (most keys end there); keys still unresolved
        probe ``_WINDOW`` positions per pass, so a long cluster costs few numpy passes.
        """
        n = len(keys)
        found = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.live == 0:
            return found
        mask = len(self._table) - 1
        lo, hi = keys[:, 0], keys[:, 1]
        pos = (lo & np.uint64(mask)).astype(np.int64)
        entry = self._table[pos]
        slot = entry.astype(np.int64) - 1
        hit = (entry > 0) & (store[np.maximum(slot, 0), 0] == lo) & (store[np.maximum(slot, 0), 1] == hi)
        found[hit] = slot[hit]
        active = np.flatnonzero(~hit & (entry != _EMPTY))
        pos = pos[active] + 1
        while active.size:
            window = (pos[:, None] + _OFFSETS) & mask
            entry = self._table[window]
            slot = entry.astype(np.int64) - 1
            cand = np.maximum(slot, 0)
            hit = (entry > 0) & (store[cand, 0] == lo[active, None]) & (store[cand, 1] == hi[active, None])
            row_hit = hit.any(axis=1)
            found[active[row_hit]] = slot[row_hit, hit[row_hit].argmax(axis=1)]
            # A key never lies past an empty position of its probe sequence.
            more = ~row_hit & ~(entry == _EMPTY).any(axis=1)
            active = active[more]
            pos = pos[more] + _WINDOW
        return found

    def insert(self, keys: np.ndarray, slots: np.ndarray, store: np.ndarray) -> None:
        """Add absent, distinct ``keys`` at ``slots`` (``store[slots]`` must already hold them)."""
        n = len(keys)
        if n == 0:
            return
        if (self._used + n) * 2 > len(self._table):
            self._rebuild(self.live + n, store)
        self._place(keys[:, 0], np.asarray(slots, dtype=np.int64))
        self._used += n
        self.live += n

    def remove(self, slots: np.ndarray, store: np.ndarray) -> None:
        """Delete the keys held at ``slots`` (each must be in the table)."""
        if slots.size:
            self._table[self._positions(slots, store)] = _TOMB
            self.live -= slots.size

    def live_slots(self) -> np.ndarray:
        """Every slot in the table (unordered); scans the whole table."""
        entries = self._table[self._table > 0]
        return entries.astype(np.int64) - 1

    def clear(self) -> None:
        self._table[:] = _EMPTY
        self._used = self.live = 0

    # ---- internals ---------------------------------------------------------------------------
    def _positions(self, slots: np.ndarray, store: np.ndarray) -> np.ndarray:
        """Table positions of present slots (probing by value, not by key compare)."""
        mask = len(self._table) - 1
        out = np.empty(slots.size, dtype=np.int64)
        active = np.arange(slots.size)
        pos = (store[slots, 0] & np.uint64(mask)).astype(np.int64)
        want = slots + 1
        while active.size:
            hit = self._table[pos] == want[active]
            out[active[hit]] = pos[hit]
            active = active[~hit]
            pos = (pos[~hit] + 1) & mask
        return out

    def _place(self, lo: np.ndarray, slots: np.ndarray) -> None:
        mask = len(self._table) - 1
        pending = np.arange(slots.size)
        pos = (lo & np.uint64(mask)).astype(np.int64)
        while pending.size:
            free = self._table[pos] == _EMPTY
            # Several pending keys may probe the same free position: the first one takes it.
            cand_pos = pos[free]
            _, first = np.unique(cand_pos, return_index=True)
            winners = np.flatnonzero(free)[first]
            self._table[pos[winners]] = slots[pending[winners]] + 1
            keep = np.ones(pending.size, dtype=bool)
            keep[winners] = False
            pending = pending[keep]
            pos = (pos[keep] + 1) & mask

    def _rebuild(self, need: int, store: np.ndarray) -> None:
        live = self.live_slots()
        size = len(self._table)
        while need * 4 > size:
            size *= 2
        self._table = np.zeros(size, dtype=np.int32)
        self._place(store[live, 0], live)
        self._used = self.live = live.size


class KeySet:
    """A set of 128-bit keys (``[n, 2]`` uint64) with batch add / remove / prefix match."""

    def __init__(self, expected: int = 0) -> None:
        self.keys = np.zeros((max(expected, 1024), 2), dtype=np.uint64)
        self._table = KeyTable(expected)
        self._free = np.empty(0, dtype=np.int64)
        self._top = 0

    def __len__(self) -> int:
        return self._table.live

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self._table.nbytes + self._free.nbytes

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._table.lookup(keys, self.keys) >= 0

    def match_prefix(self, keys: np.ndarray) -> int:
        """How many leading keys are present."""
        misses = np.flatnonzero(~self.contains(keys))
        return int(misses[0]) if misses.size else len(keys)

    def add(self, keys: np.ndarray) -> None:
        new = np.flatnonzero(~self.contains(keys))
        if new.size > 1:
            _, first = np.unique(keys[new].view("V16").ravel(), return_index=True)
            new = new[first]
        if not new.size:
            return
        reuse = min(new.size, self._free.size)
        slots = np.concatenate(
            [self._free[self._free.size - reuse :], np.arange(self._top, self._top + new.size - reuse)]
        )
        self._free = self._free[: self._free.size - reuse]
        self._top += new.size - reuse
        if self._top > len(self.keys):
            grown = np.zeros((max(self._top, 2 * len(self.keys)), 2), dtype=np.uint64)
            grown[: len(self.keys)] = self.keys
            self.keys = grown
        self.keys[slots] = keys[new]
        self._table.insert(keys[new], slots, self.keys)

    def remove(self, keys: np.ndarray) -> None:
        slots = self._table.lookup(keys, self.keys)
        slots = np.unique(slots[slots >= 0])
        self._table.remove(slots, self.keys)
        self._free = np.concatenate([self._free, slots])

    def all(self) -> np.ndarray:
        return self.keys[self._table.live_slots()]

    def clear(self) -> None:
        self._table.clear()
        self._free = np.empty(0, dtype=np.int64)
        self._top = 0
