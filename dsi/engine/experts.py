"""ExpertLayer: what the engine needs from an expert-parallel MoE (``dsi.eplb.group.ExpertGroup``).

Without one the runner computes the MoE in process (:func:`dsi.model.ops.moe`)."""

from __future__ import annotations

from typing import Protocol

import torch


class ExpertLayer(Protocol):
    def moe(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """MoE of layer ``layer``: x [T, H] (normalised) -> [T, H]."""
        ...

    def end_step(self) -> float:
        """After each forward, before the next (rebalancing happens here); pause in seconds."""
        ...

    def close(self) -> None: ...
