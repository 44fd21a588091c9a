"""What goes wrong, on every backend: timeouts free regions, unknown ids and cancelled transfers
are refused, wrong sizes are rejected before anything is sent, a closed receiver fails its sender."""

from __future__ import annotations

import asyncio
import time

import msgspec
import numpy as np
import pytest

from dsi.errors import Cancelled
from dsi.transport.kv import TransferFailed, TransferTimeout
from tests.transport.kv.planes import BACKENDS, plane_pair

SIZE = 1 << 20


@pytest.mark.parametrize("backend", BACKENDS)
async def test_timeout_fails_the_inbound_and_frees_its_region(backend):
    async with plane_pair(backend) as (receiver, _):
        inbound = receiver.expect("late", SIZE, 0.2)
        assert receiver.stats.regions_live == 1 and receiver.stats.bytes_live == SIZE
        with pytest.raises(TransferTimeout):
            await inbound.wait()
        await asyncio.sleep(0.01)
        stats = receiver.stats
        assert (stats.regions_live, stats.bytes_live, stats.timed_out, stats.failed) == (0, 0, 1, 1)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_unknown_transfer_id_is_refused(backend):
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("real", SIZE, 10.0)
        fake = msgspec.structs.replace(inbound.target, transfer_id="no-such-id")
        with pytest.raises(TransferFailed):
            await sender.send(fake, [bytes(SIZE)], 5.0)
        assert sender.stats.failed == 1
        await sender.send(inbound.target, [bytes(SIZE)], 5.0)  # the real one still goes through
        assert len(await inbound.wait()) == SIZE
        inbound.release()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_cancel_fails_the_inbound_and_refuses_its_sender(backend):
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("c", SIZE, 10.0)
        receiver.cancel("c")
        receiver.cancel("c")  # idempotent
        with pytest.raises(Cancelled):
            await inbound.wait()
        assert receiver.stats.regions_live == 0
        with pytest.raises(TransferFailed):
            await sender.send(inbound.target, [bytes(SIZE)], 5.0)
        inbound.release()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_wrong_size_is_a_value_error_and_sends_nothing(backend):
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("w", SIZE, 10.0)
        with pytest.raises(ValueError):
            await sender.send(inbound.target, [bytes(SIZE - 1)], 5.0)
        with pytest.raises(ValueError):
            await sender.send(inbound.target, [np.zeros((4, 4), np.uint8)[:, :2]], 5.0)  # not contiguous
        await sender.send(inbound.target, [bytes(SIZE)], 5.0)
        await inbound.wait()
        inbound.release()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_release_before_completion_cancels(backend):
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("r", SIZE, 10.0)
        inbound.release()
        inbound.release()
        assert receiver.stats.regions_live == 0
        with pytest.raises(TransferFailed):
            await sender.send(inbound.target, [bytes(SIZE)], 5.0)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_cancelling_the_sender_fails_the_inbound(backend):
    data = np.ones(64 << 20, np.uint8)
    async with plane_pair(backend, chunk_bytes=1 << 20) as (receiver, sender):
        inbound = receiver.expect("s", data.nbytes, 10.0)
        task = asyncio.create_task(sender.send(inbound.target, [data], 10.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(TransferFailed):
            await asyncio.wait_for(inbound.wait(), 5.0)
        for _ in range(100):
            if receiver.stats.regions_live == 0:
                break
            await asyncio.sleep(0.05)
        assert receiver.stats.regions_live == 0


@pytest.mark.parametrize("backend", BACKENDS)
async def test_closed_receiver_fails_pending_inbounds_and_its_senders(backend):
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("x", SIZE, 10.0)
        target = inbound.target
        await receiver.close()
        with pytest.raises(TransferFailed):
            await inbound.wait()
        assert receiver.stats.regions_live == 0
        started = time.monotonic()
        with pytest.raises((TransferFailed, TransferTimeout)):
            await sender.send(target, [bytes(SIZE)], 0.5)
        assert time.monotonic() - started < 2.5
