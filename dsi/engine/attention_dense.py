"""Attention of a dense family's step over its Block KV pages: every row of the step in one call.

The runner computes a step's hidden rows [T, H] together (slices back to back, then padding rows
up to a multiple of ``ROW_TILE`` on the batch-invariant path). :func:`step_rows` says where each
row sits; per layer, :meth:`PagedRows.__call__` writes the rows' new keys and values into the
pages and returns every row's attention output::

    row r: sequence seq[r] at position pos[r]  ->  attends positions 0 .. pos[r] (causal)
    K, V of row r  -> pages[page[r], layer, k|v, off[r]]   (page -1: a loaded position or padding)

:class:`PagedRows` runs :func:`dsi.kernels.paged_attention.paged_attention` (a C kernel, each
query on its own: the same bits in any batch and any chunking; the rows shared among the
threads of :mod:`dsi.kernels.thread_pool`). Where that kernel cannot be built
or has no variant for the head shape, :class:`TorchPagedRows` gives the same answers to fp32
rounding with torch: one-token slices through :func:`dsi.engine.invariant.attend_pages`, longer
slices one by one through :func:`dsi.engine.invariant.attend_chunk` (or plain causal attention
when the runner is not batch-invariant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.engine import invariant
from dsi.engine.batch import StepSlice
from dsi.kernels import paged_attention as native
from dsi.kernels import thread_pool
from dsi.kvcache.block_pool import NULL_BLOCK
from dsi.model.llama import causal_attend


@dataclass(slots=True, frozen=True)
class StepRows:
    """Where the rows of a step sit (T rows, padding included; S slices).

    pos [T]: each row's position, -1 for padding. seq [T]: its slice (a row of ``tables``).
    tables [S, W]: block tables padded with the null page. page, off [T]: where the row's K/V
    entry goes; page -1 where nothing is written (a loaded position, or padding). All int64."""

    pos: torch.Tensor
    seq: torch.Tensor
    tables: torch.Tensor
    page: torch.Tensor
    off: torch.Tensor


def step_rows(batch: list[StepSlice], block_size: int, rows: int) -> StepRows:
    """The rows of ``batch`` (slices back to back), padded to ``rows``."""
    pos, seq, page, off = [], [], [], []
    for j, s in enumerate(batch):
        for p in range(s.start, s.end):
            pos.append(p)
            seq.append(j)
            written = p >= s.cached_end  # entries below cached_end were loaded and stay as they are
            page.append(s.block_table[p // block_size] if written else -1)
            off.append(p % block_size)
    pad = rows - len(pos)
    width = max(len(s.block_table) for s in batch)
    tables = [s.block_table + [NULL_BLOCK] * (width - len(s.block_table)) for s in batch]
    return StepRows(
        pos=torch.tensor(pos + [-1] * pad),
        seq=torch.tensor(seq + [0] * pad),
        tables=torch.tensor(tables, dtype=torch.long),
        page=torch.tensor(page + [-1] * pad),
        off=torch.tensor(off + [0] * pad),
    )


SHARED_ROWS = 8  # rows below which a thread's share of the attention is not worth a hand-off


class PagedRows:
    """The C kernel's attention: write the rows' K/V, then attend the rows, shared among the
    threads of :mod:`dsi.kernels.thread_pool` when there are at least 2 x SHARED_ROWS of them
    (a row's result depends on its own query, pages and position only: the same bits)."""

    def prepare(self, batch: list[StepSlice], rows: StepRows) -> StepRows:
        return rows

    def __call__(
        self, kv_layer: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: StepRows
    ) -> torch.Tensor:
        """kv_layer [num_blocks, 2, block, Hkv, D]; q [T, Hq, D]; k, v [T, Hkv * D] -> [T, Hq * D]."""
        native.write_kv(kv_layer, k, v, plan.page, plan.off)
        parts = max(1, min(thread_pool.threads(), q.shape[0] // SHARED_ROWS))
        return native.paged_attention(q, kv_layer, plan.tables, plan.seq, plan.pos, threads=parts)

    @staticmethod
    def supports(n_heads: int, n_kv_heads: int, head_dim: int) -> bool:
        return native.supports(n_heads // n_kv_heads, head_dim)


@dataclass(slots=True, frozen=True)
class _TorchPlan:
    rows: StepRows
    decode: list[int]  # rows of one-token slices (no loaded entry)
    chunks: list[tuple[int, int, StepSlice]]  # (first row, end row, slice) of the other slices


class TorchPagedRows:
    """The torch path: batched :func:`~dsi.engine.invariant.attend_pages` for one-token slices,
    one call per longer slice."""

    def __init__(self, batch_invariant: bool, max_context: int) -> None:
        self.invariant = batch_invariant
        self.window = max_context + 1  # longer than any context: full attention

    def prepare(self, batch: list[StepSlice], rows: StepRows) -> _TorchPlan:
        decode, chunks, a = [], [], 0
        for s in batch:
            b = a + len(s.tokens)
            if len(s.tokens) == 1 and s.cached_end <= s.start:
                decode.append(a)
            else:
                chunks.append((a, b, s))
            a = b
        return _TorchPlan(rows, decode, chunks)

    def __call__(
        self, kv_layer: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _TorchPlan
    ) -> torch.Tensor:
        native.write_kv_reference(kv_layer, k, v, plan.rows.page, plan.rows.off)
        out = torch.zeros(q.shape[0], q.shape[1] * q.shape[2])
        rows, block = plan.rows, kv_layer.shape[2]
        if plan.decode:
            at = torch.tensor(plan.decode)
            out[at] = invariant.attend_pages(q[at], kv_layer, rows.tables[rows.seq[at]], rows.pos[at])
        for a, b, s in plan.chunks:
            at = torch.arange(s.end)
            table = torch.tensor(s.block_table, dtype=torch.long)
            keys = kv_layer[table[at // block], 0, at % block]  # [end, Hkv, D]
            vals = kv_layer[table[at // block], 1, at % block]
            if self.invariant:
                out[a:b] = invariant.attend_chunk(
                    q[a:b], q[a:b], s.start, keys, vals, 0, 0, None, None, self.window
                )
            else:
                out[a:b] = causal_attend(q[a:b], torch.arange(s.start, s.end), keys, vals, at)
        return out


def paged_rows(n_heads: int, n_kv_heads: int, head_dim: int, batch_invariant: bool, max_context: int):
    """The C kernel's attention where it serves this head shape, else the torch path."""
    if PagedRows.supports(n_heads, n_kv_heads, head_dim):
        return PagedRows()
    return TorchPagedRows(batch_invariant, max_context)
