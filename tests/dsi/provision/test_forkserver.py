"""The fork server with real roles: a forked prefill under a LocalProvisioner, replaced through a
new fork server when the old one dies, and which roles are forked at all."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from dsi.cli.serve import role_command
from dsi.provision import LocalProvisioner
from dsi.provision.forkserver import RoleForker, forkable
from dsi.provision.process import role_environment
from tests.dsi.cli.procs import gone, local_config, parent_pid, wait_until
from tests.dsi.provision.test_local import FAST, Recorder


def test_only_engine_roles_on_dsis_engine_run_by_this_interpreter_are_forked():
    argv = [sys.executable, "-P", "-m", "dsi.cli.role", "--config", "c.toml", "--role", "decode-0"]
    assert forkable(argv, "decode", "dsi") == ["--config", "c.toml", "--role", "decode-0"]
    assert forkable(argv, "prefill", None) == argv[4:]
    assert forkable(argv, "decode", "vllm") is None  # vLLM's own imports, often another venv
    assert forkable(argv, "controller", None) is None  # torch-free roles stay torch-free
    assert forkable(["/other/python", *argv[1:]], "decode", "dsi") is None
    assert forkable([sys.executable, "-m", "dsi.cli.main", "serve"], "decode", "dsi") is None


async def test_a_forked_role_is_replaced_through_a_new_fork_server_when_its_fork_server_dies(tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "prefill-0"])
    kinds = {"controller-0": "controller", "prefill-0": "prefill"}
    forker = RoleForker(
        lambda role_id, argv: forkable(argv, kinds[role_id], None), role_environment(os.environ)
    )
    recorder = Recorder()
    prov = LocalProvisioner(
        lambda role_id: role_command(str(config), role_id, None),
        policy=FAST,
        ready_timeout_s=60.0,
        on_change=recorder,
        forker=forker,
    )
    servers: list[int] = []
    try:
        controller = await prov.start("controller-0")
        first = await prov.start("prefill-0")
        servers.append(forker.server_pid or 0)
        assert parent_pid(controller.pid) == os.getpid()  # started afresh
        assert parent_pid(first.pid) == servers[0] != os.getpid()
        with open(f"/proc/{first.pid}/comm") as comm:
            assert comm.read().strip() == "dsi:prefill-0"

        os.kill(servers[0], signal.SIGKILL)  # the kernel sends the prefill SIGTERM
        await recorder.until("prefill-0", "ready", count=2, timeout=60.0)
        now = next(i for i in prov.list() if i.role_id == "prefill-0")
        servers.append(forker.server_pid or 0)
        assert now.pid != first.pid and gone(first.pid)
        assert now.last_exit == -signal.SIGTERM  # not 0: a role that retires is not replaced
        assert servers[1] not in (0, servers[0]) and parent_pid(now.pid) == servers[1]

        await prov.stop("prefill-0")  # SIGTERM: a graceful stop, its status from the fork server
        assert next(i for i in prov.list() if i.role_id == "prefill-0").last_exit == 0
        assert gone(now.pid)
    finally:
        await prov.close()
    await asyncio.to_thread(wait_until, lambda: all(gone(pid) for pid in servers if pid), timeout=10)
