"""DenseRunner: a full-attention family's forward (Llama) over paged Block KV.

The same door as :class:`dsi.engine.runner.ModelRunner` (``pool``, ``slots``, ``forward``), so
the scheduler, admission, export / import and page hashing run unchanged. A step's slices run as
one block of rows [T, H] (back to back; padded with zero rows to a multiple of the products'
``row_tile`` where they run in row tiles, so that no product pads again). Per layer, each row's rotated key and
value go into the pages (layout in :mod:`dsi.kvcache.layout_dense`) and every row attends over
the positions 0 .. its own of its sequence, read from the pages::

    rows --norm--> [q | k | v] (one product) --rope(q, k)--> K, V -> pages[table[p // 128], layer, k|v, p % 128]
    row at position p: query x keys/values of positions 0 .. p         (:mod:`dsi.engine.attention_dense`)
    --o--> + x --norm--> [gate | up] (one product) --silu(gate) * up--down--> + x

A state slot holds nothing for this family (no SWA ring, no compressor), and there are no
ring snapshots. Dense math is :mod:`dsi.model.llama`'s (fused weights from
:func:`dsi.model.llama.fuse_projections`, the rope of :mod:`dsi.model.ops` with its angles
computed once per step). Products run through :class:`dsi.engine.gemm.PackedGemm` (weights
packed once, for dsi's C product kernel or else oneDNN); attention is one call per layer for the whole step. Each row's attention
is computed on its own and a product's row does not depend on the others (``batch_invariant``),
so a token's logits are the same bits whatever else the step holds and however its prompt was
chunked. The logits product runs only for the rows that sample.
"""

from __future__ import annotations

import torch

from dsi.engine.attention_dense import paged_rows, step_rows
from dsi.engine.batch import StepSlice
from dsi.engine.gemm import PackedGemm
from dsi.engine.workspace import Workspace
from dsi.kernels import row_ops
from dsi.kvcache.block_pool import BlockPool
from dsi.kvcache.layout_dense import DenseBlockLayout
from dsi.kvcache.state_slots import StateSlots
from dsi.model.llama import LlamaConfig, fuse_projections
from dsi.model.ops import rope_angles

_PRODUCTS = ("wqkv", "wo", "w_gate_up", "w_down")  # per-layer weights of x @ w products


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
        self.w = fuse_projections(cfg, weights)
        products = [self.w[f"layers.{i}.{name}"] for i in range(cfg.n_layers) for name in _PRODUCTS]
        self.mm = PackedGemm([*products, self.w["lm_head"].T], batch_invariant)
        self.layout = DenseBlockLayout(cfg)
        self.pool = BlockPool(num_blocks, self.layout.elems)
        self.slots = StateSlots(cfg, num_slots)  # empty: rings of length 0, no partial rows
        self._kv = self.layout.kv_view(self.pool.pages)  # [N, L, 2, block_size, Hkv, D]
        self.attend = paged_rows(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, batch_invariant, cfg.max_context)
        self.ws = Workspace()  # the layers' activations, reused from layer to layer and step to step

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
        A speculative verify slice needs nothing of its own: each of its rows attends over the
        positions up to its own, like any other row."""
        cfg, w = self.cfg, self.w
        tokens = [t for s in batch for t in s.tokens]
        tile = self.mm.row_tile
        rows = -(-len(tokens) // tile) * tile
        where = step_rows(batch, cfg.block_size, rows)
        plan = self.attend.prepare(batch, where)
        cos, sin = rope_angles(where.pos.clamp(min=0), cfg.head_dim, cfg.rope_theta)
        x = w["embed"][torch.tensor(tokens + [0] * (rows - len(tokens)), dtype=torch.long)]
        if rows > len(tokens):
            x[len(tokens) :] = 0.0
        for i in range(cfg.n_layers):
            x = self._layer(i, x, cos, sin, plan)
        last = self._sampled_rows(batch)
        if hidden is not None:
            hidden.append(x[last])
        return self.mm(self._norm(x[last], w["final_norm"]), w["lm_head"].T)

    def _layer(
        self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: object
    ) -> torch.Tensor:
        """Layer i over the step's rows x [T, H] -> x, updated in place; cos, sin [T, 1, D/2] of
        the rows' positions; ``plan``: what ``self.attend.prepare`` made of the step. The
        activations live in ``self.ws``'s buffers (a product's output is new memory otherwise,
        page faults and all)."""
        cfg, w, p, ws = self.cfg, self.w, f"layers.{i}.", self.ws
        t, h, hq, hkv, d = x.shape[0], x.shape[1], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        wqkv, wo, wgu, wdown = w[p + "wqkv"], w[p + "wo"], w[p + "w_gate_up"], w[p + "w_down"]
        normed = self._norm(x, w[p + "attn_norm"], ws.rows("norm", t, h))
        qkv = self.mm(normed, wqkv, ws.rows("qkv", t, wqkv.shape[1]))  # [T, (Hq + 2 Hkv) D]
        row_ops.rope_(qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d), cos, sin)  # q and k, in place
        q, k, v = qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d : (hq + hkv) * d], qkv[:, (hq + hkv) * d :]
        x.add_(self.mm(self.attend(self._kv[:, i], q, k, v, plan), wo, ws.rows("proj", t, h)))
        normed = self._norm(x, w[p + "ffn_norm"], ws.rows("norm", t, h))
        gate_up = self.mm(normed, wgu, ws.rows("gate_up", t, wgu.shape[1]))  # [T, 2F]
        act = row_ops.silu_mul(gate_up, out=ws.rows("act", t, wgu.shape[1] // 2))
        return x.add_(self.mm(act, wdown, ws.rows("proj", t, h)))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of rows x [T, H], each row on its own (the formula of :func:`dsi.model.ops.rms_norm`);
        ``out``: a buffer of [T, H] for the result."""
        return row_ops.rms_norm(x, weight, self.cfg.norm_eps, out=out)

    @staticmethod
    def _sampled_rows(batch: list[StepSlice]) -> list[int]:
        """Rows of the last ``num_logits`` positions of each slice that samples."""
        out, end = [], 0
        for s in batch:
            end += len(s.tokens)
            if s.sample:
                out.extend(range(end - s.num_logits, end))
        return out
