"""Load reports and controller tables for balancer tests, and a poll for async tests."""

import asyncio

from dsi.messages.balancer import LoadReport
from dsi.messages.control import InstanceInfo, InstanceTable, Load


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def prefill(
    instance_id: str, queued: int = 0, *, accepted: int = 0, started_at: float = 1.0, state: str = "ready"
) -> LoadReport:
    return LoadReport(instance_id, "prefill", started_at, state, queued_tokens=queued, accepted=accepted)


def decode(
    instance_id: str,
    running: int = 0,
    kv: int = 0,
    *,
    accepted: int = 0,
    started_at: float = 1.0,
    max_requests: int = 64,
    capacity: int = 100_000,
) -> LoadReport:
    return LoadReport(
        instance_id,
        "decode",
        started_at,
        running=running,
        kv_tokens=kv,
        max_requests=max_requests,
        kv_capacity_tokens=capacity,
        accepted=accepted,
    )


def table(**states: str) -> InstanceTable:
    """The controller's table: instance id -> lifecycle state (role from the id's prefix)."""
    return InstanceTable(
        [
            InstanceInfo(
                i, i.split("-")[0], "127.0.0.1", 1, f"tcp://127.0.0.1:{7000 + n}", state, Load(), 0.0, 1.0
            )
            for n, (i, state) in enumerate(states.items())
        ]
    )


async def until(check, tries: int = 200) -> None:
    """Poll `check` every 50 ms until it is true; AssertionError after `tries` polls."""
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met")
