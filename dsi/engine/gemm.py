"""Products with packed weights: the dense runner's ``x @ w`` through oneDNN.

torch's ``@`` on fp32 goes to MKL, which on this project's AMD CPUs runs its AVX2 kernels; oneDNN
(``torch.ops.mkldnn._linear_pointwise``) uses AVX-512 there and takes a weight reordered once into
its own blocked layout. :class:`PackedGemm` packs every weight of a model once and is then a drop-in
``mm(x, w)`` (the :data:`dsi.model.ops.Matmul` signature): it looks the weight up by its storage
and runs the packed product, or falls back to ``@`` for a weight it has not packed (and
everywhere when torch has no oneDNN)::

    x [M, K] --(rows padded to a multiple of ROW_TILE, batch-invariant only)--> oneDNN(x, packed w) -> [M, N]

With ``batch_invariant`` the rows are padded as :func:`dsi.engine.invariant.mm` pads them, after
which a row's bits do not depend on the row count (``tests/dsi/engine/test_gemm.py`` checks this
on the machine it runs on). Results equal ``x @ w`` to fp32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch

from dsi.engine.invariant import ROW_TILE

_Key = tuple[int, tuple[int, ...], tuple[int, ...]]
PACK_ROWS = 32  # the row count oneDNN picks the weights' blocked layout for (a decode batch)


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
        self._packed: dict[_Key, tuple[torch.Tensor, torch.Tensor]] = {}
        if not onednn_available():
            return
        for w in weights:
            if w.dim() == 2 and w.dtype == torch.float32 and _key(w) not in self._packed:
                # [N, K] reordered into oneDNN's blocked layout for products of about PACK_ROWS
                # rows (a plain-layout weight is reordered again inside every product: about 25%
                # slower at 32 rows); the source stays referenced so its storage is not reused.
                packed = torch.ops.mkldnn._reorder_linear_weight(w.T.contiguous(), PACK_ROWS)
                self._packed[_key(w)] = (w, packed)

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if self.invariant:
            rows = max(ROW_TILE, -(-m // ROW_TILE) * ROW_TILE)
            if rows != m:
                x = torch.cat([x, x.new_zeros(rows - m, x.shape[1])])
        hit = self._packed.get(_key(w))
        if hit is None:
            return (x.contiguous() @ w)[:m]
        return _LINEAR(x.contiguous(), hit[1], None, "none", [], "")[:m]
