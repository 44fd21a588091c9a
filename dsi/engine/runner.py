"""ModelRunner: the reference model's forward over paged Block KV and state slots.

One ``forward`` computes a step: a batch of StepSlices (prefill chunks and decode tokens mixed).
Dense work (projections, MoE, logits) runs over all tokens of the step at once; attention runs
per sequence over (SWA ring + this step's keys) and the latents gathered from its pages. It calls
the same ops as :mod:`dsi.model.reference`, so the results match the reference to fp32 rounding.

Ring snapshots (``forward(..., snapshots={})``): a slice whose positions reach a block boundary
B (the last one when several) records the producer SWA keys/values of [B - 128, B) as they are
when position B - 1 is computed::

    prefill chunk [s, e), s < B <= e:  ring[B - 128 .. s)  +  chunk keys [s .. B)   (before the ring write)
    decode token at B - 1:             ring[B - 128 .. B)                           (after the ring write)

Only when those keys are all real (B - 128 >= the slice's producer SWA start).

``moe_layer``: the MoE of each layer, by default computed here; an expert-parallel group
(``dsi.eplb``) passes its all-to-all MoE instead, a collective: then every layer calls it, also
with no rows, so the ranks of the group step together. The group's ranks share the pages and
state slots (``use_storage``) and split a step's slices between them (``last_hidden``).

``batch_invariant``: products and attention go through :mod:`dsi.engine.invariant`, so a token's
logits are the same bits whatever else the step holds and however its prompt was chunked.

Attention on the CPU (fp32, either mode) runs the C kernel of :mod:`dsi.engine.attention_v4`
where it is built: each query row from its own key lists, in one fixed order, so a token gets the
same bits as a decode slice of any batch and as a row of any chunk; and it is faster than the
torch paths (decode at batch 64 on the tiny shape: about 6 ms a step against 18-24 ms). Without a
compiler (or ``DSI_NATIVE_KERNELS=0``) the torch paths serve: :mod:`dsi.engine.invariant`'s blocks
when batch-invariant, plain attention otherwise.

Prefix hits loaded layer by layer (``StepSlice.hit_load``, :mod:`dsi.engine.hit_load`): before
each layer the forward waits until the page parts that layer reads are copied.

``device``: where the weights, pages and state slots live (:mod:`dsi.engine.device`).
``kernels``: the Triton kernels of the decode rows (attention over the ring and the pages, the
compressor), which :func:`dsi.engine.device.decode_kernels` picks on CUDA; None: the torch path.
With kernels a decode row's attention is computed by the kernel's fixed order, not the
batch-invariant blocks of a prefill chunk: a token's bits no longer match between a preempted
and an unpreempted run (they still do not depend on the other rows of the step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dsi.engine import invariant
from dsi.engine.attention_v4 import NativeAttention, usable
from dsi.engine.batch import StepSlice
from dsi.engine.decode_batch import DecodeIndex, attend_decode, build_index, gather_latents
from dsi.engine.device import DecodeKernels
from dsi.engine.gemm import PackedGemm
from dsi.engine.prefix import ring_snapshot_shape
from dsi.kernels import dense_gemm
from dsi.kvcache.block_pool import BlockPool
from dsi.kvcache.layout import BlockLayout
from dsi.kvcache.state_slots import StateSlots
from dsi.model.config import ModelConfig
from dsi.model.ops import Matmul, attend, compress_pairs, moe, rms_norm, rope

MoeLayer = Callable[[int, torch.Tensor], torch.Tensor]  # (layer, normalised x [T, H]) -> [T, H]
Snapshots = dict[
    int, tuple[int, torch.Tensor]
]  # slice index -> (B, [n_producer, 2, block_size, n_kv_heads, D])


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        num_blocks: int,
        num_slots: int,
        batch_invariant: bool = True,
        moe_layer: MoeLayer | None = None,
        device: torch.device | None = None,
        kernels: DecodeKernels | None = None,
    ) -> None:
        self.cfg = cfg
        self.invariant = batch_invariant
        self.mm: Matmul = invariant.mm if batch_invariant else torch.matmul
        self.w = weights if device is None else {k: v.to(device) for k, v in weights.items()}
        # The output projection reads the tied embedding as [H, V]: a contiguous copy of its
        # transpose (one more copy of the embedding), on which the logits product of 64 rows takes
        # about 20 % less time than on the transposed view, batch-invariant or not.
        self._head = self.w["embed"].T.contiguous()
        if batch_invariant and (device is None or device.type == "cpu") and kernels is None:
            self.mm = _native_products(self.w, self._head) or self.mm
        self.moe: MoeLayer = moe_layer or self._local_moe
        self._collective = moe_layer is not None
        self.kernels = kernels
        self.layout = BlockLayout(cfg)
        self.pool = BlockPool(num_blocks, self.layout.elems, device=device)
        self.slots = StateSlots(cfg, num_slots, device=device)
        # The C kernel's attention (same bits in any batch and chunk, either mode) where it is built
        # and serves the shape, else the torch paths below.
        native = kernels is None and usable(cfg.head_dim, self.slots.rings.dtype, device)
        self.native = NativeAttention(cfg.window) if native else None
        self._bind_views()
        # slot -> source -> (first position, [n, D] wc0 products) of its last verify slice
        self._open_pairs: dict[int, dict[int, tuple[int, torch.Tensor]]] = {}

    def _bind_views(self) -> None:
        pages = self.pool.pages
        self._src_views = [self.layout.source_view(pages, i) for i in range(len(self.cfg.kv_sources))]
        self._glob_view = self.layout.global_view(pages)

    def use_storage(self, pages: torch.Tensor, rings: torch.Tensor, partial: torch.Tensor) -> None:
        """Keep the pages and state slots in these tensors from now on (same shapes and dtypes:
        shared memory that the other ranks of an expert-parallel group map); what they hold
        becomes the cache."""
        self.pool.pages, self.slots.rings, self.slots.partial = pages, rings, partial
        self._bind_views()

    def rollback(self, slot: int, end: int) -> None:
        """After a verify slice: positions >= ``end`` were rejected. Their SWA ring entries and
        page entries are simply overwritten when those positions are computed again (the rings
        hold ``window + rollback`` positions, so no entry inside the window of a kept position
        was lost); only the compressor's open pair must be put back to position ``end - 1``."""
        kept = self._open_pairs.pop(slot, {})
        if end % 2 == 0:
            return  # the pair (end - 2, end - 1) is closed: no open partial state
        for src, (first, proj) in kept.items():
            self.slots.partial[slot, src] = proj[end - 1 - first]

    @torch.no_grad()
    def forward(
        self, batch: list[StepSlice], snapshots: Snapshots | None = None, hidden: list | None = None
    ) -> torch.Tensor:
        """Logits [sum of num_logits over the sampled slices, V], in batch order of the slices with
        ``sample`` (each slice's rows in position order).
        ``snapshots``: filled with the ring snapshots of the slices that reach a block boundary.
        ``hidden``: a list that gets the last layer's output of the same rows ([rows, H], before
        the final norm), what a speculative draft is fed with."""
        x = self.last_hidden(batch, snapshots)
        if hidden is not None:
            hidden.append(x)
        return self.logits(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Last-layer rows [N, H] -> logits [N, V]."""
        return self.mm(rms_norm(x, self.w["final_norm"], self.cfg.norm_eps), self._head)

    @torch.no_grad()
    def last_hidden(self, batch: list[StepSlice], snapshots: Snapshots | None = None) -> torch.Tensor:
        """The step's forward up to the last layer: [sum of num_logits over the sampled slices, H],
        the rows :meth:`forward` turns into logits (``batch`` must not be empty)."""
        cfg, w = self.cfg, self.w
        ids = torch.tensor([t for s in batch for t in s.tokens], dtype=torch.long)
        pos = torch.cat([torch.arange(s.start, s.end) for s in batch])
        spans = _spans([len(s.tokens) for s in batch])
        x = w["embed"][ids]
        for s, (a, _b) in zip(batch, spans, strict=True):
            for row, rows in s.embeds:  # image positions: the vision encoder's embeddings
                x[a + row : a + row + rows.shape[0]] = rows
        dec = self._decode_index(batch, spans, consumer=False)
        loads = [s.hit_load for s in batch if s.hit_load is not None]
        for i in range(cfg.n_producer):
            for load in loads:
                load.wait(i)
            x = self._layer(i, x, pos, batch, spans, dec, snapshots)
        g = self.mm(rms_norm(x, w["boundary.norm"], cfg.norm_eps), w["boundary.wg"])
        for s, (a, b) in zip(batch, spans, strict=True):
            if dec is None or len(s.tokens) != 1:
                self._write_global(s, g[a:b])
        if dec is not None:
            new = dec.pos >= dec.protect  # loaded (cached) entries stay as they are
            page = dec.tables.gather(1, (dec.pos // cfg.block_size)[:, None])[:, 0]
            self._glob_view[page[new], dec.pos[new] % cfg.block_size] = g[dec.rows[new]]
        # Consumer half: only positions >= consumer_start of each slice.
        keep_rows, c_batch, c_spans, offset = [], [], [], 0
        for s, (a, _b) in zip(batch, spans, strict=True):
            skip = min(max(0, s.consumer_start - s.start), len(s.tokens))
            keep_rows.append(torch.arange(a + skip, a + len(s.tokens)))
            n = len(s.tokens) - skip
            c_batch.append(
                StepSlice(
                    s.slot,
                    s.block_table,
                    s.start + skip,
                    s.tokens[skip:],
                    s.consumer_start,
                    s.sample,
                    s.producer_start,
                    s.cached_end,
                    num_logits=s.num_logits,
                )
            )
            c_spans.append((offset, offset + n))
            offset += n
        rows = torch.cat(keep_rows)
        xc, pc = x[rows], pos[rows]
        dec = self._decode_index(c_batch, c_spans, consumer=True)
        for i in range(cfg.n_producer, cfg.n_layers):
            for load in loads:
                load.wait(i)
            xc = self._layer(i, xc, pc, c_batch, c_spans, dec)
        last = [r for s, (_a, b) in zip(c_batch, c_spans, strict=True) if s.sample for r in _tail(b, s)]
        if any(s.sample and len(s.tokens) < s.num_logits for s in c_batch):
            raise ValueError("a sampled slice ends before consumer_start")
        return xc[last]

    # ---- one layer -----------------------------------------------------------------------------
    def _layer(
        self,
        i: int,
        x: torch.Tensor,
        pos: torch.Tensor,
        batch: list[StepSlice],
        spans: list[tuple[int, int]],
        dec: DecodeIndex | None,
        snapshots: Snapshots | None = None,
    ) -> torch.Tensor:
        """One layer over the step's tokens; one-token slices attend together through ``dec``."""
        cfg, w, p = self.cfg, self.w, f"layers.{i}."
        consumer = i >= cfg.n_producer
        t = x.shape[0]
        if t == 0:  # an expert-parallel rank takes part in the layer's all-to-alls with no rows
            return x + self.moe(i, x) if self._collective else x
        xn = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
        q = self.mm(xn, w[p + "wq"]).view(t, cfg.n_heads, cfg.head_dim)
        k = self.mm(xn, w[p + "wk"]).view(t, cfg.n_kv_heads, cfg.head_dim)
        v = self.mm(xn, w[p + "wv"]).view(t, cfg.n_kv_heads, cfg.head_dim)
        if i in cfg.kv_sources:
            src = cfg.kv_sources.index(i)
            for s, (a, b) in zip(batch, spans, strict=True):
                if dec is None or len(s.tokens) != 1:
                    self._compress(s, src, xn[a:b], w[p + "wc0"], w[p + "wc1"])
            if dec is not None:
                self._compress_decode(dec, src, xn[dec.rows], w[p + "wc0"], w[p + "wc1"])
        q_rot, k_rot = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        out = torch.empty(t, cfg.n_heads * cfg.head_dim)
        if dec is not None:
            out[dec.rows] = self._attend_decode(i, dec, q, q_rot, k_rot, v, consumer)
            if snapshots is not None:
                self._snapshot_decode(i, dec, batch, spans, snapshots)
        for j, (s, (a, b)) in enumerate(zip(batch, spans, strict=True)):
            if a == b or (dec is not None and b - a == 1):
                continue
            keys, vals, kpos = self._swa_keys(s, i, k_rot[a:b], v[a:b], consumer)
            if snapshots is not None:
                self._snapshot_chunk(i, j, s, keys, vals, int(kpos[0]), snapshots)
            lat, last = self._latents(s, i, consumer)
            swa_start = s.consumer_start if consumer else s.producer_start
            if self.native is not None:
                out[a:b] = self.native.chunk(
                    q[a:b], q_rot[a:b], s.start, keys, vals, int(kpos[0]), swa_start, lat, last
                )
            elif self.invariant:
                out[a:b] = invariant.attend_chunk(
                    q[a:b], q_rot[a:b], s.start, keys, vals, int(kpos[0]), swa_start, lat, last, cfg.window
                )
            else:
                out[a:b] = attend(
                    q[a:b], q_rot[a:b], pos[a:b], keys, vals, kpos, swa_start, lat, last, cfg.window
                )
            self._write_ring(s, i, k_rot[a:b], v[a:b])
        x = x + self.mm(out, w[p + "wo"])
        return x + self.moe(i, rms_norm(x, w[p + "ffn_norm"], cfg.norm_eps))

    def _local_moe(self, i: int, x: torch.Tensor) -> torch.Tensor:
        # The MoE keeps the tiled products, as in the expert processes of an EP group, whose
        # outputs must have the bits of this one.
        mm = invariant.mm if self.invariant else torch.matmul
        return moe(x, self.w, f"layers.{i}.", self.cfg, mm, invariant.ROW_TILE if self.invariant else 1)

    # ---- ring snapshots --------------------------------------------------------------------------
    def _boundary(self, s: StepSlice) -> int:
        """The last block boundary B this slice reaches (s.start < B <= s.end) whose window of
        keys is real, else 0."""
        bs = self.cfg.block_size
        b = s.end // bs * bs
        return b if b > s.start and b - bs >= s.producer_start else 0

    def _snapshot_entry(self, snapshots: Snapshots, j: int, boundary: int) -> torch.Tensor:
        if j not in snapshots:
            snapshots[j] = (
                boundary,
                torch.empty(ring_snapshot_shape(self.cfg), dtype=self.slots.rings.dtype),
            )
        return snapshots[j][1]

    def _snapshot_chunk(
        self,
        i: int,
        j: int,
        s: StepSlice,
        keys: torch.Tensor,
        vals: torch.Tensor,
        first: int,
        snapshots: Snapshots,
    ) -> None:
        """``keys``/``vals``: this slice's SWA keys of positions [first, s.end) (ring, then chunk)."""
        b = self._boundary(s)
        if i >= self.cfg.n_producer or not b:
            return
        snap = self._snapshot_entry(snapshots, j, b)
        lo = b - self.cfg.block_size - first  # >= 0: block_size <= window and b > s.start
        snap[i, 0] = keys[lo : lo + self.cfg.block_size]
        snap[i, 1] = vals[lo : lo + self.cfg.block_size]

    def _snapshot_decode(
        self,
        i: int,
        dec: DecodeIndex,
        batch: list[StepSlice],
        spans: list[tuple[int, int]],
        snapshots: Snapshots,
    ) -> None:
        """One-token slices at position B - 1: the ring (just written) holds [B - 128, B)."""
        ends = (dec.pos + 1) % self.cfg.block_size == 0
        if i >= self.cfg.n_producer or not bool(ends.any()):
            return
        first_row = {a: j for j, (a, b) in enumerate(spans) if b - a == 1}
        for row, slot in zip(dec.rows[ends].tolist(), dec.slots[ends].tolist(), strict=True):
            j = first_row[row]
            b = self._boundary(batch[j])
            if b:
                positions = torch.arange(b - self.cfg.block_size, b) % self.cfg.ring
                self._snapshot_entry(snapshots, j, b)[i] = self.slots.rings[slot, i][:, positions]

    # ---- batched one-token slices ----------------------------------------------------------------
    def _decode_index(
        self, batch: list[StepSlice], spans: list[tuple[int, int]], consumer: bool
    ) -> DecodeIndex | None:
        one = [(s, a) for s, (a, b) in zip(batch, spans, strict=True) if b - a == 1]
        if not one:
            return None
        return build_index(
            self.cfg,
            [a for _, a in one],
            [s.slot for s, _ in one],
            [s.start for s, _ in one],
            [s.consumer_start if consumer else s.producer_start for s, _ in one],
            [s.block_table for s, _ in one],
            [s.cached_end for s, _ in one],
        )

    def _attend_decode(
        self,
        i: int,
        dec: DecodeIndex,
        q: torch.Tensor,
        q_rot: torch.Tensor,
        k_rot: torch.Tensor,
        v: torch.Tensor,
        consumer: bool,
    ) -> torch.Tensor:
        cfg, r = self.cfg, dec.rows
        # The new keys go into the ring first: it holds window + rollback positions, so the write
        # overwrites no key of the window, and the kernels and the batch-invariant path read them
        # from there.
        ring = self.slots.rings[:, i]
        ring[dec.slots, 0, dec.pos % cfg.ring] = k_rot[r]
        ring[dec.slots, 1, dec.pos % cfg.ring] = v[r]
        latents = self._latents_of(i, dec, consumer)
        if self.kernels is not None:
            return self._attend_decode_kernel(dec, q[r], q_rot[r], ring, latents)
        if self.native is not None:
            lat_args = None if latents is None else (latents[0], dec.tables, latents[1], latents[2])
            return self.native.decode(q[r], q_rot[r], ring, dec.slots, dec.pos, dec.swa_start, lat_args)
        lat = valid = last = None
        if latents is not None:
            view, count, per_page, stride = latents
            if self.invariant:
                lat, valid = invariant.gather_latent_blocks(view, dec.tables, count, per_page)
            else:
                lat, valid = gather_latents(view, dec, count, per_page)
            last = (torch.arange(lat.shape[1]) * stride + stride - 1)[None, :].expand(lat.shape[0], -1)
        if self.invariant:
            return invariant.attend_decode(
                cfg, q[r], q_rot[r], ring, dec.slots, dec.pos, dec.swa_start, lat, valid, last
            )
        return attend_decode(cfg, q[r], q_rot[r], k_rot[r], v[r], ring, dec, lat, valid)

    def _latents_of(
        self, i: int, dec: DecodeIndex, consumer: bool
    ) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
        """What layer ``i``'s decode rows attend to beside their ring: (the page view, entries per
        row ``[rows]``, entries per page, token positions per entry), the global latents for a
        consumer layer, its source's compressed pairs for a layer with one, else None."""
        if consumer:
            return self._glob_view, dec.pos + 1, self.cfg.block_size, 1
        source = self.cfg.source_of(i)
        if source is None:
            return None
        view = self._src_views[self.cfg.kv_sources.index(source)]
        return view, (dec.pos + 1) // 2, self.layout.per_block_compressed, 2

    def _attend_decode_kernel(
        self,
        dec: DecodeIndex,
        q: torch.Tensor,
        q_rot: torch.Tensor,
        ring: torch.Tensor,
        latents: tuple[torch.Tensor, torch.Tensor, int, int] | None,
    ) -> torch.Tensor:
        """The Triton kernel over the ring (the new keys already in it) and ``latents`` (as
        :meth:`_latents_of` gives them)."""
        view, count = (latents[0], latents[1]) if latents is not None else (None, None)
        assert self.kernels is not None
        tables = dec.tables if view is not None else None
        return self.kernels.attention(
            q, q_rot, ring, dec.slots, dec.pos, dec.swa_start, self.cfg.window, view, tables, count
        )

    def _compress_decode(
        self, dec: DecodeIndex, src: int, xn: torch.Tensor, wc0: torch.Tensor, wc1: torch.Tensor
    ) -> None:
        """Odd positions close a pair (latent written); even ones open it (partial state)."""
        partial = self.slots.partial[:, src]
        if self.kernels is not None:
            args = (dec.tables, dec.slots, dec.pos, dec.protect)
            self.kernels.compress(xn.contiguous(), wc0, wc1, partial, self._src_views[src], *args)
            return
        closes = (dec.pos % 2 == 1) & (dec.pos - 1 >= dec.protect)  # a loaded pair keeps its cached latent
        if bool(closes.any()):
            slots, pos = dec.slots[closes], dec.pos[closes]
            latents = partial[slots] + self.mm(xn[closes], wc1)
            j = (pos - 1) // 2
            per = self.layout.per_block_compressed
            page = dec.tables[closes].gather(1, (j // per)[:, None])[:, 0]
            self._src_views[src][page, j % per] = latents
        even = dec.pos % 2 == 0
        if bool(even.any()):
            partial[dec.slots[even]] = self.mm(xn[even], wc0)

    # ---- cache access ---------------------------------------------------------------------------
    def _swa_keys(
        self, s: StepSlice, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, consumer: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ring keys of the window before this slice, then the slice's own keys."""
        cfg = self.cfg
        lo = max(s.consumer_start if consumer else s.producer_start, s.start - cfg.window + 1)
        prev = torch.arange(lo, s.start)
        ring = self.slots.rings[s.slot, layer]
        idx = prev % cfg.ring
        keys = torch.cat([ring[0, idx], k_new])
        vals = torch.cat([ring[1, idx], v_new])
        return keys, vals, torch.cat([prev, torch.arange(s.start, s.end)])

    def _write_ring(self, s: StepSlice, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        n = min(len(s.tokens), self.cfg.ring)  # only the newest `ring` positions survive
        positions = torch.arange(s.end - n, s.end)
        ring = self.slots.rings[s.slot, layer]
        ring[0, positions % self.cfg.ring] = k_new[-n:]
        ring[1, positions % self.cfg.ring] = v_new[-n:]

    def _compress(
        self, s: StepSlice, src: int, xn: torch.Tensor, wc0: torch.Tensor, wc1: torch.Tensor
    ) -> None:
        """Latents of the pairs completed in this slice; the unpaired tail goes to partial state."""
        partial = self.slots.partial[s.slot, src]
        if s.num_logits > 1:  # a verify slice: keep what each position would leave as partial state
            self._open_pairs.setdefault(s.slot, {})[src] = (s.start, self.mm(xn, wc0))
        rows, first = xn, s.start
        lat = []
        if first % 2 == 1:  # complete the pair left open by the previous step
            lat.append(partial + self.mm(rows[:1], wc1)[0])
            rows, first = rows[1:], first + 1
        pairs = rows.shape[0] // 2
        if pairs:
            lat.append(compress_pairs(rows[0 : 2 * pairs : 2], rows[1 : 2 * pairs : 2], wc0, wc1, self.mm))
        if rows.shape[0] % 2 == 1:
            partial.copy_(self.mm(rows[-1:], wc0)[0])
        if lat:
            latents = torch.cat([t.reshape(-1, self.cfg.head_dim) for t in lat])
            j0 = s.start // 2  # the pair of position `start` (closed here when start is odd)
            skip = min(max(0, s.cached_end // 2 - j0), latents.shape[0])  # loaded pairs keep their latents
            self._scatter(
                self._src_views[src],
                s.block_table,
                torch.arange(j0 + skip, j0 + latents.shape[0]),
                self.layout.per_block_compressed,
                latents[skip:],
            )

    def _write_global(self, s: StepSlice, g: torch.Tensor) -> None:
        skip = min(max(0, s.cached_end - s.start), len(s.tokens))  # loaded entries stay as they are
        self._scatter(
            self._glob_view, s.block_table, torch.arange(s.start + skip, s.end), self.cfg.block_size, g[skip:]
        )

    def _latents(
        self, s: StepSlice, layer: int, consumer: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        cfg = self.cfg
        if consumer:
            entries = torch.arange(s.end)
            return self._gather(self._glob_view, s.block_table, entries, cfg.block_size), entries
        source = cfg.source_of(layer)
        if source is None:
            return None, None
        entries = torch.arange(s.end // 2)
        view = self._src_views[cfg.kv_sources.index(source)]
        return self._gather(view, s.block_table, entries, self.layout.per_block_compressed), entries * 2 + 1

    @staticmethod
    def _scatter(
        view: torch.Tensor, table: list[int], entries: torch.Tensor, per_block: int, values: torch.Tensor
    ) -> None:
        blocks = torch.tensor(table, dtype=torch.long)[entries // per_block]
        view[blocks, entries % per_block] = values

    @staticmethod
    def _gather(view: torch.Tensor, table: list[int], entries: torch.Tensor, per_block: int) -> torch.Tensor:
        if len(entries) == 0:
            return view.new_zeros(0, view.shape[-1])
        blocks = torch.tensor(table, dtype=torch.long)[entries // per_block]
        return view[blocks, entries % per_block]


def _tail(end: int, s: StepSlice) -> range:
    """Activation rows of a sampled slice whose logits are wanted (its last ``num_logits``)."""
    return range(end - s.num_logits, end)


def _spans(lengths: list[int]) -> list[tuple[int, int]]:
    spans, a = [], 0
    for n in lengths:
        spans.append((a, a + n))
        a += n
    return spans


NATIVE_PACK_BYTES = 2 << 30  # the most weight bytes packed for the C product kernel (a copy)
_DENSE = ("wq", "wk", "wv", "wo", "wc0", "wc1", "wg")  # the weights of the products outside the MoE


def _native_products(weights: dict[str, torch.Tensor], head: torch.Tensor) -> PackedGemm | None:
    """The batch-invariant products of the dense weights (attention, compressor, boundary,
    logits; not the MoE's) through dsi's C kernel (:mod:`dsi.kernels.dense_gemm`: one chain of
    fused multiply-adds per output, so a row's bits depend on nothing else in its step, with no
    16-row tiles, padding or per-call reshaping), or None where the kernel is not built or the
    packed copy would pass NATIVE_PACK_BYTES."""
    if not dense_gemm.available():
        return None
    mats = [
        t for name, t in weights.items() if name.rsplit(".", 1)[-1] in _DENSE and t.dtype == torch.float32
    ]
    mats.append(head)
    if sum(t.numel() * 4 for t in mats) > NATIVE_PACK_BYTES:
        return None
    return PackedGemm(mats, batch_invariant=True, native=True)
