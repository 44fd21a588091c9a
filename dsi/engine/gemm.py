"""Products with packed weights: the dense runner's ``x @ w`` through oneDNN.

torch's ``@`` on fp32 goes to MKL, which on this project's AMD CPUs runs its AVX2 kernels; oneDNN
(``torch.ops.mkldnn._linear_pointwise``) uses AVX-512 there and takes a weight reordered once into
its own blocked layout. :class:`PackedGemm` packs every weight of a model once and is then a drop-in
``mm(x, w)`` (the :data:`dsi.model.ops.Matmul` signature): it looks the weight up by its storage
and runs the packed product, or falls back to ``@`` for a weight it has not packed (and
everywhere when torch has no oneDNN)::

    batch-invariant: x [M, K] -> tiles of exactly ROW_TILE rows -> oneDNN(tile, packed w) each -> [M, N]
                     (the tiles shared out among the engine's threads: dsi.engine.tile_workers)
    otherwise:       x [M, K] -> oneDNN(x, packed w) -> [M, N]

With ``batch_invariant`` every product oneDNN sees has ROW_TILE rows, the shape the weights are
packed for, so its kernel (and a row's bits) cannot depend on the row count on any CPU, as
:func:`dsi.engine.invariant.mm` does for MKL (``tests/dsi/engine/test_gemm.py`` checks row
counts up to 2,048 and both thread counts on the machine it runs on). Results equal ``x @ w`` to
fp32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch

from dsi.engine import invariant
from dsi.engine.invariant import ROW_TILE
from dsi.engine.tile_workers import tile_workers

_Key = tuple[int, tuple[int, ...], tuple[int, ...]]
PACK_ROWS = 32  # the row count oneDNN picks the weights' blocked layout for outside invariant mode


def onednn_available() -> bool:
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight")
    )


def _key(w: torch.Tensor) -> _Key:
    return (w.data_ptr(), tuple(w.shape), tuple(w.stride()))


_LINEAR = torch.ops.mkldnn._linear_pointwise.default if onednn_available() else None


class PackedGemm:
    """``mm(x [M, K], w [K, N]) -> [M, N]`` for the 2-D fp32 weights given at construction."""

    def __init__(self, weights: list[torch.Tensor], batch_invariant: bool = True) -> None:
        self.invariant = batch_invariant
        self._workers = tile_workers()
        self._packed: dict[_Key, tuple[torch.Tensor, torch.Tensor]] = {}
        if not onednn_available():
            return
        for w in weights:
            if w.dim() == 2 and w.dtype == torch.float32 and _key(w) not in self._packed:
                # [N, K] reordered into oneDNN's blocked layout for products of about PACK_ROWS
                # rows (a plain-layout weight is reordered again inside every product: about 25%
                # slower at 32 rows); the source stays referenced so its storage is not reused.
                rows = ROW_TILE if batch_invariant else PACK_ROWS
                packed = torch.ops.mkldnn._reorder_linear_weight(w.T.contiguous(), rows)
                self._packed[_key(w)] = (w, packed)

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        hit = self._packed.get(_key(w))
        if not self.invariant:
            return x @ w if hit is None else _LINEAR(x.contiguous(), hit[1], None, "none", [], "")
        if hit is None:
            return invariant.mm(x, w)
        m = x.shape[0]
        t = invariant.tiles(m)
        x = invariant.pad_rows(x, t * ROW_TILE).contiguous()
        if t == 1:
            return _LINEAR(x, hit[1], None, "none", [], "")[:m]
        out = x.new_empty(t * ROW_TILE, w.shape[1])
        packed = hit[1]

        def tile(i: int) -> None:
            a = i * ROW_TILE
            out[a : a + ROW_TILE] = _LINEAR(x[a : a + ROW_TILE], packed, None, "none", [], "")

        if not self._workers.run(tile, t):  # one OpenMP region per tile instead
            for i in range(t):
                tile(i)
        return out[:m]
