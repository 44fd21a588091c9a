"""The V4 runner's attention through the C kernel :func:`dsi.kernels.v4_attention.v4_attention`
(also the Gemma 3 runner's: sliding layers as SWA without latents, global layers over pages).

:class:`NativeAttention` turns the runner's two cases into the kernel's key lists, with no gather
of keys or latents (the lists are element offsets into the rings and the page views):

- a decode batch (one-token slices): row b's SWA keys are the ring entries of positions
  ``max(swa_start_b, pos_b - window + 1) .. pos_b`` (the new key written first), its latents
  the entries ``0 .. count_b - 1`` of its page view;
- a prefill or verify chunk of one sequence: its keys are the window before the chunk and the
  chunk's own, each query row a range of them; its latents those whose last position it covers.

Both give a query the same key lists in the same order, and the kernel computes each row from its
lists alone: the same bits whether a token is a decode slice in a batch of any size or a row of a
chunk of any length, which is the runner's batch invariance (and is as fast as the runner's
unconstrained torch path or faster, so the runner uses it in both modes). Rows are shared out
among the engine's threads (:mod:`dsi.engine.tile_workers`) where that is available.
"""

from __future__ import annotations

import torch

from dsi.engine.invariant import entry_offsets
from dsi.engine.tile_workers import tile_workers
from dsi.kernels import v4_attention as kernel

SHARED_ROWS = 8  # rows below which a thread's share is not worth a hand-off


def usable(head_dim: int, dtype: torch.dtype, device: torch.device | None) -> bool:
    """Whether the kernel serves a runner of this head dim, dtype and device (fp32 on the CPU)."""
    on_cpu = device is None or torch.device(device).type == "cpu"
    return on_cpu and dtype == torch.float32 and kernel.supports(head_dim)


class NativeAttention:
    def __init__(self, window: int) -> None:
        self.window = window
        self.workers = tile_workers()

    def decode(
        self,
        q: torch.Tensor,
        q_rot: torch.Tensor,
        ring: torch.Tensor,
        slots: torch.Tensor,
        pos: torch.Tensor,
        swa_start: torch.Tensor,
        latents: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None,
    ) -> torch.Tensor:
        """q, q_rot: [B, Hq, D] at positions pos [B]; ring: [slots, 2, ring, Hkv, D] of this layer
        (the new keys already written); slots, swa_start: [B]. latents: (page view [pages,
        per_page, D], block tables [B, W], entries per row [B], per_page) or None.
        Returns [B, Hq * D]."""
        b, window = q.shape[0], self.window
        first = pos - window + 1  # [B]: the window's first position
        kpos = first[:, None] + torch.arange(window)[None, :]  # [B, window]
        swa_off = (slots[:, None] * ring.stride(0) + (kpos % ring.shape[2]) * ring.stride(2)).contiguous()
        swa_lo = (swa_start.clamp(min=0) - first).clamp(min=0, max=window)
        swa_hi = torch.full_like(pos, window)
        lbase = lat_off = lat_n = None
        if latents is not None:
            view, tables, count, per_page = latents
            width = int(count.max()) if b else 0
            lbase, lat_n = view, count.contiguous()
            lat_off = entry_offsets(tables, width, per_page, view.stride(0), view.stride(1))
        heads = (ring.shape[3], ring, ring[:, 1], ring.stride(3))  # Hkv, key and value bases, head stride
        lists = kernel.KeyLists(*heads, swa_off, swa_lo, swa_hi, torch.arange(b), lbase, lat_off, lat_n)
        return self._run(q, q_rot, lists)

    def chunk(
        self,
        q: torch.Tensor,
        q_rot: torch.Tensor,
        first: int,
        keys: torch.Tensor,
        vals: torch.Tensor,
        key_first: int,
        swa_start: int,
        latents: torch.Tensor | None,
        latent_last: torch.Tensor | None,
    ) -> torch.Tensor:
        """One sequence's queries q, q_rot [T, Hq, D] at positions first .. first + T - 1, as
        :func:`dsi.engine.invariant.attend_chunk` takes them: keys, vals [Tk, Hkv, D] of positions
        key_first .. key_first + Tk - 1; latents [N, D] with latent_last [N] ascending, or None.
        Returns [T, Hq * D]."""
        t, _, d = q.shape
        hkv = keys.shape[1]
        keys, vals = keys.contiguous(), vals.contiguous()
        qpos = torch.arange(first, first + t)
        swa_off = (torch.arange(keys.shape[0]) * (hkv * d))[None, :]
        lo = (qpos - self.window + 1).clamp(min=max(swa_start, key_first))
        swa_hi = (qpos - key_first + 1).clamp(min=0)
        swa_lo = torch.minimum(lo - key_first, swa_hi)  # a query before swa_start sees no SWA key
        lbase = lat_off = lat_n = None
        if latents is not None and latents.shape[0]:
            lbase = latents.contiguous()
            lat_off = (torch.arange(latents.shape[0]) * d)[None, :]
            lat_n = torch.searchsorted(latent_last.contiguous(), qpos, right=True)
        seq = torch.zeros(t, dtype=torch.long)
        lists = kernel.KeyLists(hkv, keys, vals, d, swa_off, swa_lo, swa_hi, seq, lbase, lat_off, lat_n)
        return self._run(q, q_rot, lists)

    def pages(
        self, q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """Full attention of one-token slices over their pages (no window, no latents), as
        :func:`dsi.engine.invariant.attend_pages` takes them: q [B, Hq, D] at positions pos [B];
        kv [num_blocks, 2, block, Hkv, D] this layer's pages (the new keys already written);
        tables [B, W]. Row b's keys are positions 0 .. pos_b, the list :meth:`chunk` gives a
        query of a chunk whose keys start at 0 with a window longer than the context.
        Returns [B, Hq * D]."""
        b = q.shape[0]
        width = int(pos.max()) + 1 if b else 0
        off = entry_offsets(tables, width, kv.shape[2], kv.stride(0), kv.stride(2))
        lists = kernel.KeyLists(
            kv.shape[3], kv, kv[:, 1], kv.stride(3), off, torch.zeros_like(pos), pos + 1, torch.arange(b)
        )
        return self._run(q, q, lists)

    def _run(self, q: torch.Tensor, q_rot: torch.Tensor, keys: kernel.KeyLists) -> torch.Tensor:
        """The kernel over every row, the rows shared out among the engine's threads where it pays."""
        q, q_rot = q.contiguous(), q_rot.contiguous()
        rows = q.shape[0]
        out = q.new_empty(rows, q.shape[1] * q.shape[2])
        parts = min(self.workers.threads(), rows // SHARED_ROWS)

        def part(i: int) -> None:
            a, b = rows * i // parts, rows * (i + 1) // parts
            kernel.v4_attention(q[a:b], q_rot[a:b], keys.rows(a, b), out=out[a:b])

        if parts >= 2 and self.workers.run(part, parts):
            return out
        return kernel.v4_attention(q, q_rot, keys, out=out)
