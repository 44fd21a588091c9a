"""DenseRunner: a full-attention family's forward (Llama) over paged Block KV.

The same door as :class:`dsi.engine.runner.ModelRunner` (``pool``, ``slots``, ``forward``), so
the scheduler, admission, export / import and page hashing run unchanged. Each layer writes the
step's rotated keys and values into the pages (layout in :mod:`dsi.kvcache.layout_dense`), then
each slice attends over every position ``[0, end)`` of its sequence, gathered from its pages::

    step tokens --qkv--> K, V --scatter--> pages[table[p // 128], layer, k|v, p % 128]
    slice [start, end): queries  x  keys/values of positions 0 .. end - 1 (causal mask)

A state slot holds nothing for this family (no SWA ring, no compressor), and there are no
ring snapshots. Dense math comes from :mod:`dsi.model.llama`, the same functions as its naive
reference. Products run through :class:`dsi.engine.gemm.PackedGemm` (weights packed once for
oneDNN; rows padded with ``batch_invariant``); a prefill chunk attends through
:func:`dsi.engine.invariant.attend_chunk` (a window longer than the context) and the step's
one-token slices through one :func:`dsi.engine.invariant.attend_pages` per layer, which gives
each query the same bits. So a token's logits are the same bits whatever else the step holds and
however its prompt was chunked.
"""

from __future__ import annotations

import torch

from dsi.engine import invariant
from dsi.engine.batch import StepSlice
from dsi.engine.gemm import PackedGemm
from dsi.kvcache.block_pool import NULL_BLOCK, BlockPool
from dsi.kvcache.layout_dense import DenseBlockLayout
from dsi.kvcache.state_slots import StateSlots
from dsi.model.llama import LlamaConfig, causal_attend, finish_layer, qkv
from dsi.model.ops import Matmul, rms_norm

_PRODUCTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # weights of x @ w products


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
        self.w = weights
        products = [w for name, w in weights.items() if name.rsplit(".", 1)[-1] in _PRODUCTS]
        self.mm: Matmul = PackedGemm([*products, weights["lm_head"].T], batch_invariant)
        self.layout = DenseBlockLayout(cfg)
        self.pool = BlockPool(num_blocks, self.layout.elems)
        self.slots = StateSlots(cfg, num_slots)  # empty: rings of length 0, no partial rows
        self._kv = self.layout.kv_view(self.pool.pages)  # [N, L, 2, block_size, Hkv, D]

    def rollback(self, slot: int, end: int) -> None:
        """After a speculative verify slice: positions >= ``end`` were rejected. Nothing to put
        back: their page entries are overwritten when those positions are computed again, and the
        scheduler gives back the pages only they used."""

    @torch.no_grad()
    def forward(
        self, batch: list[StepSlice], snapshots: dict | None = None, hidden: list | None = None
    ) -> torch.Tensor:
        """Logits [sum of num_logits over the sampled slices, V] in batch order of the slices with
        ``sample`` (each slice's rows in position order). ``snapshots`` is accepted for the door's
        sake and stays empty (no SWA rings). ``hidden``: a list that gets the last layer's output
        of the same rows ([rows, H], before the final norm), what a speculative draft is fed with.

        One-token slices (decodes) and speculative verify slices are done together: one scatter
        of their new keys and values and one batched attention per layer, a row per token
        (:func:`dsi.engine.invariant.attend_pages`, the bits of the per-slice path); other
        slices (prefill chunks) go one by one."""
        cfg, w = self.cfg, self.w
        ids = torch.tensor([t for s in batch for t in s.tokens], dtype=torch.long)
        pos = torch.cat([torch.arange(s.start, s.end) for s in batch])
        spans, a = [], 0
        for s in batch:
            spans.append((a, a + len(s.tokens)))
            a += len(s.tokens)
        one = [i for i, s in enumerate(batch) if _batched(s)]
        chunks = sorted(set(range(len(batch))) - set(one))
        where = {i: self._locations(batch[i]) for i in chunks}
        decode = self._decode_rows([batch[i] for i in one], [spans[i][0] for i in one])
        x = w["embed"][ids]
        for i in range(cfg.n_layers):
            q, k, v = qkv(cfg, w, i, x, pos, self.mm)
            out = torch.empty(x.shape[0], cfg.n_heads * cfg.head_dim)
            if decode is not None:
                rows, pages, offs, tables, dpos = decode
                self._kv[pages, i, 0, offs] = k[rows]
                self._kv[pages, i, 1, offs] = v[rows]
                out[rows] = invariant.attend_pages(q[rows], self._kv[:, i], tables, dpos)
            for j in chunks:
                s, (a, b), (pages, offs) = batch[j], spans[j], where[j]
                self._write(i, s, pages, offs, k[a:b], v[a:b])
                keys, vals = self._kv[pages, i, 0, offs], self._kv[pages, i, 1, offs]  # [end, Hkv, D]
                out[a:b] = self._attend(q[a:b], s.start, keys, vals)
            x = finish_layer(cfg, w, i, x, out, self.mm)
        last = [
            r for s, (_a, b) in zip(batch, spans, strict=True) if s.sample for r in range(b - s.num_logits, b)
        ]
        if hidden is not None:
            hidden.append(x[last])
        h = rms_norm(x[last], w["final_norm"], cfg.norm_eps)
        return self.mm(h, w["lm_head"].T)

    def _decode_rows(
        self, slices: list[StepSlice], rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """For batched slices whose first tokens sit at step rows ``rows``, a row per token (n of
        them): (step rows [n], page [n] and offset [n] of each new position, block tables [n, W]
        padded with the null page, positions [n]); None if none."""
        if not slices:
            return None
        bs = self.cfg.block_size
        width = max(len(s.block_table) for s in slices)
        per = [s.block_table + [NULL_BLOCK] * (width - len(s.block_table)) for s in slices]
        n = [len(s.tokens) for s in slices]
        tables = torch.tensor([t for t, k in zip(per, n, strict=True) for _ in range(k)])
        dpos = torch.tensor([p for s in slices for p in range(s.start, s.end)])
        step_rows = torch.tensor([r + j for r, k in zip(rows, n, strict=True) for j in range(k)])
        pages = tables.gather(1, (dpos // bs)[:, None])[:, 0]
        return step_rows, pages, dpos % bs, tables, dpos

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


def _batched(s: StepSlice) -> bool:
    """A slice that joins the batched attention: a one-token decode, or a speculative verify
    slice (its last token and drafts, every position's logits wanted), nothing of it cached.
    Its queries see their own keys because every row's keys are written before attention."""
    return s.cached_end <= s.start and (len(s.tokens) == 1 or (s.sample and s.num_logits == len(s.tokens)))
