"""Migration: a draining decode moves its running requests, with their KV, to other decodes.

    DrainOrder(grace_s) --> targets: the other serving decodes (the controller's table)
      grace period:  every ``precopy_interval_s``: copy the full pages each request filled since
                     the last round to its target (``Precopy``), while it keeps decoding
      switch:        export every request between two steps, without the pages its target holds
                     (``export_batch``); ``MigrateIn`` per request, then its tail (pages written
                     since, SWA rings, compressor partial state) over the data plane, all at once;
                     each client stream ends with ``finish="migrated"`` naming the new owner
      then:          once no stream is left here, the role retires (the process exits)

A request that cannot move (no target, a target that refused or failed) ends its stream with
``moved_to=""``: the entrypoint re-runs it from its prompt and checks the re-run against the
tokens delivered. Each request moves on its own ``MigrateIn``, so one that a target refuses
re-runs while the others still move; one whose import then fails at the target is re-run by
the entrypoint when its ``Resume`` there finds nothing. One that cannot be exported (preempted, waiting for pages) is tried again for
``switch_tries`` rounds, then finishes here before the role retires. An undrain (``cancel``) is
refused once the switch began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsi.balance.migration import place
from dsi.errors import DsiError
from dsi.messages.control import InstanceTable, ListInstances
from dsi.messages.migrate import Migrant, MigrateCancel, MigrateIn, MigrationLeases, Precopy, PrecopyPage
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.roles.engine_role import lease_target
from dsi.transport.client import Peer

if TYPE_CHECKING:
    from dsi.roles.decode.actor import DecodeActor

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MigrationReport:
    """What one drain did; seconds are wall time."""

    precopied_pages: int = 0
    tail_pages: int = 0
    moved: int = 0
    rerun: int = 0
    switch_s: float = 0.0  # end of the grace period -> every request's tail delivered


class Migration:
    precopy_interval_s = 0.2
    switch_tries = 50  # rounds of the switch for requests that could not be exported yet (preempted)

    def __init__(self, role: DecodeActor, grace_s: float) -> None:
        self.role = role
        self.grace_s = grace_s
        self.switching = False
        self.report = MigrationReport()
        self._held: dict[str, int] = {}  # request id -> pages its target holds
        self._target: dict[str, str] = {}  # request id -> target control address
        self._destinations: dict[str, asyncio.Future[str]] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.role.name}.drain")

    async def cancel(self) -> None:
        """Undrain: stop before the switch and release what the targets hold."""
        if self.switching:
            raise IllegalTransition(f"{self.role.name}: the grace period is over; its requests are moving")
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        by_target: dict[str, list[str]] = {}
        for request_id, target in self._target.items():
            by_target.setdefault(target, []).append(request_id)
        for target, ids in by_target.items():
            try:
                await (await self._peer(target)).ask(MigrateCancel(ids), timeout=5.0)
            except DsiError as exc:
                log.warning("%s: %s did not take the cancel: %s", self.role.name, target, exc)

    async def destination(self, request_id: str) -> str:
        """Where a request exported by the switch went ("" : nowhere, re-run it)."""
        return await self._future(request_id)

    # ---- the drain ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        targets = await self._targets()
        while loop.time() < deadline:
            if targets:
                try:
                    await self._precopy_round(targets)
                except Exception:  # a failed round only means more to move at the switch
                    log.exception("%s: pre-copy round failed", self.role.name)
            await asyncio.sleep(max(0.0, min(self.precopy_interval_s, deadline - loop.time())))
        self.switching = True
        t0 = time.perf_counter()
        for _ in range(self.switch_tries):
            if not self.role.live:
                break
            await self._switch(targets)
            if self.role.live:
                await asyncio.sleep(0.1)
        self.report.switch_s = time.perf_counter() - t0
        log.info("%s: drained: %s", self.role.name, self.report)
        while self.role.live:  # the last chunks reach the entrypoints
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        self.role.retire("drained")

    async def _targets(self) -> dict[str, int]:
        """Serving decodes other than this one: control address -> KV tokens they hold."""
        controller = self.role.settings.controller
        if not controller:
            return {}
        try:
            table: InstanceTable = await (await self._peer(controller)).ask(
                ListInstances("decode"), timeout=5.0
            )
        except DsiError as exc:
            log.warning("%s: no instance table from the controller: %s", self.role.name, exc)
            return {}
        return {
            i.address: i.load.kv_tokens
            for i in table.instances
            if i.state == "serving" and i.instance_id != self.role.name
        }

    def _place(self, targets: dict[str, int]) -> None:
        new = {rid: meta.kv_tokens for rid, meta in self.role.live.items() if rid not in self._target}
        if new and targets:
            self._target.update(place(new, targets))

    async def _precopy_round(self, targets: dict[str, int]) -> None:
        self._place(targets)
        ids = [rid for rid in self.role.live if rid in self._target]
        assert self.role.service is not None
        copies = await asyncio.gather(
            *(self.role.service.full_pages_of(rid, self._held.get(rid, 0)) for rid in ids),
            return_exceptions=True,
        )
        by_target: dict[str, list[tuple[str, object]]] = {}
        for rid, pages in zip(ids, copies, strict=True):
            if isinstance(pages, BaseException) or not pages.shape[0]:  # gone, preempted, or nothing new
                continue
            by_target.setdefault(self._target[rid], []).append((rid, pages))
        await asyncio.gather(*(self._precopy_to(t, items) for t, items in by_target.items()))

    async def _precopy_to(self, target: str, items: list) -> None:
        expires = self.role.settings.lease_timeout_s
        call = Precopy(
            [PrecopyPage(rid, self._held.get(rid, 0), pages.shape[0]) for rid, pages in items], expires
        )
        try:
            answer: MigrationLeases = await (await self._peer(target)).ask(call, timeout=expires)
            await asyncio.gather(
                *(
                    self.role.data.send(lease_target(lease), [pages.numpy()], timeout_s=expires)
                    for lease, (_, pages) in zip(answer.leases, items, strict=True)
                )
            )
        except DsiError as exc:
            log.warning("%s: pre-copy to %s failed: %s", self.role.name, target, exc)
            for rid, _ in items:  # copy these from scratch elsewhere? keep it simple: move them whole there
                self._target.pop(rid, None)
                self._held.pop(rid, None)
            return
        for rid, pages in items:
            self._held[rid] = self._held.get(rid, 0) + pages.shape[0]
            self.report.precopied_pages += pages.shape[0]

    async def _switch(self, targets: dict[str, int]) -> None:
        self._place(targets)
        assert self.role.service is not None
        ids = list(self.role.live)
        states = await self.role.service.export_batch({rid: self._held.get(rid, 0) for rid in ids})
        by_target: dict[str, list] = {}
        for rid, state in states.items():
            if isinstance(state, DsiError):
                continue  # not running now (preempted): the next round
            target = self._target.get(rid, "")
            if not target:
                self._settle(rid, "")
                continue
            by_target.setdefault(target, []).append((rid, state))
        await asyncio.gather(*(self._move(t, rid, s) for t, items in by_target.items() for rid, s in items))

    async def _move(self, target: str, rid: str, s) -> None:
        """Move one exported request (``s``: its state) to ``target``; on any failure it re-runs."""
        expires = self.role.settings.lease_timeout_s
        meta = self.role.live.get(rid)
        migrant = Migrant(
            rid,
            s.prompt,
            s.output,
            s.logprobs,
            s.params,
            s.seed,
            s.consumer_start,
            s.num_computed,
            s.num_cached,
            s.replay_start,
            self._held.get(rid, 0),
            s.pages.shape[0],
            meta.traffic_class if meta else "chatbot",
            meta.cached_tokens if meta else 0,
            list(s.image_spans),
        )
        try:
            answer: MigrationLeases = await (await self._peer(target)).ask(
                MigrateIn([migrant], expires), timeout=expires
            )
            assert self.role.data is not None
            (lease,) = answer.leases
            await self.role.data.send(lease_target(lease), s.to_parts(), timeout_s=expires)
        except Exception as exc:
            log.warning("%s: moving %s to %s failed (%s); it re-runs", self.role.name, rid, target, exc)
            self._settle(rid, "")
            return
        self.report.tail_pages += s.pages.shape[0]
        self._settle(rid, target)

    def _settle(self, request_id: str, target: str) -> None:
        future = self._future(request_id)
        if not future.done():
            future.set_result(target)
        if target:
            self.report.moved += 1
            self.role.counters.migrated_out += 1
        else:
            self.report.rerun += 1

    def _future(self, request_id: str) -> asyncio.Future[str]:
        future = self._destinations.get(request_id)
        if future is None:
            future = self._destinations[request_id] = asyncio.get_running_loop().create_future()
        return future

    async def _peer(self, address: str) -> Peer:
        return await self.role.peer(address, 5.0)
