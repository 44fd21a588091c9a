"""The gateway's instance pools without a cluster: the controller's table is handed in, the
instances are addresses nobody answers on."""

import asyncio
import errno
import time

import pytest
import zmq
import zmq.asyncio

from dsi.engine.params import SamplingParams
from dsi.errors import PeerLost
from dsi.messages.control import InstanceInfo, InstanceTable, Load, TransitionCount
from dsi.messages.gateway import Generate
from dsi.roles.entrypoint.backends import DecodePool, InstancePool, NoInstance
from dsi.transport.sockets import peers_context
from tests.dsi.cli.procs import free_port


def info(state: str, started_at: float = 1.0, address: str = "") -> InstanceInfo:
    return InstanceInfo("decode-0", "decode", "127.0.0.1", 4242, address, state, Load(), 0.0, started_at)


@pytest.fixture
async def pool():
    ctx = zmq.asyncio.Context()
    pool = DecodePool(f"tcp://127.0.0.1:{free_port()}", ctx, reroute_wait_s=0.5)
    tables: list[InstanceTable] = []

    async def ask(msg, timeout=None):  # the controller's answers, in order
        return tables.pop(0) if msg.role == "decode" else InstanceTable([])

    pool.decode._controller.ask = ask  # type: ignore[method-assign]
    pool.prefill._controller.ask = ask  # type: ignore[method-assign]
    yield pool, tables
    await pool.close()
    ctx.destroy(linger=0)


async def test_an_instance_the_controller_marks_dead_fails_the_streams_it_holds(pool):
    pool, tables = pool
    address = f"tcp://127.0.0.1:{free_port()}"  # a decode that no longer answers, connection or not
    tables += [
        InstanceTable([info("serving", address=address)]),
        InstanceTable([info("dead", address=address)]),
    ]
    await pool.decode.refresh()
    stream = pool.pick().peer.stream(Generate("r", [5, 6], SamplingParams()), timeout=30.0)
    item = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    await pool.decode.refresh()  # missed heartbeats: the controller says dead
    with pytest.raises(PeerLost, match="missed heartbeats"):
        await asyncio.wait_for(item, 5.0)
    await stream.aclose()
    assert pool.decode.ready == []


async def test_a_reroute_waits_a_bounded_time_for_a_decode_and_a_restarted_one_counts_again(pool):
    pool, tables = pool
    address = f"tcp://127.0.0.1:{free_port()}"
    tables += [InstanceTable([info("serving", 1.0, address)]), InstanceTable([info("serving", 2.0, address)])]
    await pool.decode.refresh()
    dead = {pool.pick().key}
    started = time.monotonic()
    with pytest.raises(NoInstance, match=r"within 0\.5s"):
        await pool._pick_decode(dead, wait=True)
    assert 0.5 <= time.monotonic() - started < 1.5
    with pytest.raises(NoInstance):
        await pool._pick_decode(dead, wait=False)  # a new request does not wait
    await pool.decode.refresh()  # the same id, started again
    assert (await pool._pick_decode(dead, wait=True)).info.started_at == 2.0


async def test_a_restarted_instance_at_the_same_address_gets_a_fresh_connection(pool):
    pool, tables = pool
    address = f"tcp://127.0.0.1:{free_port()}"
    tables += [InstanceTable([info("serving", 1.0, address)]), InstanceTable([info("serving", 2.0, address)])]
    await pool.decode.refresh()
    old = pool.pick().peer
    await pool.decode.refresh()  # the same id and address, started again
    new = pool.pick()
    assert new.peer is not old and new.info.started_at == 2.0
    assert old._closed  # the old run's connection, which may never come back, is closed


async def test_a_request_reads_the_prefills_first_when_only_the_decodes_are_known():
    ctx = zmq.asyncio.Context()
    pool = DecodePool(f"tcp://127.0.0.1:{free_port()}", ctx)
    prefill = InstanceInfo(
        "prefill-0", "prefill", "127.0.0.1", 4243, "tcp://127.0.0.1:1", "serving", Load(), 0.0, 1.0
    )

    async def ask(msg, timeout=None):  # the controller lists a serving decode and a serving prefill
        return InstanceTable(
            [info("serving", address="tcp://127.0.0.1:2") if msg.role == "decode" else prefill]
        )

    pool.decode._controller.ask = pool.prefill._controller.ask = ask  # type: ignore[method-assign]
    try:
        await pool.decode.refresh()  # the decode pool's loop came first
        assert pool.decode.ready == ["decode-0"] and not pool.prefill.refreshed
        await pool._know_instances()  # what a request does first
        assert pool.prefill.refreshed and pool.prefill.ready == ["prefill-0"]
    finally:
        await pool.close()
        ctx.destroy(linger=0)


async def test_a_draining_instance_gets_no_new_work_and_its_running_streams_go_on(pool):
    pool, tables = pool
    address = f"tcp://127.0.0.1:{free_port()}"
    tables += [InstanceTable([info(state, address=address)]) for state in ("ready", "serving", "draining")]
    await pool.decode.refresh()
    with pytest.raises(NoInstance, match="no serving decode"):  # ready = unassigned: not routed to
        pool.pick()
    await pool.decode.refresh()
    running = pool.pick()
    stream = running.peer.stream(Generate("r", [5, 6], SamplingParams()), timeout=30.0)
    item = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    await pool.decode.refresh()  # the operator drains it
    with pytest.raises(NoInstance):
        pool.pick()
    assert pool.decode.ready == []
    await asyncio.sleep(0.2)
    assert not item.done()  # the stream is still waiting on the same connection
    assert pool.decode._instances["decode-0"].peer is running.peer
    item.cancel()
    await asyncio.gather(item, return_exceptions=True)
    await stream.aclose()


