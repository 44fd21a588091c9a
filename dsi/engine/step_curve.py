"""The step-time curve: seconds per engine step against the tokens in the step.

Measured at start-up for speculative decoding (``speculative = "dspark"``): for each batch of B
sequences (1, 8, 32, 64, up to the engine's ``max_running``) and each verify length L (1 = a
plain decode step, 2..6 = last token + L - 1 drafts), a forward of B slices of L tokens at
position ``context`` (after a prefill of ``context`` tokens), plus the draft's proposal time for
B sequences. The dspark policy reads ``step_time(B, n)``: linear in L = n / B between the
measured lengths (extended linearly beyond), linear in B between the measured batches::

    seconds[b][l]   B = batches[b], L = lengths[l]      (+ draft_seconds[b] per step)

A curve measured once (the ``step_curve`` object of ``dsi status --json`` or ``dsi bench spec
--json``, saved as a JSON file) can be given instead (``[engine] step_curve``): the engine then
starts without measuring.
"""

from __future__ import annotations

import bisect
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dsi.engine.batch import StepSlice

BATCHES = (1, 8, 32, 64)
LENGTHS = (1, 2, 3, 4, 6)


@dataclass(frozen=True, slots=True)
class StepCurve:
    batches: tuple[int, ...]
    lengths: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # [batch][length] forward seconds
    draft_seconds: tuple[float, ...]  # [batch] draft proposal seconds

    def step_time(self, batch: int, tokens: int) -> float:
        """Seconds for a step of ``tokens`` tokens over ``batch`` sequences (draft included)."""
        batch = max(1, batch)
        per = tokens / batch
        i = bisect.bisect_left(self.batches, batch)
        if i == 0:
            return self._row(0, per)
        if i == len(self.batches):
            return self._row(i - 1, per) * batch / self.batches[-1]
        b0, b1 = self.batches[i - 1], self.batches[i]
        f = (batch - b0) / (b1 - b0)
        return (1 - f) * self._row(i - 1, per) + f * self._row(i, per)

    def _row(self, b: int, per: float) -> float:
        xs, ys = self.lengths, self.seconds[b]
        j = min(max(1, bisect.bisect_left(xs, per)), len(xs) - 1)
        x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
        return max(1e-6, y0 + (y1 - y0) * (per - x0) / (x1 - x0)) + self.draft_seconds[b]

    def as_dict(self) -> dict:
        return {
            "batches": list(self.batches),
            "lengths": list(self.lengths),
            "step_ms": [[round(1e3 * s, 3) for s in row] for row in self.seconds],
            "draft_ms": [round(1e3 * s, 3) for s in self.draft_seconds],
        }

    @classmethod
    def from_dict(cls, d: dict) -> StepCurve:
        """The inverse of ``as_dict`` (what ``dsi status --json`` and ``dsi bench spec --json``
        print); ValueError when it is not a curve: batches and lengths increasing positive
        integers (lengths from 1, at least two), step_ms [batch][length] and draft_ms [batch]
        non-negative milliseconds."""
        try:
            batches = tuple(int(b) for b in d["batches"])
            lengths = tuple(int(n) for n in d["lengths"])
            seconds = tuple(tuple(float(s) / 1e3 for s in row) for row in d["step_ms"])
            draft = tuple(float(s) / 1e3 for s in d["draft_ms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a step-time curve (batches, lengths, step_ms, draft_ms): {exc}") from None
        increasing = all(a < b for xs in (batches, lengths) for a, b in itertools.pairwise(xs))
        if not (batches and batches[0] >= 1 and len(lengths) >= 2 and lengths[0] == 1 and increasing):
            raise ValueError("a step-time curve's batches and lengths are increasing (lengths from 1)")
        if len(seconds) != len(batches) or len(draft) != len(batches):
            raise ValueError("a step-time curve has a step_ms row and a draft_ms value per batch")
        if any(len(row) != len(lengths) for row in seconds) or min(min(r) for r in (*seconds, draft)) < 0:
            raise ValueError("a step-time curve's step_ms rows have a value >= 0 per length")
        return cls(batches, lengths, seconds, draft)


def load_curve(path: Path) -> StepCurve:
    """A step-time curve from a JSON file (``[engine] step_curve``); ValueError naming the file."""
    try:
        return StepCurve.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def measure(
    forward: Callable[[list[StepSlice]], object],
    propose: Callable[[int], object],
    allocate: Callable[[int, int], tuple[list[int], list[list[int]]]],
    free: Callable[[list[int], list[list[int]]], None],
    max_batch: int,
    context: int = 64,
    repeats: int = 2,
) -> StepCurve:
    """Time ``forward`` on synthetic slices. allocate(B, tokens) -> (slots, block tables) for B
    sequences of ``tokens`` positions; free gives them back; propose(B) runs the draft for B
    sequences. The cache those slices write is garbage, freed before any request uses it."""
    batches = tuple(b for b in BATCHES if b <= max_batch) or (1,)
    gen = torch.Generator().manual_seed(0)
    seconds, draft = [], []
    for b in batches:
        slots, tables = allocate(b, context + max(LENGTHS))
        forward(_slices(slots, tables, gen, 0, context, False))
        row: list[float] = []
        for n in LENGTHS:
            batch = _slices(slots, tables, gen, context, n, True)
            # a step of more tokens is never faster: noise must not make drafts look free
            row.append(max(_best(lambda batch=batch: forward(batch), repeats), row[-1] if row else 0.0))
        seconds.append(tuple(row))
        draft.append(_best(lambda b=b: propose(b), repeats))
        free(slots, tables)
    return StepCurve(batches, LENGTHS, tuple(seconds), tuple(draft))


def _slices(
    slots: list[int], tables: list[list[int]], gen: torch.Generator, start: int, n: int, sample: bool
) -> list[StepSlice]:
    ids = torch.randint(100, 1000, (len(slots), n), generator=gen).tolist()
    return [
        StepSlice(s, t, start, ids[j], 0, sample, num_logits=n if sample else 1)
        for j, (s, t) in enumerate(zip(slots, tables, strict=True))
    ]


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
