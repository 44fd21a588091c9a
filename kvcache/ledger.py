"""SegmentLedger: per segment file, the bytes written and the bytes still live, and the read fds.

    total[seg]  bytes of records written (after a restart: the file size, torn tails included)
    live[seg]   bytes of records the index points at; total - live is what compaction reclaims

Read fds are opened on first use and pinned by each read in flight. A retired segment is
unlinked at once (a rebuild never sees it) and its fd closes when the last pin goes, so a read
that started before compaction finishes on the old bytes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dsi.kvcache.segments import HEADER_BYTES, Written, segment_path


class SegmentLedger:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.total: dict[int, int] = {}
        self.live: dict[int, int] = {}
        self._fds: dict[int, int] = {}
        self._pins: dict[int, int] = {}
        self._retired: set[int] = set()

    @property
    def live_bytes(self) -> int:
        return sum(self.live.values())

    def written(self, written: Sequence[Written]) -> int:
        """Count records appended; returns their bytes."""
        nbytes = 0
        for w in written:
            self.total[w.segment] = self.total.get(w.segment, 0) + HEADER_BYTES + w.size
            nbytes += HEADER_BYTES + w.size
        return nbytes

    def add_live(self, segments: np.ndarray, sizes: np.ndarray) -> None:
        for seg, nbytes in _per_segment(segments, sizes).items():
            self.live[seg] = self.live.get(seg, 0) + nbytes

    def remove_live(self, segments: np.ndarray, sizes: np.ndarray) -> None:
        for seg, nbytes in _per_segment(segments, sizes).items():
            if seg in self.live:
                self.live[seg] -= nbytes

    def most_dead(self, active: int, below: float) -> int | None:
        """The sealed segment with the smallest live fraction, if that fraction is below ``below``."""
        ratios = {s: self.live.get(s, 0) / max(t, 1) for s, t in self.total.items() if s != active}
        worst = min(ratios, key=ratios.__getitem__, default=None)
        return worst if worst is not None and ratios[worst] < below else None

    def pin(self, seg: int) -> int:
        """An open fd of ``seg`` held until ``unpin``; -1 when the file is gone."""
        fd = self._fds.get(seg)
        if fd is None:
            try:
                fd = os.open(segment_path(self.root, seg), os.O_RDONLY)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                return -1
            self._fds[seg] = fd
        self._pins[seg] = self._pins.get(seg, 0) + 1
        return fd

    def unpin(self, seg: int) -> None:
        self._pins[seg] -= 1
        if not self._pins[seg]:
            del self._pins[seg]
            if seg in self._retired:
                self._retired.discard(seg)
                os.close(self._fds.pop(seg))

    def retire(self, seg: int) -> None:
        """Unlink a segment now; its fd closes when no read holds it."""
        segment_path(self.root, seg).unlink(missing_ok=True)
        self.live.pop(seg, None)
        self.total.pop(seg, None)
        if seg in self._pins:
            self._retired.add(seg)
        elif seg in self._fds:
            os.close(self._fds.pop(seg))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _per_segment(segments: np.ndarray, sizes: np.ndarray) -> dict[int, int]:
    if not len(segments):
        return {}
    ids, inverse = np.unique(segments, return_inverse=True)
    totals = np.bincount(inverse, weights=sizes.astype(np.float64) + HEADER_BYTES)
    return {int(s): int(t) for s, t in zip(ids, totals, strict=True)}
