"""``dsi drain`` of a decode with 32 streams running: after the grace period every request moves
with its KV (full pages pre-copied during the grace period) to the other decodes and finishes
there, token for token the undisturbed run; the drained process exits and the survivors' pools
return to baseline. A drain undone during its grace period releases what was pre-copied; a
drained idle prefill stops. Real processes; the router is the gateway's own ``DecodePool``.

The undisturbed run is the same 32 requests run again on the survivors, undrained (the engines
are batch-invariant, so a request's tokens do not depend on its batch). Cheap on purpose: the
tiny model, short outputs, mostly short prompts (a few span a full page, so that pre-copy has
pages to move). The other decodes are drained first with a long grace
period so that every request lands on decode-0, then undrained (which tests undrain too)."""

from __future__ import annotations

import asyncio
import json

import pytest

from dsi.cli.drain import ask_controller
from dsi.cli.main import main
from dsi.cli.status import fetch_instances
from dsi.engine.params import SamplingParams
from dsi.messages.control import Drain, Undrain
from dsi.roles.controller.lifecycle import IllegalTransition
from tests.roles.cluster import Client, Cluster, cluster_config
from tests.roles.test_decode_failover import Stream, add_decode, prompt
from tests.roles.test_disaggregation import assert_no_leaks

pytestmark = pytest.mark.slow

MAX_TOKENS = 56
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
SEEDED = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=1234)
SURVIVORS = ("decode-1", "decode-2")


def prompts() -> list[list[int]]:
    return [prompt(100 + i, 136 if i % 8 == 0 else 12 + i) for i in range(32)]  # 4 of them fill a page


async def until_precopied(client: Client, pages: int) -> None:
    for _ in range(300):
        if sum([(await client.stats(role)).precopied_pages for role in SURVIVORS]) >= pages:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("nothing was pre-copied")


async def test_a_drained_decode_moves_32_streams_with_their_kv_and_exits(procs, tmp_path, capsys):
    config = cluster_config(tmp_path, keep=("controller-0", "prefill-0", "decode-0", "decode-1"))
    add_decode(config, "decode-2")
    cluster = Cluster(config, procs)
    cluster.start()
    batch = prompts()
    sampling = [GREEDY if i % 2 == 0 else SEEDED for i in range(32)]
    controller = cluster.controller()
    async with Client(cluster) as client:
        for role in SURVIVORS:  # every request goes to decode-0
            await ask_controller(controller, None, Drain(role, 600.0), 10.0)
        await client.pool.refresh()
        assert client.pool.ready == ["decode-0"]
        streams = [Stream(client, f"r{i}", p, sampling[i]) for i, p in enumerate(batch)]
        for s in streams:
            await s.until(1)
        for role in SURVIVORS:
            await ask_controller(controller, None, Undrain(role), 10.0)
        # a drain cancelled after pre-copy began: the targets release what they received
        await ask_controller(controller, None, Drain("decode-0", 60.0), 10.0)
        await until_precopied(client, 4)
        assert (await ask_controller(controller, None, Undrain("decode-0"), 10.0)).state == "serving"
        await assert_no_leaks(client, SURVIVORS)
        info = await ask_controller(controller, None, Drain("decode-0", 2.0), 10.0)  # what `dsi drain` sends
        assert info.state == "draining"
        at_drain = [len(s.tokens) for s in streams]
        got = [await s.result() for s in streams]
        assert await asyncio.to_thread(cluster.running["decode-0"].wait, 60) == 0  # it exited by itself
        undrained = [Stream(client, f"u{i}", p, sampling[i]) for i, p in enumerate(batch)]  # on the survivors
        assert got == [await s.result() for s in undrained]
        assert max(at_drain) < MAX_TOKENS  # every request was unfinished when the drain began
        assert client.pool.migrations == 32 and client.pool.retries == 0  # moved, not re-run
        stats = [await client.stats(role) for role in SURVIVORS]
        assert sum(s.migrated_in for s in stats) == 32
        assert sum(s.precopied_pages for s in stats) >= 8  # the full pages, pre-copied by both drains
        await assert_no_leaks(client, ("prefill-0", *SURVIVORS))
        with pytest.raises(IllegalTransition, match="not draining"):
            await ask_controller(controller, None, Undrain("decode-1"), 10.0)
        # the commands themselves (their own event loop, in a thread)
        assert (
            await asyncio.to_thread(
                main, ["drain", "decode-1", "--grace", "30", "--json", "--controller", controller]
            )
            == 0
        )
        assert json.loads(capsys.readouterr().out)["state"] == "draining"
        assert (
            await asyncio.to_thread(main, ["undrain", "decode-1", "--json", "--controller", controller]) == 0
        )
        assert json.loads(capsys.readouterr().out)["state"] == "serving"
        assert await asyncio.to_thread(main, ["undrain", "decode-9", "--controller", controller]) == 1
        assert "unknown instance" in capsys.readouterr().err
        await ask_controller(controller, None, Drain("prefill-0", 0.0), 10.0)  # idle: it stops at once
        assert await asyncio.to_thread(cluster.running["prefill-0"].wait, 60) == 0
        table = {i.instance_id: i.state for i in (await fetch_instances(controller, None, 5.0)).instances}
        assert (table["decode-0"], table["prefill-0"], table["decode-1"]) == ("stopped", "stopped", "serving")
