"""Gemma3Runner: the Gemma 3 forward over paged Block KV (global layers) and SWA rings (sliding
layers).

The same door as :class:`dsi.engine.runner.ModelRunner` (``pool``, ``slots``, ``forward``), so
the scheduler, admission, export / import, page hashing, prefix hits and ring snapshots run
unchanged. Per layer type::

    global layer  (K, V) --scatter--> pages[table[p // 128], rank, k|v, p % 128]
                  slice [start, end) attends over positions 0 .. end - 1, gathered from its pages
    sliding layer slice [start, end) attends over ring keys of [max(R, start - window + 1), start)
                  + its own keys; then the newest `ring = window + 6` positions go into the ring

``rank``: the layer's index among the global (pages) or sliding (ring) layers. Loaded (cached)
page entries, positions below ``cached_end`` = H, are never written; the sliding keys of a
bounded replay start at ``producer_start`` = R. The math is that of :mod:`dsi.model.gemma3`,
the same functions as the naive reference :mod:`dsi.model.gemma3_reference`. Products, the
262K-column output projection included, run through :class:`dsi.engine.gemm.PackedGemm` (weights
packed once for oneDNN; rows padded with ``batch_invariant``). Attention runs the C kernel of
:mod:`dsi.engine.attention_v4` where it is built (a query from its own key list in one fixed
order, in either mode), else the torch paths: a prefill chunk attends per slice
through :func:`dsi.engine.invariant.attend_chunk`; the step's one-token slices (decodes) attend
together, one :func:`dsi.engine.invariant.attend_pages` per global layer and one
:func:`dsi.engine.invariant.attend_decode` per sliding layer, which give each query the bits of
the per-slice path. So a token's logits are the same bits whatever else the step holds and
however its prompt was chunked. Logits are computed only for the rows asked for: the last
``num_logits`` positions of each slice with ``sample``.

Ring snapshots (``forward(..., snapshots={})``): a slice that reaches a block boundary B (the
last one when several) records every sliding layer's keys and values of [B - window, B), as
they are when position B - 1 is computed (positions below 0 are zeros). Only when those keys
are real: B - window >= R, or the request replays nothing (R = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.engine import invariant
from dsi.engine.attention_v4 import NativeAttention, usable
from dsi.engine.batch import StepSlice
from dsi.engine.gemm import PackedGemm
from dsi.engine.prefix import ring_snapshot_shape
from dsi.kvcache.block_pool import NULL_BLOCK, BlockPool
from dsi.kvcache.layout_dense import DenseBlockLayout
from dsi.kvcache.state_slots import StateSlots
from dsi.model.gemma3 import Gemma3Config, embed, finish_layer, logits_of, qkv
from dsi.model.ops import Matmul, attend

Snapshots = dict[int, tuple[int, torch.Tensor]]  # slice index -> (B, [n_sliding, 2, window, Hkv, D])

_PRODUCTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # weights of x @ w products


@dataclass(slots=True, frozen=True)
class _Decode:
    """The step's one-token slices, attended together. All [B] but ``tables`` [B, W] (block
    tables padded with the null page)."""

    rows: torch.Tensor  # step rows
    pos: torch.Tensor  # positions of the new tokens
    page: torch.Tensor  # page of each new position
    off: torch.Tensor  # offset of each new position in its page
    tables: torch.Tensor
    slots: torch.Tensor  # state slots (SWA rings)
    swa_start: torch.Tensor  # producer_start: sliding keys below it are not seen


class Gemma3Runner:
    def __init__(
        self,
        cfg: Gemma3Config,
        weights: dict[str, torch.Tensor],
        num_blocks: int,
        num_slots: int,
        batch_invariant: bool = True,
    ) -> None:
        self.cfg = cfg
        self.invariant = batch_invariant
        self.w = weights
        products = [w for name, w in weights.items() if name.rsplit(".", 1)[-1] in _PRODUCTS]
        self.mm: Matmul = PackedGemm([*products, weights["embed"].T], batch_invariant)
        self.layout = DenseBlockLayout(cfg)
        self.pool = BlockPool(num_blocks, self.layout.elems)
        self.slots = StateSlots(cfg, num_slots)  # rings [slots, n_sliding, 2, window + 6, Hkv, D]
        self._kv = self.layout.kv_view(self.pool.pages)  # [N, n_global, 2, block_size, Hkv, D]
        self._rank = {
            layer: j for kind in (cfg.full_layers, cfg.sliding_layers) for j, layer in enumerate(kind)
        }
        # The C kernel's attention where it is built (same bits in any batch and chunk, either
        # mode): sliding layers over their window, global layers over every position.
        self._native = None
        if usable(cfg.head_dim, self.slots.rings.dtype, None):
            self._native = (NativeAttention(cfg.window), NativeAttention(cfg.max_context + 1))

    @torch.no_grad()
    def forward(self, batch: list[StepSlice], snapshots: Snapshots | None = None) -> torch.Tensor:
        """Logits [sum of num_logits over the sampled slices, V], in batch order of the slices with
        ``sample`` (each slice's rows in position order).
        ``snapshots``: filled with the ring snapshots of the slices that reach a block boundary."""
        cfg, w = self.cfg, self.w
        ids = torch.tensor([t for s in batch for t in s.tokens], dtype=torch.long)
        pos = torch.cat([torch.arange(s.start, s.end) for s in batch])
        spans, a = [], 0
        for s in batch:
            spans.append((a, a + len(s.tokens)))
            a += len(s.tokens)
        one = [j for j, s in enumerate(batch) if self._decodes(j, s, snapshots)]
        chunks = sorted(set(range(len(batch))) - set(one))
        where = {j: self._locations(batch[j]) for j in chunks}
        dec = self._decode_index([batch[j] for j in one], [spans[j][0] for j in one])
        x = embed(cfg, w, ids)
        for i in range(cfg.n_layers):
            q, k, v = qkv(cfg, w, i, x, pos, self.mm)
            out = torch.empty(x.shape[0], cfg.n_heads * cfg.head_dim)
            if dec is not None:
                out[dec.rows] = self._decode_attend(i, dec, q[dec.rows], k[dec.rows], v[dec.rows])
            for j in chunks:
                s, (a, b) = batch[j], spans[j]
                if a == b:
                    continue
                if cfg.sliding[i]:
                    out[a:b] = self._sliding(i, j, s, q[a:b], k[a:b], v[a:b], snapshots)
                else:
                    out[a:b] = self._global(i, s, *where[j], q[a:b], k[a:b], v[a:b])
            x = finish_layer(cfg, w, i, x, out, self.mm)
        rows = [
            r for s, (_a, b) in zip(batch, spans, strict=True) if s.sample for r in range(b - s.num_logits, b)
        ]
        if any(s.sample and len(s.tokens) < s.num_logits for s in batch):
            raise ValueError("a sampled slice asks for the logits of more positions than it computes")
        return logits_of(cfg, w, x[rows], self.mm)

    # ---- one-token slices: attended together ---------------------------------------------------
    def _decodes(self, j: int, s: StepSlice, snapshots: Snapshots | None) -> bool:
        """Whether slice j goes with the step's decodes: one new (not loaded) token, and no ring
        snapshot to take (a slice that reaches a block boundary takes the per-slice path)."""
        if len(s.tokens) != 1 or s.cached_end > s.start:
            return False
        return snapshots is None or not self._boundary(s)

    def _decode_index(self, slices: list[StepSlice], rows: list[int]) -> _Decode | None:
        if not slices:
            return None
        bs = self.cfg.block_size
        width = max(len(s.block_table) for s in slices)
        tables = torch.tensor([s.block_table + [NULL_BLOCK] * (width - len(s.block_table)) for s in slices])
        pos = torch.tensor([s.start for s in slices])
        page = tables.gather(1, (pos // bs)[:, None])[:, 0]
        return _Decode(
            torch.tensor(rows),
            pos,
            page,
            pos % bs,
            tables,
            torch.tensor([s.slot for s in slices]),
            torch.tensor([s.producer_start for s in slices]),
        )

    def _decode_attend(
        self, i: int, d: _Decode, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Layer i for the one-token slices: q [B, Hq, D], k, v [B, Hkv, D] -> [B, Hq * D]; the new
        keys and values go into the pages (global) or rings (sliding)."""
        r = self._rank[i]
        if not self.cfg.sliding[i]:
            self._kv[d.page, r, 0, d.off] = k
            self._kv[d.page, r, 1, d.off] = v
            if self._native is not None:
                return self._native[1].pages(q, self._kv[:, r], d.tables, d.pos)
            return invariant.attend_pages(q, self._kv[:, r], d.tables, d.pos)
        rings = self.slots.rings[:, r]  # [slots, 2, ring, Hkv, D]: window + rollback positions
        at = d.pos % self.cfg.ring
        rings[d.slots, 0, at], rings[d.slots, 1, at] = k, v  # overwrites no key of the window
        if self._native is not None:
            return self._native[0].decode(q, q, rings, d.slots, d.pos, d.swa_start, None)
        return invariant.attend_decode(self.cfg, q, q, rings, d.slots, d.pos, d.swa_start, None, None, None)

    # ---- global layers: Block KV pages ---------------------------------------------------------
    def _locations(self, s: StepSlice) -> tuple[torch.Tensor, torch.Tensor]:
        """(page [end], offset [end]) of every position 0 .. s.end - 1 of the slice's sequence."""
        p = torch.arange(s.end)
        table = torch.tensor(s.block_table, dtype=torch.long)
        return table[p // self.cfg.block_size], p % self.cfg.block_size

    def _global(
        self,
        i: int,
        s: StepSlice,
        pages: torch.Tensor,
        offs: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        """Write K, V of [start, end) (loaded positions stay as they are), attend over [0, end)."""
        r = self._rank[i]
        skip = min(max(0, s.cached_end - s.start), len(s.tokens))
        rows = torch.arange(s.start + skip, s.end)
        self._kv[pages[rows], r, 0, offs[rows]] = k[skip:]
        self._kv[pages[rows], r, 1, offs[rows]] = v[skip:]
        keys, vals = self._kv[pages, r, 0, offs], self._kv[pages, r, 1, offs]  # [end, Hkv, D]
        everything = self.cfg.max_context + 1
        if self._native is not None:
            return self._native[1].chunk(q, q, s.start, keys, vals, 0, 0, None, None)
        if self.invariant:
            return invariant.attend_chunk(q, q, s.start, keys, vals, 0, 0, None, None, everything)
        qpos = torch.arange(s.start, s.end)
        return attend(q, q, qpos, keys, vals, torch.arange(s.end), 0, None, None, everything)

    # ---- sliding layers: SWA rings -------------------------------------------------------------
    def _sliding(
        self,
        i: int,
        j: int,
        s: StepSlice,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        snapshots: Snapshots | None,
    ) -> torch.Tensor:
        """Attend over the ring's window before the slice and the slice's own keys; snapshot;
        then write the slice's newest keys into the ring."""
        cfg, r = self.cfg, self._rank[i]
        ring = self.slots.rings[s.slot, r]  # [2, ring, Hkv, D]
        first = max(s.producer_start, s.start - cfg.window + 1)
        prev = torch.arange(first, s.start) % cfg.ring
        keys, vals = torch.cat([ring[0, prev], k]), torch.cat([ring[1, prev], v])
        if snapshots is not None:
            self._snapshot(r, j, s, keys, vals, first, snapshots)
        if self._native is not None:
            out = self._native[0].chunk(q, q, s.start, keys, vals, first, s.producer_start, None, None)
        elif self.invariant:
            out = invariant.attend_chunk(
                q, q, s.start, keys, vals, first, s.producer_start, None, None, cfg.window
            )
        else:
            qpos, kpos = torch.arange(s.start, s.end), torch.arange(first, s.end)
            out = attend(q, q, qpos, keys, vals, kpos, s.producer_start, None, None, cfg.window)
        n = min(len(s.tokens), cfg.ring)  # only the newest `ring` positions survive
        slots = torch.arange(s.end - n, s.end) % cfg.ring
        ring[0, slots], ring[1, slots] = k[-n:], v[-n:]
        return out

    def _boundary(self, s: StepSlice) -> int:
        """The last block boundary B the slice reaches (start < B <= end) whose window of keys is
        real, else 0."""
        bs = self.cfg.block_size
        b = s.end // bs * bs
        real = s.producer_start == 0 or b - self.cfg.snapshot_tokens >= s.producer_start
        return b if b > s.start and real else 0

    def _snapshot(
        self,
        r: int,
        j: int,
        s: StepSlice,
        keys: torch.Tensor,
        vals: torch.Tensor,
        first: int,
        snapshots: Snapshots,
    ) -> None:
        """``keys``/``vals``: the slice's sliding keys of positions [first, end) (ring, then own)."""
        b = self._boundary(s)
        if not b:
            return
        if j not in snapshots:
            snapshots[j] = (b, torch.zeros(ring_snapshot_shape(self.cfg), dtype=self.slots.rings.dtype))
        snap, lo = snapshots[j][1], b - self.cfg.snapshot_tokens  # positions [lo, b)
        skip = max(0, first - lo)  # positions below `first` are below 0 here: they stay zero
        snap[r, 0, skip:] = keys[lo + skip - first : b - first]
        snap[r, 1, skip:] = vals[lo + skip - first : b - first]
