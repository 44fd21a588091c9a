"""A controller restart under ``dsi bench control-plane``, and how long the cluster takes to be
whole again.

    t = 0      SIGKILL the controller (reaped), start it again at once on the same address
    t = ready  the new controller printed READY (its process start)
    every poll_s from t = 0: how many simulated instances the controller lists as serving, the
               balancer routes to, and the entrypoint counts as ready (probe.whole_counts)
    the watch ends once every count has been whole for settle_s (a balancer or a gateway may
               refresh from the new controller's partial table after it is whole), or at deadline_s

A role's recovery is the time from t = 0 until its count was whole for the rest of the watch
(0 when it never dropped; None when it was not whole at the end). The run's recovery is the
largest of the three. ``*_min`` is the fewest instances a role would route to meanwhile (its
answers only): what routing sees while the controller's table is partial.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dsi.bench.control_plane_cluster import ControlPlane
from dsi.bench.control_plane_probe import Counts

ROLES = ("controller", "balancer", "entrypoint")


@dataclass(slots=True, frozen=True)
class Recovery:
    """Seconds from the kill; ``None``: not whole when the watch ended."""

    ready_s: float | None  # the new controller printed READY
    controller_s: float | None
    balancer_s: float | None
    entrypoint_s: float | None
    balancer_min: int  # fewest instances the balancer routed to during the watch
    entrypoint_min: int  # fewest the entrypoint counted as ready

    @property
    def total_s(self) -> float | None:
        parts = (self.controller_s, self.balancer_s, self.entrypoint_s)
        return None if any(p is None for p in parts) else max(parts)  # type: ignore[type-var]


def whole_after(samples: list[tuple[float, int]], n: int) -> float | None:
    """The time of the first sample from which the count stayed ``n`` to the end: 0.0 when it
    never dropped, None when the last sample is short. ``samples``: (seconds, count), in order;
    a count of -1 (no answer) is short."""
    if not samples or samples[-1][1] < n:
        return None
    short = [i for i, (_, count) in enumerate(samples) if count < n]
    return samples[short[-1] + 1][0] if short else 0.0


async def watch_restart(
    plane: ControlPlane,
    probe: Callable[[], Awaitable[Counts]],
    n: int,
    *,
    poll_s: float = 0.1,
    settle_s: float = 2.5,
    deadline_s: float = 30.0,
) -> Recovery:
    """Kill and restart ``plane``'s controller; ``n`` simulated instances should be whole again."""
    t0 = time.monotonic()
    await plane.kill_controller()
    ready_at: list[float] = []

    async def restart() -> None:
        await plane.start_controller()
        ready_at.append(time.monotonic() - t0)

    starting = asyncio.create_task(restart(), name="controller restart")
    samples: dict[str, list[tuple[float, int]]] = {role: [] for role in ROLES}
    whole_since: float | None = None
    try:
        while True:
            counts = await probe()
            t = time.monotonic() - t0
            for role in ROLES:
                samples[role].append((t, getattr(counts, role)))
            whole = starting.done() and all(getattr(counts, role) == n for role in ROLES)
            whole_since = (whole_since if whole_since is not None else t) if whole else None
            if (whole_since is not None and t - whole_since >= settle_s) or t >= deadline_s:
                break
            await asyncio.sleep(poll_s)
    finally:
        if not starting.done():
            starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
    if starting.cancelled():
        raise RuntimeError(f"the controller was not READY again within {deadline_s:g}s")
    starting.result()  # a controller that could not start again is an error, not a figure
    seen = {role: [c for _, c in samples[role] if c >= 0] for role in ROLES}
    return Recovery(
        ready_at[0] if ready_at else None,
        *(whole_after(samples[role], n) for role in ROLES),
        min(seen["balancer"], default=-1),
        min(seen["entrypoint"], default=-1),
    )
