"""LoadWindow: per-expert token counts over the last ``steps`` engine steps (a moving window)."""

from __future__ import annotations

import torch


class LoadWindow:
    def __init__(self, num_layers: int, num_experts: int, steps: int) -> None:
        if steps < 1:
            raise ValueError("a load window needs at least one step")
        self._counts = torch.zeros(steps, num_layers, num_experts, dtype=torch.int64)
        self._next = 0
        self.steps_seen = 0

    def push(self, counts: torch.Tensor) -> None:
        """counts: [L, E] token-expert pairs of one step (the oldest step leaves the window)."""
        self._counts[self._next] = counts
        self._next = (self._next + 1) % self._counts.shape[0]
        self.steps_seen += 1

    def total(self) -> torch.Tensor:
        """[L, E] pairs per expert over the window."""
        return self._counts.sum(0)
