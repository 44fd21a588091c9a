"""LocalProvisioner: role instances as processes on this host, each replaced when it dies.

    start(id) --> spawn `command(id)` --READY--> keeper task:
                      wait for the exit --> RestartBackoff.after_exit --> sleep --> spawn ... READY
                            |                        |
                            |                        +-- None: given up (state failed)
                            +-- status 0: it stopped on its own (a drained instance retires,
                                or someone else sent SIGTERM): stopped, not replaced
    stop(id)  --> keeper told to stop --> SIGTERM the process group, SIGKILL after grace_s
    kill(id, pid) --> SIGKILL the process group now: a death like any other, replaced as above
                      (for a process that still exists but no longer serves, see dsi.provision.reaper)

Every transition is logged (a death as a warning, giving up as an error) and passed to
`on_change`. Nothing is shared between provisioners: each owns its instances. The /dev/shm
files a dead process created (``dsi.kvcache.shm.remove_files_of``) are removed once it exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dsi.kvcache.shm import remove_files_of
from dsi.provision.backoff import RestartBackoff, RestartPolicy
from dsi.provision.base import InstanceState, ProvisionedInstance, StartFailed
from dsi.provision.forkserver import ForkServerGone, RoleForker
from dsi.provision.process import RoleProcess, describe_exit

log = logging.getLogger(__name__)

_QUIET = ("starting", "ready", "stopping", "stopped")  # transitions logged at info


@dataclass(slots=True)
class _Slot:
    """One instance: its current process (if any) and restart history."""

    role_id: str
    backoff: RestartBackoff
    state: InstanceState = "stopped"  # until the first start
    proc: RoleProcess | None = None
    spawned_at: float = 0.0  # monotonic seconds
    restarts: int = 0
    last_exit: int | None = None
    stopping: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # ends a backoff sleep early
    keeper: asyncio.Task | None = None

    def snapshot(self) -> ProvisionedInstance:
        alive = self.proc is not None and self.proc.returncode is None
        pid = self.proc.pid if alive and self.proc is not None else None
        return ProvisionedInstance(self.role_id, self.state, pid, self.restarts, self.last_exit)


class LocalProvisioner:
    """`command(role_id)` is the argv of one instance's process (``dsi-role --config F --role ID``).

    policy: when to replace a dead instance and when to give up (see ``RestartPolicy``).
    grace_s: seconds between SIGTERM and SIGKILL when stopping.
    ready_timeout_s: seconds a process gets to print READY.
    on_change: called with the instance after every transition.
    clock: monotonic seconds (uptime and the restart window).
    forker: forks the roles it can from a preloaded process (dsi.provision.forkserver); None:
    every process is started afresh.
    """

    def __init__(
        self,
        command: Callable[[str], Sequence[str]],
        *,
        policy: RestartPolicy | None = None,
        grace_s: float = 10.0,
        ready_timeout_s: float = 60.0,
        on_change: Callable[[ProvisionedInstance], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        forker: RoleForker | None = None,
    ) -> None:
        if grace_s <= 0 or ready_timeout_s <= 0:
            raise ValueError(f"grace_s and ready_timeout_s must be > 0, got {grace_s} and {ready_timeout_s}")
        self._command = command
        self._policy = policy or RestartPolicy()
        self._grace_s = grace_s
        self._ready_timeout_s = ready_timeout_s
        self._on_change = on_change
        self._clock = clock
        self._forker = forker
        self._slots: dict[str, _Slot] = {}  # in start order

    async def start(self, role_id: str) -> ProvisionedInstance:
        old = self._slots.get(role_id)
        if old is not None and old.state not in ("stopped", "failed"):
            raise ValueError(f"{role_id} is already provisioned ({old.state})")
        self._slots.pop(role_id, None)
        slot = self._slots[role_id] = _Slot(role_id, RestartBackoff(self._policy))
        try:
            await self._launch(slot)
        except StartFailed as exc:
            self._move(slot, "failed", str(exc))
            raise
        slot.keeper = asyncio.get_running_loop().create_task(self._keep(slot), name=f"{role_id}.keeper")
        slot.keeper.add_done_callback(_log_crash)
        return slot.snapshot()

    async def stop(self, role_id: str) -> None:
        slot = self._slots.get(role_id)
        if slot is None:
            raise ValueError(f"{role_id} is not provisioned here")
        if slot.stopping:
            if slot.keeper is not None:
                await asyncio.gather(slot.keeper, return_exceptions=True)
            return
        slot.stopping = True
        slot.wake.set()
        final: InstanceState = "failed" if slot.state == "failed" else "stopped"
        if final == "stopped":
            self._move(slot, "stopping", "asked to stop")
        # The keeper sees `stopping` after its current step; a process it spawns meanwhile is
        # stopped by the keeper itself, and the one running now by us.
        if slot.proc is not None:
            await self._terminate(slot, slot.proc)
        if slot.keeper is not None:
            await asyncio.gather(slot.keeper, return_exceptions=True)
        if slot.proc is not None:
            await self._terminate(slot, slot.proc)
        if final == "stopped":
            self._move(slot, "stopped", "")

    def list(self) -> list[ProvisionedInstance]:
        return [slot.snapshot() for slot in self._slots.values()]

    def kill(self, role_id: str, pid: int, why: str) -> bool:
        """SIGKILL the instance's process if it is ``pid`` and still runs (its keeper then replaces
        it as after any death); False when ``pid`` is not the process running for ``role_id`` now."""
        slot = self._slots.get(role_id)
        proc = slot.proc if slot is not None else None
        if slot is None or slot.stopping or proc is None or proc.pid != pid or proc.returncode is not None:
            return False
        log.warning("%s: killing pid %d (%s)", role_id, pid, why)
        proc.kill()
        return True

    async def close(self) -> None:
        for role_id in reversed(list(self._slots)):
            await self.stop(role_id)
        if self._forker is not None:
            await self._forker.close()

    # ---- internals ---------------------------------------------------------------------------
    async def _launch(self, slot: _Slot) -> None:
        """Spawn the instance's process and wait for READY; StartFailed (the process stopped)."""
        self._move(slot, "starting", f"restart {slot.restarts}" if slot.restarts else "")
        slot.spawned_at = self._clock()
        spawning = asyncio.ensure_future(self._start_process(slot.role_id))
        try:
            proc = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            # The caller gave up (a stop signal during start-up), but the process may exist
            # already: keep it where stop() finds it, so it is not left running.
            with contextlib.suppress(StartFailed):
                slot.proc = await spawning
            raise
        slot.proc = proc
        if slot.stopping:
            await self._terminate(slot, proc)
            return
        try:
            await proc.ready(self._ready_timeout_s)
        except StartFailed:
            await self._terminate(slot, proc)
            if slot.stopping:
                return
            raise
        if not slot.stopping:
            self._move(slot, "ready", f"pid {proc.pid}")

    async def _start_process(self, role_id: str) -> RoleProcess:
        """Forked by the fork server where it can run the role, else started afresh (also when
        the fork server is gone: it is started again at the next fork)."""
        argv = self._command(role_id)
        if self._forker is not None and (args := self._forker.args_of(role_id, argv)) is not None:
            try:
                return RoleProcess(role_id, await self._forker.fork(args))
            except ForkServerGone as exc:
                log.warning("%s: %s; starting it afresh", role_id, exc)
        return await RoleProcess.spawn(role_id, argv)

    async def _keep(self, slot: _Slot) -> None:
        """Replace the instance each time it dies, until it is stopped or given up."""
        while not slot.stopping:
            assert slot.proc is not None
            code = await slot.proc.wait()
            if slot.stopping:
                return
            await slot.proc.close()
            _remove_shm(slot.role_id, slot.proc.pid)
            slot.last_exit = code
            uptime_s = self._clock() - slot.spawned_at
            delay = slot.backoff.after_exit(self._clock(), uptime_s)
            died = f"pid {slot.proc.pid} exited with {describe_exit(code)} after {uptime_s:.1f}s"
            if code == 0:  # it stopped on purpose (drained and retired, or a SIGTERM from elsewhere)
                self._move(slot, "stopped", f"{died}: it stopped on its own, so it is not replaced")
                return
            if delay is None:
                policy = self._policy
                self._move(
                    slot,
                    "failed",
                    f"{died}; giving up: {slot.backoff.recent_restarts} restarts within "
                    f"{policy.window_s:g}s (the cap is {policy.max_restarts})",
                )
                return
            self._move(slot, "backoff", f"{died}; replacing it in {delay:g}s")
            slot.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.wake.wait(), delay)
            if slot.stopping:
                return
            slot.restarts += 1
            try:
                await self._launch(slot)
            except StartFailed as exc:
                log.warning("%s: the replacement did not start: %s", slot.role_id, exc)

    async def _terminate(self, slot: _Slot, proc: RoleProcess) -> None:
        code = await proc.terminate(self._grace_s)
        _remove_shm(slot.role_id, proc.pid)  # after a SIGKILL past the grace period
        if proc is slot.proc:
            slot.last_exit = code

    def _move(self, slot: _Slot, state: InstanceState, why: str) -> None:
        before, slot.state = slot.state, state
        level = logging.INFO if state in _QUIET else logging.WARNING if state == "backoff" else logging.ERROR
        log.log(level, "%s: %s -> %s%s", slot.role_id, before, state, f" ({why})" if why else "")
        if self._on_change is not None:
            self._on_change(slot.snapshot())


def _remove_shm(role_id: str, pid: int) -> None:
    """A killed process leaves the /dev/shm files it created (pooled buffers, receive slabs):
    nobody else would ever unlink them."""
    freed, files = remove_files_of(pid)
    if files:
        log.info("%s: removed %d /dev/shm files (%d bytes) that pid %d left", role_id, files, freed, pid)


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped replacing its instance", task.get_name(), exc_info=task.exception())
