"""Arrivals: the receiving end of live migration on a decode instance.

Per migrated request, one lease that owns its reservation (pages + a state slot), its
receive regions and, once imported, the engine stream, released in one place::

    Precopy  --> reserve / grow, expect pages --(data plane)--> write_pages     (held += count)
    MigrateIn --> grow, expect the tail ------(data plane)--> import (held pages + tail) --> pump
    Resume   --> the first chunk repeats every token so far, then the pump's outputs
    expiry   --> no MigrateIn / Resume within expires_in_s: released (and the request aborted)

The pump reads the engine stream from the import on, so the request decodes at once, before
the entrypoint's ``Resume`` arrives; its outputs wait in a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from dsi.engine import RequestOutput, RequestState, Reservation
from dsi.errors import DsiError, InvalidRequest
from dsi.messages.handoff import KvLease
from dsi.messages.migrate import Migrant, MigrateIn, MigrationLeases, Precopy
from dsi.transport.kv import Inbound
from dsi.transport.kv.ids import transfer_id as new_transfer_id

if TYPE_CHECKING:
    from dsi.roles.engine_role import EngineRole

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Arrival:
    request_id: str
    reservation: Reservation
    held: int = 0  # leading pages written (pre-copied)
    writes: list[asyncio.Task] = field(default_factory=list)  # pre-copies landing
    inbounds: list[Inbound] = field(default_factory=list)
    migrant: Migrant | None = None
    imported: asyncio.Future | None = None  # set once the tail is imported (or failed)
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)  # RequestOutput | DsiError from the pump
    pump: asyncio.Task | None = None
    expiry: asyncio.TimerHandle | None = None
    resumed: bool = False


class Arrivals:
    """Migrated requests arriving at ``role`` (its service and data plane)."""

    def __init__(self, role: EngineRole) -> None:
        self.role = role
        self._arrivals: dict[str, _Arrival] = {}

    def __len__(self) -> int:
        return len(self._arrivals)

    async def precopy(self, msg: Precopy) -> MigrationLeases:
        leases = []
        for item in msg.pages:
            arrival = await self._get(item.request_id, msg.expires_in_s)
            if item.start < arrival.held:
                raise InvalidRequest(f"{item.request_id}: pages from {item.start} are already held")
            await self._service.grow_reservation(arrival.reservation, item.start + item.count)
            nbytes = item.count * self.role.shape.page_bytes
            inbound = self._expect(arrival, f"pages{item.start}", nbytes, msg.expires_in_s)
            arrival.writes.append(
                asyncio.get_running_loop().create_task(
                    self._write_pages(arrival, inbound, item.start, item.count)
                )
            )
            leases.append(self._lease(inbound, item.count, msg.expires_in_s))
        return MigrationLeases(leases)

    async def migrate_in(self, msg: MigrateIn) -> MigrationLeases:
        leases = []
        for m in msg.migrants:
            arrival = await self._get(m.request_id, msg.expires_in_s)
            await asyncio.gather(*arrival.writes, return_exceptions=True)
            if arrival.held < m.held or arrival.migrant is not None:
                self.release(m.request_id)
                raise InvalidRequest(
                    f"{m.request_id}: {arrival.held} pages arrived, the sender counts {m.held}"
                )
            try:
                await self._service.grow_reservation(arrival.reservation, m.held + m.num_blocks)
            except InvalidRequest:
                self.release(m.request_id)
                raise
            layout = self.role.shape.state_layout(m.num_blocks, sum(n for _, n, _ in m.images))
            inbound = self._expect(arrival, "tail", layout.nbytes, msg.expires_in_s)
            arrival.migrant = m
            arrival.imported = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().create_task(self._land(arrival, inbound, layout))
            leases.append(self._lease(inbound, m.num_blocks, msg.expires_in_s))
        return MigrationLeases(leases)

    def cancel(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            arrival = self._arrivals.get(request_id)
            if arrival is not None and arrival.migrant is None:  # an import goes on
                self.release(request_id)

    async def resume(self, request_id: str, timeout_s: float) -> tuple[Migrant, AsyncIterator[RequestOutput]]:
        """The migrant and its engine outputs since the import; InvalidRequest when not here."""
        arrival = self._arrivals.get(request_id)
        if arrival is None or arrival.imported is None or arrival.resumed:
            raise InvalidRequest(f"no migrated request {request_id!r} to resume here")
        arrival.resumed = True
        if arrival.expiry is not None:
            arrival.expiry.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(arrival.imported), timeout_s)
        except BaseException:
            self.release(request_id)
            raise
        assert arrival.migrant is not None
        return arrival.migrant, self._drain(arrival)

    def release(self, request_id: str) -> None:
        """Everything one arrival holds, at once (idempotent)."""
        arrival = self._arrivals.pop(request_id, None)
        if arrival is None:
            return
        if arrival.expiry is not None:
            arrival.expiry.cancel()
        for task in arrival.writes:
            task.cancel()
        for inbound in arrival.inbounds:
            inbound.release()
            assert self.role.data is not None
            self.role.data.cancel(inbound.target.transfer_id)
        if arrival.pump is not None:
            arrival.pump.cancel()  # closes the engine stream: aborts the request
        if arrival.imported is not None and not arrival.imported.done():
            arrival.imported.set_exception(InvalidRequest(f"the migration of {request_id!r} was released"))
            arrival.imported.exception()
        asyncio.get_running_loop().create_task(
            self._service.release(arrival.reservation)
        )  # no-op once imported

    def close(self) -> None:
        for request_id in list(self._arrivals):
            self.release(request_id)

    # ---- internals ---------------------------------------------------------------------------
    @property
    def _service(self):
        assert self.role.service is not None
        return self.role.service

    async def _get(self, request_id: str, expires_in_s: float) -> _Arrival:
        arrival = self._arrivals.get(request_id)
        if arrival is None:
            try:
                reservation = await self._service.reserve(0)
            except InvalidRequest as exc:
                raise InvalidRequest(f"{self.role.name}: no room for {request_id}: {exc.message}") from None
            arrival = self._arrivals.setdefault(request_id, _Arrival(request_id, reservation))
        if arrival.expiry is not None:
            arrival.expiry.cancel()
        arrival.expiry = asyncio.get_running_loop().call_later(expires_in_s, self.release, request_id)
        return arrival

    def _expect(self, arrival: _Arrival, what: str, nbytes: int, timeout_s: float) -> Inbound:
        assert self.role.data is not None
        transfer_id = new_transfer_id(self.role.name, "migrate", arrival.request_id, what)
        inbound = self.role.data.expect(transfer_id, nbytes, timeout_s)
        arrival.inbounds.append(inbound)
        return inbound

    def _lease(self, inbound: Inbound, num_blocks: int, expires_in_s: float) -> KvLease:
        t = inbound.target
        return KvLease(t.transfer_id, t.backend, t.address, t.nbytes, num_blocks, expires_in_s, t.region)

    async def _write_pages(self, arrival: _Arrival, inbound: Inbound, start: int, count: int) -> None:
        try:
            buf = await inbound.wait()
            pages = torch.frombuffer(buf, dtype=torch.float32).view(count, self.role.shape.page_elems)
            self._service.write_pages(arrival.reservation, start, pages)
            if start == arrival.held:
                arrival.held = start + count
            self.role.counters.precopied_pages += count
        except DsiError as exc:
            log.warning(
                "%s: pre-copied pages of %s did not arrive: %s", self.role.name, arrival.request_id, exc
            )
        finally:
            inbound.release()
            if inbound in arrival.inbounds:
                arrival.inbounds.remove(inbound)

    async def _land(self, arrival: _Arrival, inbound: Inbound, layout) -> None:
        m = arrival.migrant
        assert m is not None and arrival.imported is not None
        try:
            buf = await inbound.wait()
            state = RequestState.from_buffer(
                layout,
                buf,
                m.request_id,
                m.prompt,
                m.output,
                m.sampling,
                m.seed,
                m.consumer_start,
                m.num_computed,
                m.logprobs,
                m.num_cached,
                m.replay_start,
                [tuple(span) for span in m.images],
            )
            stream = self._service.import_request(state, arrival.reservation, m.held)
        except DsiError as exc:
            log.warning("%s: migrated %s not imported: %s", self.role.name, m.request_id, exc)
            if not arrival.imported.done():
                arrival.imported.set_exception(exc)
                arrival.imported.exception()
            self.release(m.request_id)
            return
        finally:
            inbound.release()
            if inbound in arrival.inbounds:
                arrival.inbounds.remove(inbound)
        self.role.counters.migrated_in += 1
        arrival.pump = asyncio.get_running_loop().create_task(self._pump(arrival, stream))
        if not arrival.imported.done():
            arrival.imported.set_result(None)

    async def _pump(self, arrival: _Arrival, stream: AsyncIterator[RequestOutput]) -> None:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            try:
                async for out in stream:
                    arrival.outputs.put_nowait(out)
            except DsiError as exc:  # RequestMoved included: this instance drains too
                arrival.outputs.put_nowait(exc)

    async def _drain(self, arrival: _Arrival) -> AsyncIterator[RequestOutput]:
        try:
            while True:
                out = await arrival.outputs.get()
                if isinstance(out, DsiError):
                    raise out
                yield out
                if out.finished:
                    return
        finally:
            if arrival.pump is not None and not arrival.pump.done():
                arrival.pump.cancel()
            self._arrivals.pop(arrival.request_id, None)
