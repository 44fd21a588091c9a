"""DeadReaper with a real LocalProvisioner (stand-in roles) and the controller's table handed in:
a process the controller lists as dead is killed and replaced; a dead entry of an earlier run,
or of a process that is not the provisioner's, kills nothing."""

from __future__ import annotations

import os
import signal

from dsi.messages.control import InstanceInfo, InstanceTable, ListInstances, Load
from dsi.provision.reaper import DeadReaper
from tests.dsi.cli.procs import gone
from tests.dsi.provision.test_local import provisioner


class Controller:
    """Answers ListInstances with ``table``."""

    def __init__(self) -> None:
        self.table: list[InstanceInfo] = []

    async def connect(self, timeout: float) -> None:
        pass

    async def ask(self, msg: ListInstances, timeout: float) -> InstanceTable:
        return InstanceTable(self.table)


def info(role_id: str, pid: int, state: str) -> InstanceInfo:
    return InstanceInfo(role_id, role_id.rsplit("-", 1)[0], "127.0.0.1", pid, "", state, Load(), 3.5, 1.0)


async def test_a_stopped_process_declared_dead_is_killed_and_replaced(tmp_path, caplog):
    async with provisioner(tmp_path) as (prov, rec, _):
        first = await prov.start("decode-0")
        other = await prov.start("decode-1")
        os.kill(first.pid, signal.SIGSTOP)  # exists, beats no more
        controller = Controller()
        controller.table = [info("decode-0", first.pid, "dead"), info("decode-1", other.pid, "serving")]
        reaper = DeadReaper(prov, controller, every_s=0.05)
        await reaper.step()
        assert reaper.killed == [("decode-0", first.pid)]
        await rec.until("decode-0", "ready", count=2)
        now = {inst.role_id: inst for inst in prov.list()}
        assert now["decode-0"].pid != first.pid and now["decode-0"].last_exit == -signal.SIGKILL
        assert gone(first.pid) and now["decode-1"].pid == other.pid  # the serving one is left alone
        await reaper.step()  # the old run is still listed dead: its pid runs no more, nothing is killed
        assert reaper.killed == [("decode-0", first.pid)] and not gone(now["decode-0"].pid)
    assert f"decode-0: killing pid {first.pid} (the controller declared it dead" in caplog.text


async def test_a_dead_entry_that_names_no_process_of_the_provisioner_kills_nothing(tmp_path):
    async with provisioner(tmp_path) as (prov, _, _):
        inst = await prov.start("prefill-0")
        controller = Controller()
        controller.table = [info("prefill-0", inst.pid + 100_000, "dead"), info("decode-9", inst.pid, "dead")]
        reaper = DeadReaper(prov, controller, every_s=0.05)
        await reaper.step()
        assert reaper.killed == [] and prov.list()[0].pid == inst.pid and not gone(inst.pid)
