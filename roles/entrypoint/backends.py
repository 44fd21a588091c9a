"""Where a request runs: the prefill and decode instances, and the connections to them.

``InstancePool`` (dsi.roles.entrypoint.instances) keeps the instances of one role the controller
lists, and picks the least loaded serving one.

``DecodePool`` routes a request: with balancers configured it asks one first, within a bound
(``balancer_timeout_s``; see dsi.roles.entrypoint.router), and picks locally (the least loaded,
as above) when none answers, when it knows no instance, or when it names one this gateway does
not list as serving. With prefill instances in the cluster it picks one of each and
streams ``Handoff`` from the decode (which has the prefill write the KV into its lease); without
any it streams a colocated ``Generate``. Failures are retried on other instances:

- a prefill that failed or vanished (``PrefillLost``, always before the first token): another prefill;
- a decode lost (its connection dropped, or the controller marks it ``dead`` after missed
  heartbeats) or overloaded: another decode, waiting up to ``reroute_wait_s`` for one to be
  serving (a restarted instance counts again). If tokens were already delivered, the request is
  re-run from its prompt with the same seed (the entrypoint fixes the seed of every request for
  this reason), pinned to the prefix hit the first run took, and the re-run's tokens are
  compared with the delivered ones before anything more is streamed
  (:mod:`dsi.roles.entrypoint.recovery`): a re-run that differs ends the request with
  ``RecoveryDiverged``, a pinned hit that cannot be taken again with ``HitUnavailable``;
- chunks lost on the way (a gap in their numbers, or a stream that ended before its last chunk;
  see dsi.roles.entrypoint.chunk_order): re-run as for a lost decode, on another decode while one
  serves, else on the same one under a new request id (it may still hold the first run under
  the old one); a chunk that arrives twice is dropped;
- a decode that drains ends the stream with ``finish="migrated"``: the request goes on at the
  decode it names (``Resume``; its first chunk repeats the tokens so far and is checked like a
  re-run's), or is re-run from its prompt when it names none, or when the decode named has no
  such request to resume (its import failed there: ``InvalidRequest``).

Each wait for a stream item is bounded, so a client sees a complete stream or a clean error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass

import msgspec
import zmq.asyncio

from dsi.errors import AskTimeout, InvalidRequest, Overloaded, PeerLost
from dsi.messages.balancer import Route
from dsi.messages.gateway import Generate, TokenChunk
from dsi.messages.handoff import Handoff, PrefillLost
from dsi.messages.migrate import Resume
from dsi.roles.entrypoint.chunk_order import ChunkGap, ChunkOrder
from dsi.roles.entrypoint.instances import InstancePool, NoInstance, _Instance
from dsi.roles.entrypoint.recovery import Delivered
from dsi.roles.entrypoint.router import Ask, BalancerRouter
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Placement:
    """Where a request ran: the instance ids of its latest attempt ("": none, as the prefill
    of a colocated run)."""

    decode: str = ""
    prefill: str = ""


class DecodePool:
    """The gateway's view of the engine instances (both roles)."""

    max_attempts = 4
    max_migrations = 8  # moves of one request by drains (each is a Resume, not a failure)

    def __init__(
        self,
        controller: str,
        ctx: zmq.asyncio.Context,
        *,
        keys: CurveKeys | None = None,
        refresh_s: float = 1.0,
        peer_id: str = "entrypoint",
        item_timeout_s: float = 120.0,
        reroute_wait_s: float = 5.0,
        balancers: Sequence[str] = (),
        balancer_timeout_s: float = 0.02,
        route_mode: str = "table",
        route_table_ttl_s: float = 0.2,
    ) -> None:
        self.decode = InstancePool(
            controller, ctx, role="decode", keys=keys, refresh_s=refresh_s, peer_id=peer_id
        )
        self.prefill = InstancePool(
            controller, ctx, role="prefill", keys=keys, refresh_s=refresh_s, peer_id=peer_id
        )
        self.item_timeout_s = item_timeout_s
        self.reroute_wait_s = reroute_wait_s  # seconds a re-routed request waits for a ready decode
        self.retries = 0
        # Asked first for every route; None (no balancer configured) is today's local pick alone.
        self.router = (
            BalancerRouter(
                balancers,
                ctx,
                keys=keys,
                peer_id=peer_id,
                bound_s=balancer_timeout_s,
                mode=route_mode,
                table_ttl_s=route_table_ttl_s,
                table_every_s=route_table_ttl_s / 4,
            )
            if balancers
            else None
        )
        self.migrations = 0  # streams moved by a drain to another decode (or re-run when it named none)
        self.failed_moves = 0  # moved streams whose Resume found nothing there (re-run instead)
        self.chunk_gaps = 0  # streams re-run because chunks were lost on the way
        self.chunk_duplicates = 0  # chunks dropped because they arrived twice

    async def start(self) -> None:
        await self.decode.start()
        await self.prefill.start()
        if self.router is not None:
            await self.router.start()

    async def close(self) -> None:
        if self.router is not None:
            await self.router.close()
        await self.prefill.close()
        await self.decode.close()

    @property
    def ready(self) -> list[str]:
        return self.decode.ready

    @property
    def prefill_ready(self) -> list[str]:
        return self.prefill.ready

    def metric_lines(self) -> list[str]:
        """The controller's lifecycle transition counter (every role's, carried in the instance
        table the decode pool fetched last) and this pool's stream repairs (chunks lost or
        repeated on the way, moves that did not land), in the Prometheus text format."""
        lines = ["# TYPE dsi_instance_transitions_total counter"]
        lines += [
            f'dsi_instance_transitions_total{{role="{t.role}",from="{t.before}",to="{t.after}"}} {t.count}'
            for t in self.decode.transitions
        ]
        lines += [
            "# TYPE dsi_stream_chunk_gaps_total counter",
            f"dsi_stream_chunk_gaps_total {self.chunk_gaps}",
            "# TYPE dsi_stream_chunk_duplicates_total counter",
            f"dsi_stream_chunk_duplicates_total {self.chunk_duplicates}",
            "# TYPE dsi_stream_failed_moves_total counter",
            f"dsi_stream_failed_moves_total {self.failed_moves}",
        ]
        return lines + (self.router.metric_lines() if self.router is not None else [])

    def pick(self, exclude: Collection[tuple[str, float]] = frozenset()) -> _Instance:
        return self.decode.pick(exclude)

    async def refresh(self) -> None:
        await self.decode.refresh()
        await self.prefill.refresh()

    async def _know_instances(self) -> None:
        """Read the controller's table now unless both pools know it: without a decode a request
        cannot run, and a pool that has not read the prefills yet would prefill on the decode
        although a prefill instance serves (the two refresh loops run on their own)."""
        if not self.decode._instances or not self.prefill.refreshed:
            await self.refresh()

    async def generate(self, msg: Generate, placement: Placement | None = None) -> AsyncIterator[TokenChunk]:
        """Stream a request, retried on other instances as the module docstring says; each
        attempt writes where it runs into ``placement``."""
        await self._know_instances()
        if msg.sampling.seed is None:  # a retry must reproduce the tokens already delivered
            sampling = msgspec.structs.replace(msg.sampling, seed=random.getrandbits(63))
            msg = msgspec.structs.replace(msg, sampling=sampling)
        bad_decodes: set[tuple[str, float]] = set()
        bad_prefills: set[tuple[str, float]] = set()
        delivered = Delivered()  # what the caller already has
        moved: _Instance | None = None  # where a drained decode moved the request
        run_id = msg.request_id  # the request's id at the instances (a re-run may take another)
        attempt = migrations = 0
        while attempt < self.max_attempts:
            pre: _Instance | None = None
            if moved is not None:  # live migration: the stream goes on there
                inst, call, moved = moved, Resume(run_id), None
            else:
                inst, pre = await self._route(
                    msg, bad_decodes, bad_prefills, wait=attempt > 0 or migrations > 0
                )
                req = msgspec.structs.replace(
                    msg,
                    request_id=run_id,
                    pin_hit=delivered.pin,
                    delivered=list(delivered.token_ids),
                    instance_run=inst.info.started_at,
                )
                call = req if pre is None else Handoff(req, pre.info.address, pre.info.instance_id)
            delivered.rerun()
            if placement is not None:
                placement.decode = inst.info.instance_id
                placement.prefill = pre.info.instance_id if pre is not None else ""
            inst.sent += 1
            if pre is not None:
                pre.sent += 1
            migrated = False
            order = ChunkOrder()
            try:
                async with contextlib.aclosing(inst.peer.stream(call, timeout=self.item_timeout_s)) as stream:
                    async for chunk in stream:
                        if not order.take(chunk):  # a duplicate
                            self.chunk_duplicates += 1
                            continue
                        if chunk.finish == "migrated":
                            migrated, moved = True, await self._moved(chunk.moved_to)
                            bad_decodes.add(inst.key)  # draining: a re-run goes elsewhere
                            break
                        new = delivered.take(chunk)
                        if new is not None:
                            yield new
                    if not migrated:
                        order.ended(msg.request_id)
                if migrated and migrations < self.max_migrations:
                    migrations += 1
                    self.migrations += 1
                    continue
                return
            except PrefillLost as exc:
                assert pre is not None
                failed, reason = pre.info.instance_id, exc
                bad_prefills.add(pre.key)
            except (PeerLost, Overloaded, AskTimeout) as exc:
                failed, reason = inst.info.instance_id, exc
                bad_decodes.add(inst.key)
            except ChunkGap as exc:  # as a lost decode: re-run, checked against what was delivered
                failed, reason = inst.info.instance_id, exc
                self.chunk_gaps += 1
                if any(o.key != inst.key and o.key not in bad_decodes for o in self.decode.serving()):
                    bad_decodes.add(inst.key)  # the re-run goes elsewhere while it can
                else:  # perhaps there again, where the first run may not have left yet
                    run_id = f"{msg.request_id}.rerun{attempt + 1}"
            except InvalidRequest as exc:
                if not isinstance(call, Resume):
                    raise
                # The move did not land (the import failed there, or expired): re-run it.
                failed, reason = inst.info.instance_id, exc
                self.failed_moves += 1
            finally:
                inst.sent -= 1
                if pre is not None:
                    pre.sent -= 1
            attempt += 1
            if attempt == self.max_attempts:
                raise reason
            self.retries += 1
            log.warning(
                "request %s: %s on %s after %d tokens; retrying elsewhere",
                msg.request_id,
                reason.code,
                failed,
                len(delivered.token_ids),
            )
            if len(bad_prefills) >= len(self.prefill.ready):
                bad_prefills.clear()

    async def _route(
        self,
        msg: Generate,
        bad_decodes: set[tuple[str, float]],
        bad_prefills: set[tuple[str, float]],
        wait: bool,
    ) -> tuple[_Instance, _Instance | None]:
        """The decode and (with prefill instances in the cluster) the prefill of one attempt: the
        balancer's choice, else the local least loaded one (see dsi.roles.entrypoint.router)."""
        need_prefill = bool(self.prefill.ready)
        pre_route: Route | str = ""
        dec_route: Route | str = ""
        source = "balancer"
        if self.router is not None:
            ask = Ask(
                len(msg.token_ids),
                msg.cached_tokens,
                {k[0] for k in bad_prefills},
                {k[0] for k in bad_decodes},
            )
            pre_route, dec_route, source = await self.router.route(ask, prefill=need_prefill)
        inst = self._routed(self.decode, dec_route, bad_decodes, source) or await self._pick_decode(
            bad_decodes, wait
        )
        pre = None
        if need_prefill:
            pre = self._routed(self.prefill, pre_route, bad_prefills, source) or self.prefill.pick(
                bad_prefills
            )
        return inst, pre

    def _routed(
        self, pool: InstancePool, route: Route | str, exclude: set[tuple[str, float]], source: str
    ) -> _Instance | None:
        """The instance a balancer's ``route`` names, if this gateway can use it; counts the route."""
        if self.router is None:
            return None
        inst = pool.get(route.instance_id, exclude) if isinstance(route, Route) else None
        if inst is not None:
            self.router.taken(pool.role, source)
        else:
            self.router.local(pool.role, route if isinstance(route, str) else "unknown")
        return inst

    async def _moved(self, address: str) -> _Instance | None:
        """The decode a drained one moved a request to (None: re-run it from its prompt)."""
        for _ in range(2):
            for inst in self.decode._instances.values():
                if address and inst.info.address == address:
                    return inst
            if not address:
                return None
            await self.decode.refresh()
        return None

    async def _pick_decode(self, exclude: Collection[tuple[str, float]], wait: bool) -> _Instance:
        """A ready decode not in ``exclude``; a re-routed request (``wait``) waits up to
        ``reroute_wait_s`` for one to appear (the refresh loop updates the table), then fails."""
        deadline = time.monotonic() + (self.reroute_wait_s if wait else 0.0)
        while True:
            try:
                return self.decode.pick(exclude)
            except NoInstance:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoInstance(
                        f"no serving decode instance to take the request over within {self.reroute_wait_s:g}s"
                        if wait
                        else "no serving decode instance"
                    ) from None
                await asyncio.sleep(min(0.1, left))
