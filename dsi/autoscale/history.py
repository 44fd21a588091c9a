"""The last decisions, each with the inputs it was made from, for `dsi status` and post-mortems."""

from __future__ import annotations

from collections import deque

from dsi.autoscale.decision import Decision

DEFAULT_HISTORY = 100


class DecisionLog:
    """A ring of the last ``capacity`` decisions, oldest first; recording one more drops the oldest.

    A :class:`Decision` carries its :class:`ScalingInputs`, so an entry explains itself.
    """

    __slots__ = ("_ring",)

    def __init__(self, capacity: int = DEFAULT_HISTORY) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self._ring: deque[Decision] = deque(maxlen=capacity)

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    def record(self, decision: Decision) -> None:
        self._ring.append(decision)

    def entries(self) -> tuple[Decision, ...]:
        """Every kept decision, oldest first."""
        return tuple(self._ring)

    def latest(self) -> Decision | None:
        """The newest decision (the ``previous`` of the next :func:`decide`), or None."""
        return self._ring[-1] if self._ring else None

    def __len__(self) -> int:
        return len(self._ring)
