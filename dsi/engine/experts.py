"""ExpertLayer: what the engine needs from an expert-parallel group (``dsi.eplb.group.ExpertGroup``).

Without one the runner computes the MoE in process (:func:`dsi.model.ops.moe`)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from dsi.model.config import ModelConfig


class ExpertLayer(Protocol):
    def runner(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        num_blocks: int,
        num_slots: int,
        batch_invariant: bool = True,
    ) -> Any:
        """A runner (``pool``, ``slots``, ``forward``, ``rollback`` as
        :class:`dsi.engine.runner.ModelRunner`) whose steps run across the group's ranks."""
        ...

    def end_step(self) -> float:
        """After each forward, before the next (rebalancing happens here); pause in seconds."""
        ...

    def close(self) -> None: ...
