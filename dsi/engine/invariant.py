"""Batch-invariant math: a token's result does not depend on what else shares its step.

``[engine] batch_invariant`` (on by default) routes the runner's products and attention through
this module. Two sources of variation are removed:

- GEMM shapes. BLAS libraries pick their kernel, and so the reduction order, by the shape of a
  product: MKL runs fewer than 4 rows as matrix-vector products, and on some CPUs (AVX-512 with
  AMX) takes another path for 16 rows than for 8. Padding the rows is not enough, since the padded
  count still varies. :func:`mm` therefore never lets the row count reach the library: the rows
  are cut into tiles of exactly ``ROW_TILE`` (the last one zero-padded) and the tiles go as one
  batched product of identical ``[ROW_TILE, K] x [K, N]`` matrices, so every row of every step is
  computed by the kernel the library picks for that one model-constant shape, on any CPU and at
  any thread count (``tests/dsi/engine/test_invariant.py`` checks row counts up to 2,048 and both
  thread counts on the machine it runs on)::

      x [M, K] -> pad to T * ROW_TILE rows -> [T, ROW_TILE, K] bmm [T, K, N] (w, stride 0) -> [M, N]

  A weight larger than ``WIDE_BYTES`` (the output projection over the vocabulary: 129,280 x 256
  fp32 = 126 MiB on the tiny shape) would be read from memory once per tile that way; it is cut
  into blocks of ``COLUMN_BLOCK`` columns instead, each multiplied with every tile while it is in
  the cache. Every product still has a model-constant shape (the last block's width is N mod
  COLUMN_BLOCK), and each output element is reduced over K alone, so a row's bits still do not
  depend on the row count. At 64 rows on 2 AVX2 cores: 70 ms against 106 ms unblocked (and 80 ms
  for torch's own ``x @ w``), medians of 40 interleaved runs.

- Attention reductions. Keys are cut into blocks of ``KEY_BLOCK`` aligned on absolute positions
  (SWA keys by token position, global latents by entry), each block is scored and weighted with
  fixed-shape products, and blocks are folded into an online softmax in one order: SWA blocks,
  then latent blocks, both ascending. An attention product has :func:`attention_tile` rows (the
  query heads that share a key, rounded up to 4, at most ROW_TILE), a chunk's query rows cut into
  such products as :func:`mm` cuts rows into tiles, so that a decode slice's heads fill one
  product instead of padding it to ROW_TILE rows. A block a query cannot see leaves its state exactly as it
  was. So a query gets the same bits in a prefill chunk of any length, as a one-token decode slice
  in a batch of any size, and after a preemption::

      per query row, per visible block b (in order):
          m' = max(m, max s_b)        l = l * e^(m - m') + sum e^(s_b - m')
          o  = o * e^(m - m') + e^(s_b - m') @ V_b          out = o / l

The naive reference (``dsi.model.reference``) keeps plain products and one joint softmax: the
engine matches it to fp32 rounding either way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dsi.model.config import ModelConfig

ROW_TILE = 16  # rows of every product the engine makes (see above), attention's aside
ATTENTION_QUANTUM = 4  # an attention product's rows are a multiple of this (at most ROW_TILE)
WIDE_BYTES = 8 << 20  # a weight larger than this is multiplied in blocks of COLUMN_BLOCK columns
COLUMN_BLOCK = 1024
KEY_BLOCK = 128
VECTOR_RUN = 64  # elements: a multiple of what torch's vectorised loops take per iteration (AVX2, AVX-512)


def tiles(m: int, tile: int = ROW_TILE) -> int:
    """How many tiles of ``tile`` rows hold m rows (at least one)."""
    return max(1, -(-m // tile))


def attention_tile(rows: int) -> int:
    """Rows of each attention product for ``rows`` query rows per position that share their keys
    (query heads per KV head; all heads for the latents): ``rows`` rounded up to a multiple of
    ATTENTION_QUANTUM, at most ROW_TILE. A decode slice's heads then fill their products (4 heads
    of the tiny shape: one [4, D] x [D, KEY_BLOCK] product, not 4 rows padded to 16), and a chunk
    cuts its n * rows query rows into products of the same shape."""
    return min(ROW_TILE, -(-rows // ATTENTION_QUANTUM) * ATTENTION_QUANTUM)


def pad_rows(x: torch.Tensor, rows: int, dim: int = 0) -> torch.Tensor:
    """x with zero rows appended along ``dim`` up to ``rows`` (x itself when it has as many)."""
    extra = rows - x.shape[dim]
    if extra <= 0:
        return x
    after = x.dim() - 1 - dim % x.dim()  # dimensions after ``dim``: F.pad lists the last first
    return F.pad(x, (0, 0) * after + (0, extra))


def mm(x: torch.Tensor, w: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """[M, K] @ [K, N] -> [M, N] as tiles(M) products of exactly ``tile`` rows in one batched call
    (one per block of COLUMN_BLOCK columns for a weight larger than WIDE_BYTES). A step makes
    hundreds of these small products, so the path of the usual case is kept to a few calls."""
    m = x.shape[0]
    t = tiles(m, tile)
    extra = t * tile - m
    x = (pad_rows(x, t * tile) if extra else x.contiguous()).view(t, tile, -1)
    if w.numel() * w.element_size() <= WIDE_BYTES:
        out = torch.bmm(x, w.expand(t, -1, -1))
        return out.view(-1, out.shape[2])[:m] if extra else out.view(m, -1)
    n = w.shape[1]
    out = x.new_empty(t * tile, n)
    for a in range(0, n, COLUMN_BLOCK):  # one block of the weight at a time, for every tile
        block = w[:, a : a + COLUMN_BLOCK]
        out[:, a : a + COLUMN_BLOCK] = torch.bmm(x, block.expand(t, *block.shape)).view(t * tile, -1)
    return out[:m]


def bmm(a: torch.Tensor, b: torch.Tensor, tile: int) -> torch.Tensor:
    """[B, M, K] @ [B, K, N] -> [B, M, N], each matrix's rows in products of exactly ``tile`` rows
    (the last one zero-padded): one batched call per tile of rows; M is a model constant where the
    engine calls this (heads per KV head)."""
    m = a.shape[1]
    t = tiles(m, tile)
    a = pad_rows(a, t * tile, dim=1)
    if t == 1:
        return torch.bmm(a, b)[:, :m]
    return torch.cat([torch.bmm(a[:, u * tile : (u + 1) * tile], b) for u in range(t)], 1)[:, :m]


def exp(x: torch.Tensor) -> torch.Tensor:
    """``torch.exp`` with every element on the vectorised path. torch's elementwise loops finish
    a length that is not a multiple of their vector run with the scalar ``exp``, whose last bit
    can differ from the vector one; so a [rows, heads] tensor would give a row other bits when
    the row count changes. Padding the flat length to VECTOR_RUN avoids the scalar tail."""
    n = x.numel()
    if n % VECTOR_RUN == 0 and x.is_contiguous():  # already whole runs: the same loop as below
        return torch.exp(x)
    flat = x.reshape(-1)
    padded = -(-n // VECTOR_RUN) * VECTOR_RUN
    if padded != n:
        flat = torch.cat([flat, flat.new_zeros(padded - n)])
    return torch.exp(flat)[:n].view(x.shape)


class _Softmax:
    """Online-softmax state of ``rows`` query rows x ``heads`` heads: max, sum, weighted values."""

    def __init__(self, rows: int, heads: int, dim: int) -> None:
        self.m = torch.full((rows, heads), float("-inf"))
        self.l = torch.zeros(rows, heads)
        self.o = torch.zeros(rows, heads, dim)

    def scale(self, r: slice, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold in the max of scores ``s`` [n, heads, KEY_BLOCK] of rows ``r``; returns (e, alpha)."""
        m_new = torch.maximum(self.m[r], s.amax(-1))
        ref = torch.where(torch.isinf(m_new), 0.0, m_new)  # nothing seen yet: stay 0
        alpha = exp(self.m[r] - ref)
        self.m[r] = m_new
        return exp(s - ref[..., None]), alpha

    def add(self, r: slice, e: torch.Tensor, alpha: torch.Tensor, weighted: torch.Tensor) -> None:
        self.l[r] = self.l[r] * alpha + e.sum(-1)
        self.o[r] = self.o[r] * alpha[..., None] + weighted

    def result(self) -> torch.Tensor:
        return (self.o / self.l[..., None]).reshape(self.o.shape[0], -1)


