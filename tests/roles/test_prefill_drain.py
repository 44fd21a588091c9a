"""PrefillDrain: retire after the grace period once the work in flight is done; cancels."""

import asyncio

import pytest

from dsi.messages.migrate import DrainOrder
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.roles.prefill_drain import PrefillDrain


def _drain() -> tuple[PrefillDrain, list[str]]:
    retired: list[str] = []
    return PrefillDrain("prefill-0", retired.append), retired


def test_it_retires_after_the_grace_period_once_the_calls_in_flight_are_answered():
    async def run() -> list[str]:
        drain, retired = _drain()
        drain.in_flight = 1
        drain.order(DrainOrder(grace_s=0.05))
        await asyncio.sleep(0.2)
        assert retired == []  # a call is still running
        drain.in_flight = 0
        await asyncio.sleep(0.1)
        return retired

    assert asyncio.run(run()) == ["drained"]


def test_a_cancel_within_the_grace_period_stops_it():
    async def run() -> list[str]:
        drain, retired = _drain()
        drain.order(DrainOrder(grace_s=0.1))
        drain.order(DrainOrder(grace_s=0.1, cancel=True))
        await asyncio.sleep(0.2)
        return retired

    assert asyncio.run(run()) == []


def test_a_cancel_after_the_grace_period_is_refused():
    async def run() -> None:
        drain, _ = _drain()
        drain.in_flight = 1
        drain.order(DrainOrder(grace_s=0.01))
        await asyncio.sleep(0.05)
        with pytest.raises(IllegalTransition, match="grace period is over"):
            drain.order(DrainOrder(grace_s=0.01, cancel=True))

    asyncio.run(run())