async def test_an_instance_a_restarted_controller_does_not_list_yet_keeps_serving_for_a_grace_period(pool):
    pool, tables = pool
    pool.decode._unlisted_grace_s = 0.3
    address = f"tcp://127.0.0.1:{free_port()}"
    tables += [
        InstanceTable([info("serving", address=address)]),
        InstanceTable([]),
        InstanceTable([]),
        InstanceTable([]),
    ]
    await pool.decode.refresh()
    running = pool.pick()
    running.sent += 1  # as DecodePool.generate counts a request while it runs there
    stream = running.peer.stream(Generate("r", [5, 6], SamplingParams()), timeout=30.0)
    item = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    await pool.decode.refresh()  # a new controller that has not heard this decode's heartbeat yet
    assert pool.pick() is running and pool.decode.ready == ["decode-0"]  # new requests still go there
    await asyncio.sleep(0.35)
    await pool.decode.refresh()  # still not listed after the grace period: no new work
    with pytest.raises(NoInstance):
        pool.pick()
    assert not item.done() and pool.decode._instances["decode-0"].peer is running.peer  # its stream goes on
    item.cancel()
    await asyncio.gather(item, return_exceptions=True)
    await stream.aclose()
    running.sent -= 1
    await pool.decode.refresh()  # no request there any more: forgotten
    assert pool.decode._instances == {}


async def test_an_instance_whose_connection_dropped_gets_no_new_work_before_the_controller_says_dead(pool):
    pool, tables = pool
    address = f"tcp://127.0.0.1:{free_port()}"
    tables += [InstanceTable([info("serving", address=address)])]
    await pool.decode.refresh()
    peer = pool.pick().peer
    peer.welcome = object()  # type: ignore[assignment]  # it had said Hello; its connection is down now
    assert peer.away
    with pytest.raises(NoInstance):
        pool.pick()
    assert pool.decode.ready == []


async def test_the_controllers_transition_counter_is_rendered_for_metrics(pool):
    pool, tables = pool
    moves = [TransitionCount("decode", "none", "ready", 2), TransitionCount("prefill", "serving", "dead", 1)]
    tables.append(
        InstanceTable([info("serving", address=f"tcp://127.0.0.1:{free_port()}")], transitions=moves)
    )
    repairs = [
        "# TYPE dsi_stream_chunk_gaps_total counter",
        "dsi_stream_chunk_gaps_total 0",
        "# TYPE dsi_stream_chunk_duplicates_total counter",
        "dsi_stream_chunk_duplicates_total 0",
        "# TYPE dsi_stream_failed_moves_total counter",
        "dsi_stream_failed_moves_total 0",
    ]
    nothing_fetched = ["# TYPE dsi_instance_transitions_total counter", *repairs]
    assert pool.metric_lines() == nothing_fetched
    await pool.decode.refresh()
    assert pool.metric_lines() == [
        "# TYPE dsi_instance_transitions_total counter",
        'dsi_instance_transitions_total{role="decode",from="none",to="ready"} 2',
        'dsi_instance_transitions_total{role="prefill",from="serving",to="dead"} 1',
        *repairs,
    ]


async def test_a_pool_on_the_gateways_context_keeps_a_peer_to_each_of_400_instances():
    # ZeroMQ's default context holds 1023 sockets: about 340 Peers (a DEALER and two monitor PAIRs each).
    ctx = peers_context()
    pool = InstancePool(f"tcp://127.0.0.1:{free_port()}", ctx, role="decode")
    address = f"tcp://127.0.0.1:{free_port()}"  # nobody answers: only the sockets are counted
    table = InstanceTable(
        [
            InstanceInfo(f"decode-{i}", "decode", "127.0.0.1", 1, address, "serving", Load(), 0.0, 1.0)
            for i in range(400)
        ]
    )

    async def ask(msg, timeout=None):
        return table

    pool._controller.ask = ask  # type: ignore[method-assign]
    try:
        await pool.refresh()
        assert len(pool.ready) == 400
    finally:
        await pool.close()
        ctx.destroy(linger=0)


async def test_the_refresh_loop_goes_on_after_a_refresh_failed_with_an_unexpected_error():
    ctx = zmq.asyncio.Context()
    pool = InstancePool(f"tcp://127.0.0.1:{free_port()}", ctx, role="decode", refresh_s=0.01)
    listed = InstanceTable([info("serving", address=f"tcp://127.0.0.1:{free_port()}")])
    asks = 0

    async def ask(msg, timeout=None):  # the first refresh fails as a full socket table does
        nonlocal asks
        asks += 1
        if asks == 1:
            raise zmq.ZMQError(errno.EMFILE)
        return listed

    async def connect(timeout=None):
        return None

    pool._controller.ask = ask  # type: ignore[method-assign]
    pool._controller.connect = connect  # type: ignore[method-assign]
    try:
        await pool.start()
        deadline = time.monotonic() + 5.0
        while not pool.ready and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert pool.ready == ["decode-0"] and asks >= 2
    finally:
        await pool.close()
        ctx.destroy(linger=0)
