"""Products with packed weights: the dense runners' ``x @ w``.

:class:`PackedGemm` packs every weight of a model once and is then a drop-in ``mm(x, w)`` (the
:data:`dsi.model.ops.Matmul` signature): it looks the weight up by its storage and runs the
packed product, or falls back to a plain one for a weight it has not packed. Where dsi's C
kernels build, every product is :func:`dsi.kernels.dense_gemm.gemm`: one chain of fused
multiply-adds per output element in k order, so a row's bits cannot depend on the row count
or the thread count, and each weight is read once per product (its threads split the columns)::

    C kernel:             x [M, K] -> dense_gemm(x, packed w) -> [M, N]        (either mode)

Without it, oneDNN (``torch.ops.mkldnn._linear_pointwise``, a weight reordered once into its
blocked layout; torch's ``@`` on fp32 goes to MKL, which on AMD CPUs runs its AVX2 kernels)::

    batch-invariant: x [M, K] -> tiles of exactly ROW_TILE rows -> oneDNN(tile, packed w) each -> [M, N]
                     (the tiles shared out among the engine's threads: dsi.engine.tile_workers)
    otherwise:       x [M, K] -> oneDNN(x, packed w) -> [M, N]

With ``batch_invariant`` every product oneDNN sees has ROW_TILE rows, the shape the weights are
packed for, so its kernel (and a row's bits) cannot depend on the row count on any CPU, as
:func:`dsi.engine.invariant.mm` does for MKL. ``tests/dsi/engine/test_gemm.py`` checks row counts
up to 2,048 and both thread counts on the machine it runs on, for the path this machine takes.
Results equal ``x @ w`` to fp32 rounding, not bit for bit.

Measured (SmolLM2-135M's products, 2 threads, AMD EPYC with AVX-512): the products of a decode
step of 32 rows take 33 ms with the C kernel against 55 ms with oneDNN's 16-row tiles; a prefill
of 1,440 rows 0.82 s against 1.03 s (``docs/benchmarks.md``).
"""

from __future__ import annotations

import torch

from dsi.engine import invariant
from dsi.engine.invariant import ROW_TILE
from dsi.engine.tile_workers import tile_workers
from dsi.kernels import dense_gemm

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

    def __init__(
        self, weights: list[torch.Tensor], batch_invariant: bool = True, native: bool | None = None
    ) -> None:
        """``native``: use the C kernel (default: where it builds); False: the oneDNN paths."""
        self.invariant = batch_invariant
        self.native = dense_gemm.available() if native is None else native
        self._workers = tile_workers()
        self._packed: dict[_Key, tuple[torch.Tensor, torch.Tensor]] = {}
        self._panels: dict[_Key, tuple[torch.Tensor, dense_gemm.Packed]] = {}
        if self.native:
            for w in weights:
                if w.dim() == 2 and w.dtype == torch.float32 and _key(w) not in self._panels:
                    self._panels[_key(w)] = (w, dense_gemm.pack(w))  # the source keeps its storage
            return
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

    @property
    def row_tile(self) -> int:
        """The row count a step's rows are best padded to a multiple of: ROW_TILE where products
        run in row tiles (oneDNN, batch-invariant), else 1 (any row count costs only its rows)."""
        return ROW_TILE if self.invariant and not self.native else 1

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] @ w [K, N] -> [M, N]. ``out``: fp32 [M, N] with contiguous rows that the C
        kernel writes into (a caller's reused buffer); the other paths allocate their result, so
        use the value returned."""
        if self.native:
            panels = self._panels.get(_key(w))
            if panels is not None:
                return dense_gemm.gemm(x, panels[1], out=out)
            if w.dim() == 2 and w.dtype == torch.float32 and w.device.type == "cpu":
                return dense_gemm.gemm(x, dense_gemm.pack(w))  # packed for this call only
            return invariant.mm(x, w) if self.invariant else x @ w
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
