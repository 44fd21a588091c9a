"""LocalProvisioner with real processes: a stand-in role (fast) and a real dsi-role controller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dsi.provision import LocalProvisioner, ProvisionedInstance, RestartPolicy, StartFailed
from tests.dsi.cli.procs import gone, instances, local_config, python_module

FAKE_ROLE = Path(__file__).with_name("fake_role.py")
FAST = RestartPolicy(
    initial_s=0.05, factor=2.0, max_s=0.2, stable_after_s=60.0, max_restarts=3, window_s=60.0
)


class Recorder:
    """Every transition a provisioner reports, with the time it came, and every pid it ran."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, ProvisionedInstance]] = []
        self.pids: set[int] = set()
        self.changed = asyncio.Event()

    def __call__(self, inst: ProvisionedInstance) -> None:
        self.seen.append((time.monotonic(), inst))
        if inst.pid is not None:
            self.pids.add(inst.pid)
        self.changed.set()

    def states(self, role_id: str) -> list[str]:
        return [inst.state for _, inst in self.seen if inst.role_id == role_id]

    async def until(self, role_id: str, state: str, count: int = 1, timeout: float = 30.0) -> None:
        """Wait until `role_id` has entered `state` `count` times."""
        async with asyncio.timeout(timeout):
            while self.states(role_id).count(state) < count:
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def provisioner(tmp_path: Path, mode: str = "serve", **kw):
    """A provisioner of stand-in roles running `mode` (`{role_id: mode}` or one for all), closed
    on exit; any process it ran that is still alive after that is SIGKILLed."""
    events = tmp_path / "events"

    def command(role_id: str) -> list[str]:
        role_mode = mode if isinstance(mode, str) else mode[role_id]
        return [sys.executable, str(FAKE_ROLE), role_id, role_mode, str(events)]

    recorder = Recorder()
    kw.setdefault("policy", FAST)
    kw.setdefault("ready_timeout_s", 30.0)
    prov = LocalProvisioner(command, on_change=recorder, **kw)
    try:
        yield prov, recorder, events
    finally:
        await prov.close()
        for pid in recorder.pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


async def test_sigkilled_instance_is_replaced_with_a_new_pid(tmp_path):
    async with provisioner(tmp_path) as (prov, rec, _):
        first = await prov.start("decode-0")
        assert (first.role_id, first.state, first.restarts) == ("decode-0", "ready", 0)
        os.kill(first.pid, signal.SIGKILL)
        await rec.until("decode-0", "ready", count=2)
        [now] = prov.list()
        assert (now.role_id, now.state, now.restarts, now.last_exit) == ("decode-0", "ready", 1, -9)
        assert now.pid != first.pid and gone(first.pid) and not gone(now.pid)
        assert rec.states("decode-0") == ["starting", "ready", "backoff", "starting", "ready"]


async def test_the_shm_files_of_a_dead_or_stopped_instance_are_removed(tmp_path):
    def files(pid: int) -> list[str]:
        return [name for name in os.listdir("/dev/shm") if name.startswith(f"dsi-fakerole-{pid}-")]

    async with provisioner(tmp_path, "shm") as (prov, rec, _):
        first = await prov.start("prefill-0")
        assert first.pid is not None and len(files(first.pid)) == 1
        os.kill(first.pid, signal.SIGKILL)
        await rec.until("prefill-0", "ready", count=2)
        [now] = prov.list()
        assert now.pid is not None and files(first.pid) == [] and len(files(now.pid)) == 1
        await prov.stop("prefill-0")  # exits on SIGTERM without unlinking it
        assert files(now.pid) == []


async def test_delays_double_between_replacements(tmp_path):
    doubling = RestartPolicy(initial_s=0.2, max_s=1.0, max_restarts=5)
    async with provisioner(tmp_path, policy=doubling) as (prov, rec, _):
        await prov.start("decode-0")
        for round_ in (2, 3, 4):
            os.kill(prov.list()[0].pid, signal.SIGKILL)
            await rec.until("decode-0", "ready", count=round_)
        waits = []
        for (t0, a), (t1, b) in zip(rec.seen, rec.seen[1:], strict=False):
            if (a.state, b.state) == ("backoff", "starting"):
                waits.append(t1 - t0)
        assert len(waits) == 3
        for waited, delay in zip(waits, (0.2, 0.4, 0.8), strict=True):
            assert delay <= waited < delay + 0.5


async def test_instance_that_dies_at_once_every_time_is_given_up(tmp_path, caplog):
    async with provisioner(tmp_path, mode="crash") as (prov, rec, _):
        await prov.start("prefill-1")
        await rec.until("prefill-1", "failed")
        [inst] = prov.list()
        assert (inst.state, inst.pid, inst.restarts, inst.last_exit) == ("failed", None, 3, 1)
        assert rec.states("prefill-1").count("backoff") == 3
        await asyncio.sleep(0.5)  # and nothing more happens
        assert prov.list() == [inst]
    assert "prefill-1: ready -> failed (pid " in caplog.text
    assert "giving up: 3 restarts within 60s (the cap is 3)" in caplog.text


async def test_an_instance_that_exits_with_status_0_is_stopped_not_replaced(tmp_path, caplog):
    """A drained dsi-role retires and exits 0: the provisioner leaves it stopped, and a later
    start (an autoscaler's) runs it again."""
    caplog.set_level(logging.INFO, logger="dsi.provision.local")
    async with provisioner(tmp_path, mode="exit") as (prov, rec, _):
        first = await prov.start("decode-1")
        await rec.until("decode-1", "stopped")
        await asyncio.sleep(0.3)  # longer than the backoff: no replacement comes
        [inst] = prov.list()
        assert (inst.state, inst.pid, inst.restarts, inst.last_exit) == ("stopped", None, 0, 0)
        assert rec.states("decode-1") == ["starting", "ready", "stopped"]
        again = await prov.start("decode-1")
        assert again.state == "ready" and again.pid != first.pid
    assert "it stopped on its own, so it is not replaced" in caplog.text