def attend_chunk(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    first: int,
    keys: torch.Tensor,
    vals: torch.Tensor,
    key_first: int,
    swa_start: int,
    latents: torch.Tensor | None,
    latent_last: torch.Tensor | None,
    window: int,
) -> torch.Tensor:
    """One sequence's queries, as :func:`dsi.model.ops.attend` defines them, batch-invariantly.

    q, q_rot: [T, Hq, D] at positions first .. first + T - 1.
    keys, vals: [Tk, Hkv, D] rotated SWA keys of positions key_first .. key_first + Tk - 1.
    latents: [N, D] global entries (keys = values) with latent_last [N] ascending, or None.
    Returns [T, Hq * D].
    """
    t, hq, d = q.shape
    hkv = keys.shape[1]
    group, scale = hq // hkv, 1.0 / math.sqrt(d)
    swa_tile, latent_tile = attention_tile(group), attention_tile(hq)
    qpos = torch.arange(first, first + t)
    state = _Softmax(t, hq, d)
    end = key_first + keys.shape[0]
    for a in range(key_first // KEY_BLOCK, (end - 1) // KEY_BLOCK + 1):
        p0 = a * KEY_BLOCK
        lo, hi = max(p0, key_first), min(p0 + KEY_BLOCK, end)
        r = _rows(first, t, p0, p0 + KEY_BLOCK + window - 1)  # queries whose window reaches the block
        if r.start >= r.stop:
            continue
        kb, vb = keys.new_zeros(KEY_BLOCK, hkv, d), vals.new_zeros(KEY_BLOCK, hkv, d)
        kb[lo - p0 : hi - p0], vb[lo - p0 : hi - p0] = (
            keys[lo - key_first : hi - key_first],
            vals[lo - key_first : hi - key_first],
        )
        kpos = torch.arange(p0, p0 + KEY_BLOCK)[None, :]
        qp = qpos[r, None]
        ok = (kpos <= qp) & (kpos > qp - window) & (kpos >= max(swa_start, lo)) & (kpos < hi)
        n = r.stop - r.start
        qg = q_rot[r].reshape(n, hkv, group, d)
        s = (
            torch.stack(
                [
                    mm(qg[:, k].reshape(n * group, d), kb[:, k].T, swa_tile).view(n, group, KEY_BLOCK)
                    for k in range(hkv)
                ],
                1,
            ).reshape(n, hq, KEY_BLOCK)
            * scale
        )
        e, alpha = state.scale(r, s.masked_fill(~ok[:, None, :], float("-inf")))
        eg = e.view(n, hkv, group, KEY_BLOCK)
        pv = torch.stack(
            [
                mm(eg[:, k].reshape(n * group, KEY_BLOCK), vb[:, k], swa_tile).view(n, group, d)
                for k in range(hkv)
            ],
            1,
        ).reshape(n, hq, d)
        state.add(r, e, alpha, pv)
    if latents is not None and latents.shape[0]:
        for b0 in range(0, latents.shape[0], KEY_BLOCK):
            lb, last = _latent_block(latents, latent_last, b0)
            r = _rows(first, t, int(last[0]), first + t)  # queries at or after the block's first entry
            if r.start >= r.stop:
                continue
            n = r.stop - r.start
            ok = last[None, :] <= qpos[r, None]
            s = mm(q[r].reshape(n * hq, d), lb.T, latent_tile).view(n, hq, KEY_BLOCK) * scale
            e, alpha = state.scale(r, s.masked_fill(~ok[:, None, :], float("-inf")))
            state.add(r, e, alpha, mm(e.reshape(n * hq, KEY_BLOCK), lb, latent_tile).view(n, hq, d))
    return state.result()


def attend_decode(
    cfg: ModelConfig,
    q: torch.Tensor,
    q_rot: torch.Tensor,
    ring: torch.Tensor,
    slots: torch.Tensor,
    pos: torch.Tensor,
    swa_start: torch.Tensor,
    latents: torch.Tensor | None,
    lat_valid: torch.Tensor | None,
    latent_last: torch.Tensor | None,
) -> torch.Tensor:
    """One-token slices of B sequences, with the bits :func:`attend_chunk` gives their queries.

    q, q_rot: [B, Hq, D] at positions ``pos`` [B]; ring: [slots, 2, ring, Hkv, D] of this layer,
    the new keys and values already written (the ring holds window + rollback positions, so that
    write overwrote no key of the window); swa_start: [B]. latents: [B, N, D] global entries as
    :func:`gather_latent_blocks` gives them (N a multiple of KEY_BLOCK, zeros where not lat_valid
    [B, N]); latent_last [B, N]: entry n covers up to that position.
    Returns [B, Hq * D].

    Each block's keys come out of the ring as whole rows (``index_select`` of the ring's rows);
    values out of sight are zeroed row by row (a weight of 0 times a stale inf or NaN would still
    poison the sum; keys need no zeros, their scores are set to -inf). The queries are padded to
    whole :func:`attention_tile` products once (no padding when the heads fill them), and every
    block reuses them.
    """
    b, hq, d = q.shape
    hkv = ring.shape[3]
    group, scale, window = hq // hkv, 1.0 / math.sqrt(d), cfg.window
    swa_tile, latent_tile = attention_tile(group), attention_tile(hq)
    state = _Softmax(b, hq, d)
    rows = slice(0, b)
    qs = pad_rows(q_rot.view(b, hkv, group, d), tiles(group, swa_tile) * swa_tile, dim=2)  # [B, Hkv, G, D]
    es = q.new_zeros((*qs.shape[:3], KEY_BLOCK))  # [B, Hkv, G, KB]: weights, padded alike
    entries = row_view(ring.flatten(3))  # [rows, Hkv * D]
    first_block = (pos - window + 1).clamp(min=0) // KEY_BLOCK
    for j in range(-(-window // KEY_BLOCK) + 1):
        kpos = (first_block + j)[:, None] * KEY_BLOCK + torch.arange(KEY_BLOCK)[None, :]  # [B, KB]
        ok = (kpos <= pos[:, None]) & (kpos > pos[:, None] - window) & (kpos >= swa_start[:, None])
        if not bool(ok.any()):
            continue
        at = (slots[:, None] * ring.stride(0) + (kpos.clamp(min=0) % cfg.ring) * ring.stride(2)).view(-1)
        kv = entries.index_select(0, torch.cat([at, at + ring.stride(1)]) // entries.stride(0))
        kb, vb = kv[: b * KEY_BLOCK], kv[b * KEY_BLOCK :]  # [B * KB, Hkv * D] each
        vb.index_fill_(0, (~ok).view(-1).nonzero()[:, 0], 0.0)
        kb, vb = kb.view(b, KEY_BLOCK, hkv, d), vb.view(b, KEY_BLOCK, hkv, d)
        s = torch.stack([bmm(qs[:, k], kb[:, :, k].transpose(1, 2), swa_tile) for k in range(hkv)], 1)
        s = s[:, :, :group].reshape(b, hq, KEY_BLOCK)
        e, alpha = state.scale(rows, s.mul(scale).masked_fill(~ok[:, None, :], float("-inf")))
        es[:, :, :group] = e.view(b, hkv, group, KEY_BLOCK)
        pv = torch.stack([bmm(es[:, k], vb[:, :, k], swa_tile) for k in range(hkv)], 1)
        state.add(rows, e, alpha, pv[:, :, :group].reshape(b, hq, d))
    if latents is not None and latents.shape[1]:
        ql = pad_rows(q, tiles(hq, latent_tile) * latent_tile, dim=1)  # [B, H, D], H: whole tiles
        el = q.new_zeros(b, ql.shape[1], KEY_BLOCK)
        for b0 in range(0, latents.shape[1], KEY_BLOCK):
            ok = lat_valid[:, b0 : b0 + KEY_BLOCK] & (latent_last[:, b0 : b0 + KEY_BLOCK] <= pos[:, None])
            if not bool(ok.any()):
                continue
            lb = latents[:, b0 : b0 + KEY_BLOCK]  # [B, KB, D]
            s = bmm(ql, lb.transpose(1, 2), latent_tile)[:, :hq] * scale
            e, alpha = state.scale(rows, s.masked_fill(~ok[:, None, :], float("-inf")))
            el[:, :hq] = e
            state.add(rows, e, alpha, bmm(el, lb, latent_tile)[:, :hq])
    return state.result()


def gather_latent_blocks(
    view: torch.Tensor, tables: torch.Tensor, count: torch.Tensor, per_page: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Entries 0 .. count_b - 1 of each sequence out of a page view [pages, per_page, D], as
    :func:`attend_decode` takes them: ([B, N, D] zeros where not valid, valid [B, N]), N = max
    count rounded up to whole KEY_BLOCKs. tables: [B, W] page ids (padding may be any page). One
    ``index_select`` of the entries' rows, then the rows not valid zeroed (a page's unwritten
    entries may hold anything)."""
    b, d = count.shape[0], view.shape[-1]
    width = -(-int(count.max()) // KEY_BLOCK) * KEY_BLOCK if b else 0
    valid = torch.arange(width)[None, :] < count[:, None]
    at = entry_offsets(tables, width, per_page, view.stride(0), view.stride(1))
    rows = row_view(view)
    out = rows.index_select(0, at.reshape(-1) // rows.stride(0))
    out.index_fill_(0, (~valid).view(-1).nonzero()[:, 0], 0.0)
    return out.view(b, width, d), valid


def entry_offsets(
    tables: torch.Tensor, width: int, per_page: int, page_stride: int, entry_stride: int
) -> torch.Tensor:
    """[B, width] element offsets of entries 0 .. width - 1 of each row's pages (row b's entry n
    in page ``tables[b, n // per_page]`` at ``n % per_page``, from the first element of a view
    with those strides); entries past a table's end point into its last page."""
    entries = torch.arange(width)[None, :]
    page = tables.gather(
        1, (entries // per_page).clamp(max=tables.shape[1] - 1).expand(tables.shape[0], width)
    )
    return (page * page_stride + (entries % per_page) * entry_stride).contiguous()


def row_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` [..., W] as one [rows, W] view of its storage, from t's first element: element
    (i0, i1, ..., :) is row ``sum(i_k * stride_k) // W``. ``t`` may be a strided view (a layer's
    rings among all layers', one part of every page); only each W values must be contiguous and
    every other stride a multiple of W, which the rings and page views here are. Gathering rows
    of it with ``index_select`` copies W values at a time, where advanced indexing copies one."""
    width = t.shape[-1]
    assert t.stride(-1) == 1 and all(st % width == 0 for st in t.stride()[:-1]), t.stride()
    last = sum((n - 1) * st for n, st in zip(t.shape[:-1], t.stride()[:-1], strict=True))
    return t.as_strided((last // width + 1, width), (width, 1))


def attend_pages(q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One-token slices of B sequences of a full-attention layer, with the bits :func:`attend_chunk`
    gives their queries (window longer than the context), keys and values read from the pages.

    q: [B, Hq, D] rotated queries at positions ``pos`` [B]; kv: [num_blocks, 2, KEY_BLOCK, Hkv, D]
    this layer's pages, the new keys already written; tables: [B, W] page ids (a sequence's
    position p is in page ``tables[b, p // KEY_BLOCK]``; padding may be any page). Returns [B, Hq * D].
    A sequence folds its blocks 0 .. pos // KEY_BLOCK in order; a later block it cannot see
    leaves its softmax state exactly as it was (alpha 1, weights 0).
    """
    b, hq, d = q.shape
    hkv = kv.shape[3]
    group, scale = hq // hkv, 1.0 / math.sqrt(d)
    state = _Softmax(b, hq, d)
    rows = slice(0, b)
    # Each (sequence, KV head) makes [tile, D] x [D, KEY_BLOCK] products, as a chunk's rows do.
    tile = attention_tile(group)
    # [B, Hkv, G, D], G: whole tiles
    qp = pad_rows(q.view(b, hkv, group, d), tiles(group, tile) * tile, dim=2)
    ep = q.new_zeros((*qp.shape[:3], KEY_BLOCK))
    # Views in the order the products read them, so that each gather copies straight into it.
    k_view = kv[:, 0].permute(0, 2, 3, 1)  # [num_blocks, Hkv, D, KB]
    v_view = kv[:, 1].transpose(1, 2)  # [num_blocks, Hkv, KB, D]
    for j in range(int(pos.max()) // KEY_BLOCK + 1):
        kpos = j * KEY_BLOCK + torch.arange(KEY_BLOCK)
        ok = kpos[None, :] <= pos[:, None]  # [B, KB]
        # Keys past a position stay as they are (their scores are masked; a score column does not
        # depend on the others); values are zeroed, so that stale entries weigh exactly 0.
        # kt: [B, Hkv, D, KB], vb: [B, Hkv, KB, D]
        page = tables[:, j]
        kt, vb = k_view.index_select(0, page), v_view.index_select(0, page)  # contiguous copies
        if int(pos.min()) < (j + 1) * KEY_BLOCK - 1:
            vb.masked_fill_(~ok[:, None, :, None], 0.0)
        s = _tiled_matmul(qp, kt, tile)[:, :, :group].reshape(b, hq, KEY_BLOCK)
        e, alpha = state.scale(rows, s.mul(scale).masked_fill(~ok[:, None, :], float("-inf")))
        ep[:, :, :group] = e.view(b, hkv, group, KEY_BLOCK)
        pv = _tiled_matmul(ep, vb, tile)[:, :, :group].reshape(b, hq, d)
        state.add(rows, e, alpha, pv)
    return state.result()


def _tiled_matmul(a: torch.Tensor, b: torch.Tensor, tile: int) -> torch.Tensor:
    """[B, H, M, K] @ [B, H, K, N] -> [B, H, M, N] in products of ``tile`` rows (M: whole tiles)."""
    if a.shape[2] == tile:
        return torch.matmul(a, b)
    return torch.matmul(a.unflatten(2, (-1, tile)), b[:, :, None]).flatten(2, 3)


def _rows(first: int, t: int, lo: int, hi: int) -> slice:
    """Rows of queries at positions first .. first + t - 1 that lie in [lo, hi)."""
    return slice(max(0, lo - first), max(0, min(t, hi - first)))


def _latent_block(latents: torch.Tensor, last: torch.Tensor, b0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Entries b0 .. b0 + KEY_BLOCK - 1, zero-padded; padding covers no position (last = +inf-like)."""
    width = min(KEY_BLOCK, latents.shape[0] - b0)
    lb = latents.new_zeros(KEY_BLOCK, latents.shape[1])
    lb[:width] = latents[b0 : b0 + width]
    lt = torch.full((KEY_BLOCK,), torch.iinfo(torch.long).max, dtype=torch.long)
    lt[:width] = last[b0 : b0 + width]
    return lb, lt
