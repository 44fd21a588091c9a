"""When to replace an instance that died, and when to give up: a pure policy, no clock of its own.

Delays double from ``initial_s`` up to ``max_s``. An instance that stayed up ``stable_after_s``
before it died starts over at ``initial_s``. More than ``max_restarts`` replacements within
the last ``window_s`` seconds and the instance is given up.

Worked example, the defaults (0.5 s doubling to 30 s, 5 restarts per 300 s), an instance that
dies 1 s after every start (times are the deaths)::

    death at    0.0   1.5   3.5   6.5  11.5  20.5
    delay       0.5   1.0   2.0   4.0   8.0  None (5 restarts in the window: give up)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True, frozen=True, kw_only=True)
class RestartPolicy:
    """Every field in seconds except ``factor`` (a multiplier) and ``max_restarts`` (a count)."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    stable_after_s: float = 60.0
    max_restarts: int = 5
    window_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s", "stable_after_s", "window_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.max_s < self.initial_s:
            raise ValueError(f"max_s ({self.max_s}) is below initial_s ({self.initial_s})")
        if not (isinstance(self.factor, int | float) and self.factor >= 1.0):
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or self.max_restarts < 0
        ):
            raise ValueError(f"max_restarts must be a count >= 0, got {self.max_restarts!r}")


class RestartBackoff:
    """The restart history of one instance under `policy`."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._next_s = policy.initial_s
        self._restarts: deque[float] = deque()  # when each replacement was granted, seconds

    def after_exit(self, now: float, uptime_s: float) -> float | None:
        """Seconds to wait before the replacement of an instance that died at `now` after
        `uptime_s` seconds up; None when it is to be given up."""
        policy = self.policy
        # Step 1: a run that lasted starts the delays over.
        if uptime_s >= policy.stable_after_s:
            self._next_s = policy.initial_s
        # Step 2: only the restarts of the last window count towards the cap.
        while self._restarts and now - self._restarts[0] >= policy.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= policy.max_restarts:
            return None
        # Step 3: grant this one, and double the next.
        delay, self._next_s = self._next_s, min(self._next_s * policy.factor, policy.max_s)
        self._restarts.append(now)
        return delay

    @property
    def recent_restarts(self) -> int:
        """Replacements granted within the window, as of the last call."""
        return len(self._restarts)
