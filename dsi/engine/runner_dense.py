"""DenseRunner: a full-attention family's forward (Llama) over paged Block KV.

The same door as :class:`dsi.engine.runner.ModelRunner` (``pool``, ``slots``, ``forward``), so
the scheduler, admission, export / import and page hashing run unchanged. Each layer writes the
step's rotated keys and values into the pages (layout in :mod:`dsi.kvcache.layout_dense`), then
each slice attends over every position ``[0, end)`` of its sequence, gathered from its pages::

    step tokens --qkv--> K, V --scatter--> pages[table[p // 128], layer, k|v, p % 128]
    slice [start, end): queries  x  keys/values of positions 0 .. end - 1 (causal mask)

A state slot holds nothing for this family (no SWA ring, no compressor), and there are no
ring snapshots. Dense math comes from :mod:`dsi.model.llama`, the same functions as its naive
reference; with ``batch_invariant`` products go through :func:`dsi.engine.invariant.mm` and
attention through :func:`dsi.engine.invariant.attend_chunk` (a window longer than the context),
so a token's logits are the same bits whatever else the step holds and however its prompt was
chunked.
"""

from __future__ import annotations

import torch

from dsi.engine import invariant
from dsi.engine.batch import StepSlice
from dsi.kvcache.block_pool import BlockPool
from dsi.kvcache.layout_dense import DenseBlockLayout
from dsi.kvcache.state_slots import StateSlots
from dsi.model.llama import LlamaConfig, causal_attend, finish_layer, qkv
from dsi.model.ops import Matmul, rms_norm


class DenseRunner:
    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict[str, torch.Tensor],
        num_blocks: int,
        num_slots: int,
        batch_invariant: bool = True,
    ) -> None:
        self.cfg = cfg
        self.invariant = batch_invariant
        self.mm: Matmul = invariant.mm if batch_invariant else torch.matmul
        self.w = weights
        self.layout = DenseBlockLayout(cfg)
        self.pool = BlockPool(num_blocks, self.layout.elems)
        self.slots = StateSlots(cfg, num_slots)  # empty: rings of length 0, no partial rows
        self._kv = self.layout.kv_view(self.pool.pages)  # [N, L, 2, block_size, Hkv, D]

    @torch.no_grad()
    def forward(self, batch: list[StepSlice], snapshots: dict | None = None) -> torch.Tensor:
        """Logits [num sampled slices, V] in batch order of the slices with ``sample``.
        ``snapshots`` is accepted for the door's sake and stays empty (no SWA rings)."""
        cfg, w = self.cfg, self.w
        ids = torch.tensor([t for s in batch for t in s.tokens], dtype=torch.long)
        pos = torch.cat([torch.arange(s.start, s.end) for s in batch])
        spans, a = [], 0
        for s in batch:
            spans.append((a, a + len(s.tokens)))
            a += len(s.tokens)
        where = [self._locations(s) for s in batch]
        x = w["embed"][ids]
        for i in range(cfg.n_layers):
            q, k, v = qkv(cfg, w, i, x, pos, self.mm)
            out = torch.empty(x.shape[0], cfg.n_heads * cfg.head_dim)
            for s, (a, b), (pages, offs) in zip(batch, spans, where, strict=True):
                if a == b:
                    continue
                self._write(i, s, pages, offs, k[a:b], v[a:b])
                keys, vals = self._kv[pages, i, 0, offs], self._kv[pages, i, 1, offs]  # [end, Hkv, D]
                out[a:b] = self._attend(q[a:b], s.start, keys, vals)
            x = finish_layer(cfg, w, i, x, out, self.mm)
        last = [b - 1 for s, (_a, b) in zip(batch, spans, strict=True) if s.sample]
        h = rms_norm(x[last], w["final_norm"], cfg.norm_eps)
        return self.mm(h, w["lm_head"].T)

    def _locations(self, s: StepSlice) -> tuple[torch.Tensor, torch.Tensor]:
        """(page [end], offset [end]) of every position 0 .. s.end - 1 of the slice's sequence."""
        p = torch.arange(s.end)
        table = torch.tensor(s.block_table, dtype=torch.long)
        return table[p // self.cfg.block_size], p % self.cfg.block_size

    def _write(
        self,
        layer: int,
        s: StepSlice,
        pages: torch.Tensor,
        offs: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """K, V of positions [start, end) into the pages; loaded (cached) positions stay as they are."""
        skip = min(max(0, s.cached_end - s.start), len(s.tokens))
        rows = torch.arange(s.start + skip, s.end)
        self._kv[pages[rows], layer, 0, offs[rows]] = k[skip:]
        self._kv[pages[rows], layer, 1, offs[rows]] = v[skip:]

    def _attend(self, q: torch.Tensor, first: int, keys: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        """Queries [T, Hq, D] at positions first .. first + T - 1 over keys of positions 0 .. Tk - 1."""
        if self.invariant:
            return invariant.attend_chunk(q, q, first, keys, vals, 0, 0, None, None, self.cfg.max_context + 1)
        t, tk = q.shape[0], keys.shape[0]
        return causal_attend(q, torch.arange(first, first + t), keys, vals, torch.arange(tk))