async def test_replacements_that_never_get_ready_count_as_deaths(tmp_path):
    async with provisioner(tmp_path, mode="once") as (prov, rec, _):
        first = await prov.start("kvstore-0")
        os.kill(first.pid, signal.SIGKILL)
        await rec.until("kvstore-0", "failed")
        [inst] = prov.list()
        assert (inst.restarts, inst.last_exit) == (3, 1)
        assert rec.states("kvstore-0").count("ready") == 1


async def test_a_first_start_that_fails_raises(tmp_path):
    (tmp_path / "decode-0.started").touch()  # "once" mode: this is not the first run
    async with provisioner(tmp_path, mode="once") as (prov, _, _):
        with pytest.raises(
            StartFailed, match=r"decode-0 \(pid \d+\) exited with status 1 before it was READY"
        ):
            await prov.start("decode-0")
        assert [(i.state, i.last_exit) for i in prov.list()] == [("failed", 1)]


async def test_stop_stops_the_instance_and_does_not_replace_it(tmp_path):
    async with provisioner(tmp_path) as (prov, _, events):
        a = await prov.start("prefill-0")
        b = await prov.start("prefill-1")
        await prov.stop("prefill-0")
        assert gone(a.pid) and not gone(b.pid)
        assert events.read_text() == "stopped prefill-0\n"
        await asyncio.sleep(0.3)  # longer than FAST's first delay
        assert [(i.role_id, i.state, i.pid, i.restarts) for i in prov.list()] == [
            ("prefill-0", "stopped", None, 0),
            ("prefill-1", "ready", b.pid, 0),
        ]
        await prov.stop("prefill-0")  # again: nothing to do


async def test_close_stops_in_reverse_start_order(tmp_path):
    async with provisioner(tmp_path) as (prov, _, events):
        ids = ["controller-0", "kvstore-0", "decode-0"]
        pids = [(await prov.start(role_id)).pid for role_id in ids]
        await prov.close()
        assert events.read_text().split("\n")[:-1] == [f"stopped {i}" for i in reversed(ids)]
        assert all(gone(pid) for pid in pids)
        assert {i.state for i in prov.list()} == {"stopped"}


async def test_stop_during_backoff_cancels_the_replacement(tmp_path):
    slow = RestartPolicy(initial_s=30.0, max_s=30.0)
    async with provisioner(tmp_path, policy=slow) as (prov, rec, _):
        first = await prov.start("decode-1")
        os.kill(first.pid, signal.SIGKILL)
        await rec.until("decode-1", "backoff")
        started = time.monotonic()
        await prov.stop("decode-1")
        assert time.monotonic() - started < 5.0
        assert rec.states("decode-1")[-2:] == ["stopping", "stopped"]
        assert rec.states("decode-1").count("starting") == 1


async def test_an_instance_that_ignores_sigterm_is_killed_after_grace(tmp_path):
    async with provisioner(tmp_path, mode="ignore-term", grace_s=0.5) as (prov, _, _):
        inst = await prov.start("decode-0")
        started = time.monotonic()
        await prov.stop("decode-0")
        assert 0.5 <= time.monotonic() - started < 5.0
        assert gone(inst.pid)
        assert prov.list()[0].last_exit == -signal.SIGKILL


async def test_a_start_cancelled_before_ready_leaves_nothing_running(tmp_path):
    async with provisioner(tmp_path, mode="silent") as (prov, _, events):
        starting = asyncio.ensure_future(prov.start("decode-0"))
        async with asyncio.timeout(10):
            while not (tmp_path / "decode-0.started").exists():
                await asyncio.sleep(0.02)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        [inst] = prov.list()
        assert inst.state == "starting" and inst.pid is not None
        await prov.close()
        assert gone(inst.pid) and events.read_text() == "stopped decode-0\n"
        assert prov.list()[0].state == "stopped"


async def test_a_silent_process_is_not_ready_after_the_timeout(tmp_path):
    async with provisioner(tmp_path, mode="silent", ready_timeout_s=0.5) as (prov, _, events):
        with pytest.raises(StartFailed, match=r"was not READY within 0.5s"):
            await prov.start("decode-0")
        assert events.read_text() == "stopped decode-0\n"  # stopped, not left behind


@pytest.mark.slow
async def test_a_killed_dsi_role_controller_comes_back_and_is_ready(tmp_path):
    config = local_config(tmp_path, keep=["controller-0"])
    recorder = Recorder()

    def command(role_id: str) -> list[str]:
        return python_module("dsi.cli.role", "--config", str(config), "--role", role_id)

    prov = LocalProvisioner(command, policy=FAST, on_change=recorder)
    try:
        first = await prov.start("controller-0")
        listed = await asyncio.to_thread(instances, "--config", str(config))
        assert (listed["controller-0"]["pid"], listed["controller-0"]["state"]) == (first.pid, "serving")
        os.kill(first.pid, signal.SIGKILL)
        await recorder.until("controller-0", "ready", count=2, timeout=60.0)
        [again] = prov.list()
        assert again.pid != first.pid and again.restarts == 1
        listed = await asyncio.to_thread(instances, "--config", str(config))
        assert (listed["controller-0"]["pid"], listed["controller-0"]["state"]) == (again.pid, "serving")
    finally:
        await prov.close()
        for pid in recorder.pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert all(gone(pid) for pid in recorder.pids)
