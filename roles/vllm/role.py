"""VllmRole: what vLLM-backed prefill and decode instances share.

The same wire contract as dsi's own engine roles (dsi.roles.engine_role), so that the gateway,
balancers, autoscaler, ``dsi status``, drain and failover treat both alike: heartbeats carry a
``Load`` and the machine fingerprint, load reports go to every balancer, ``GetEngineStats``
answers the counters. What differs is inside: the engine is a :class:`dsi.vllm.VllmService`, and
KV moves through dsi's connector inside vLLM (:mod:`dsi.vllm.connector`), which stages a
request's KV blocks in files under ``staging`` (``/dev/shm``); the role moves those bytes over
dsi's data plane. vLLM's KV events keep ``local`` (dsi.vllm.events.LocalBlocks): the pages vLLM
holds in its own prefix cache, which the role never fetches from the kvstore.

    load (heartbeat, load report)  <-  vLLM's scheduler stats  +  requests accepted but not yet in vLLM
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import zmq.asyncio

from dsi.actor import handles
from dsi.config import NodeConfig, RoleAddresses, RoleConfig, addresses_of
from dsi.engine import machine_fingerprint
from dsi.errors import InvalidRequest
from dsi.kvcache.hashchain import HashChain, unpack
from dsi.messages.balancer import LoadReport
from dsi.messages.control import Load
from dsi.messages.gateway import Generate
from dsi.messages.handoff import EngineStats, GetEngineStats
from dsi.roles.curve import server_keys
from dsi.roles.data_plane import data_plane_stats, start_data_plane
from dsi.roles.engine_role import Arrival, kept_peer
from dsi.roles.kvstore.client import KvstoreClient
from dsi.roles.load_report import LoadReporter
from dsi.roles.role import RoleActor
from dsi.transport.client import Peer
from dsi.transport.kv import DataPlane
from dsi.transport.security import CurveKeys
from dsi.vllm.chain import vllm_chain
from dsi.vllm.events import LocalBlocks, follow
from dsi.vllm.layout import KvLayout
from dsi.vllm.service import VllmService, apply_engine_environment
from dsi.vllm.wiring import connector_wiring, events_endpoint, staging_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VllmRoleSettings:
    """Everything a vLLM role needs from its node config."""

    role: RoleConfig
    node: NodeConfig
    keys: CurveKeys | None
    addresses: RoleAddresses  # where the data plane binds, the host its leases name

    @classmethod
    def of(cls, role: RoleConfig, node: NodeConfig) -> VllmRoleSettings:
        return cls(role, node, server_keys(node.security), addresses_of(role, node))


@dataclass(slots=True)
class VllmCounters:
    """Handoff counters of one vLLM role, since start."""

    prefills: int = 0
    handoffs: int = 0
    failed_handoffs: int = 0
    leases: int = 0
    store_hit_blocks: int = 0  # blocks fetched from the kvstore for vLLM to load
    local_skipped_blocks: int = 0  # store lookups skipped: vLLM's own prefix cache held the blocks
    persisted_blocks: int = 0  # full blocks queued for the kvstore
    resumed: int = 0  # re-runs continued after their delivered tokens (dsi.roles.vllm.resume)


def waiting_tokens(starting: Sequence[int], waiting: int) -> int:
    """The tokens of the last ``waiting`` of ``starting`` (prompt tokens of the requests given to
    a first-come-first-served engine that has not answered them yet, oldest first)."""
    waiting = min(max(waiting, 0), len(starting))
    return sum(starting[len(starting) - waiting :]) if waiting else 0


class VllmRole(RoleActor):
    """Base of VllmPrefillActor and VllmDecodeActor."""

    kind = "engine"

    def __init__(self, name: str, settings: VllmRoleSettings) -> None:
        super().__init__(name)
        self.settings = settings
        self.options = settings.role.options.vllm  # type: ignore[union-attr]
        self.service: VllmService | None = None
        self.layout: KvLayout | None = None
        self.data: DataPlane | None = None
        self.kvstore: KvstoreClient | None = None
        self.chain: HashChain | None = None  # the store's hash chain for this instance's pages
        self.local: LocalBlocks | None = None  # the pages vLLM's prefix cache holds (its KV events)
        self._events: asyncio.Task | None = None
        self.ctx: zmq.asyncio.Context | None = None
        self.reporter: LoadReporter | None = None
        self.counters = VllmCounters()
        self.staging = staging_dir(name, settings.role.bind)
        self._peers: dict[str, Peer] = {}
        self.accepted = 0
        self.incoming_requests = 0  # accepted, not yet counted by vLLM (see Arrival)
        self.incoming_tokens = 0
        # vLLM request id -> prompt tokens, of the requests given to vLLM that have no output yet,
        # in the order they were given (see _waiting_tokens)
        self.starting: dict[str, int] = {}
        # vLLM request id -> prompt tokens it computes here (a colocated run: the prompt less the
        # blocks held or loaded), of the runs with no output yet: the prefill work queued here
        self.prefilling: dict[str, int] = {}

    async def on_start(self) -> None:
        # before vLLM is first imported; CoresUnavailable (the role fails to start) when cpu_threads
        # names CPUs this process may not run on
        apply_engine_environment(os.environ, self.options, os.sched_getaffinity(0))
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        self.ctx = zmq.asyncio.Context()
        node = self.settings.node
        wiring = connector_wiring(self.kind, self.staging)
        self.service = await VllmService.start(self.options, node.model.dir, wiring)
        self.layout = KvLayout.read(self.staging)
        self.fingerprint = self.layout.fingerprint(
            machine_fingerprint(), self.service.shape.version, node.model.name, self.options.dtype
        )
        log.info("%s: vLLM engine ready, %s, fingerprint %s", self.name, self.layout.describe(),
                 self.fingerprint.short())  # fmt: skip
        # pages are portable only between equal fingerprints: the chain is versioned by it
        self.chain = vllm_chain(
            node.cluster.root_seed, node.model.name, self.fingerprint, self.layout.block_size
        )
        self.local = LocalBlocks(self.chain)
        self._events = asyncio.get_running_loop().create_task(
            follow(self.local, self.ctx, events_endpoint(self.staging)), name="vllm-kv-events"
        )
        self.data = await start_data_plane(
            node.data_plane.backend, self.settings.addresses, keys=self.settings.keys
        )
        if node.cluster.controller:
            self.kvstore = KvstoreClient(
                node.cluster.controller, self.ctx, keys=self.settings.keys, peer_id=self.name
            )
            await self.kvstore.start()
        await super().on_start()
        if node.balancer_addresses:
            self.reporter = LoadReporter(
                self.name,
                node.balancer_addresses,
                self.load_report,
                self.ctx,
                keys=self.settings.keys,
                interval_s=node.cluster.heartbeat_interval_s,
            )
            await self.reporter.start()
            asyncio.get_running_loop().create_task(self._report_while_busy())

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._events is not None:
            self._events.cancel()
            await asyncio.gather(self._events, return_exceptions=True)
        if self.reporter is not None:
            self.reporter.send_now()
            await self.reporter.stop()
        for peer in self._peers.values():
            await peer.close()
        if self.kvstore is not None:
            await self.kvstore.close()
        if self.service is not None:
            await self.service.close()
        if self.data is not None:
            await self.data.close()
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
        shutil.rmtree(self.staging, ignore_errors=True)

    async def _report_while_busy(self, interval_s: float = 0.1) -> None:
        """vLLM's load moves with its steps, not with this role's messages: poke the reporter
        while it runs anything."""
        while self.state != "stopping":
            await asyncio.sleep(interval_s)
            if self.service is not None and (self.service.load.running or self.service.load.waiting):
                self.load_changed()

    # ---- load ----------------------------------------------------------------------------------
    def arrive(self, tokens: int) -> Arrival:
        return Arrival(self, tokens)  # type: ignore[arg-type]

    def load_changed(self) -> None:
        if self.reporter is not None:
            self.reporter.poke()

    def _kv_tokens(self) -> int:
        """KV tokens held (vLLM's usage) plus those its waiting requests will take."""
        if self.service is None:
            return 0
        held = round(self.service.load.kv_usage * self.service.shape.kv_capacity_tokens)
        return held + self._waiting_tokens()

    def _waiting_tokens(self) -> int:
        """The prompt tokens of the requests vLLM has not scheduled yet: they hold no KV, so its
        usage misses them, yet they will hold it and their prompts are compute still ahead.
        vLLM schedules first come, first served, so the waiting ones are the last ``waiting``
        given that have no output yet."""
        assert self.service is not None
        return waiting_tokens(list(self.starting.values()), self.service.load.waiting)

    def starts(self, vllm_id: str, prompt_tokens: int, computes: int = 0) -> None:
        """A request given to vLLM (counted by :meth:`_waiting_tokens` until :meth:`started`);
        ``computes``: the prompt tokens vLLM computes for it here (a colocated run), reported as
        queued until its first output."""
        self.starting[vllm_id] = prompt_tokens
        if computes > 0:
            self.prefilling[vllm_id] = computes

    def started(self, vllm_id: str) -> None:
        """Its first output came (or it ended): vLLM scheduled it."""
        self.prefilling.pop(vllm_id, None)
        if self.starting.pop(vllm_id, None) is not None:
            self.load_changed()

    def load(self) -> Load:
        if self.service is None:
            return super().load()
        now = self.service.load
        return Load(
            running=now.running,
            queued=now.waiting + self.incoming_requests,
            kv_tokens=self._kv_tokens(),
            inbox=self.inbox_depth,
            uncached_tokens=self.incoming_tokens,
        )

    def load_report(self) -> LoadReport:
        now = self.service.load if self.service is not None else None
        running = now.running if now is not None else 0
        report = LoadReport(
            self.name,
            self.kind,
            self.started_at,
            self.state,
            running=running,
            waiting=now.waiting if now is not None else 0,
            kv_tokens=self._kv_tokens(),
            accepted=self.accepted,
        )
        if self.kind == "prefill":
            return msgspec.structs.replace(report, queued_tokens=self.incoming_tokens)
        shape = self.service.shape if self.service is not None else None
        return msgspec.structs.replace(
            report,
            running=running + self.incoming_requests,
            kv_tokens=self._kv_tokens() + self.incoming_tokens,
            # what a colocated request's first token waits for: the prompts given to vLLM and not
            # yet computed, and those still arriving (their hit being fetched)
            queued_tokens=sum(self.prefilling.values()) + self.incoming_tokens,
            max_requests=self.max_requests(),
            kv_capacity_tokens=shape.kv_capacity_tokens if shape is not None else 0,
        )

    def requests_here(self) -> int:
        """Requests this role is serving now (vLLM's own counts lag by a step)."""
        return 0

    def max_requests(self) -> int:
        return int(self.options.args.get("max_num_seqs", 256))

    @handles
    def engine_stats(self, msg: GetEngineStats) -> EngineStats:
        c = self.counters
        shape = self.service.shape if self.service is not None else None
        now = self.service.load if self.service is not None else None
        return EngineStats(
            total_blocks=shape.num_blocks if shape is not None else 0,
            free_blocks=round(shape.num_blocks * (1 - now.kv_usage)) if shape and now else 0,
            running=self.requests_here(),
            leases=c.leases,
            regions=self.data.stats.regions_live if self.data is not None else 0,
            cached_tokens=now.external_tokens if now is not None else 0,
            computed_prompt_tokens=now.computed_tokens if now is not None else 0,
            local_hit_tokens=now.local_hit_tokens if now is not None else 0,
            store_fetched_blocks=c.store_hit_blocks,
            store_skipped_blocks=c.local_skipped_blocks,
            resumed=c.resumed,
            prefills=c.prefills,
            handoffs=c.handoffs,
            failed_handoffs=c.failed_handoffs,
            persisted_blocks=c.persisted_blocks,
            replay_tokens=0,
            **data_plane_stats(self.data),
        )

    # ---- the kvstore -----------------------------------------------------------------------------
    def prompt_hashes(self, req: Generate) -> list[bytes]:
        """Chain hashes of the prompt's full blocks before its last token (which is always computed)."""
        assert self.chain is not None
        bs = self.chain.block_size
        full = (len(req.token_ids) - 1) // bs
        try:
            packed = self.chain.hashes(req.token_ids[: full * bs], cache_salt=req.sampling.cache_salt)
        except (ValueError, OverflowError) as exc:
            raise InvalidRequest(f"prompt token ids: {exc}") from None
        return unpack(packed)

    def held_locally(self, hashes: list[bytes]) -> int:
        """Leading blocks of ``hashes`` vLLM's own prefix cache holds (per its KV events)."""
        return self.local.held(hashes) if self.local is not None else 0

    async def fetch_hit(self, hashes: list[bytes], path: Path, skip: int = 0) -> int:
        """The leading blocks of ``hashes[skip:]`` the kvstore holds, staged into ``path``; how
        many. ``skip``: blocks vLLM holds itself (``held_locally``), never fetched."""
        self.counters.local_skipped_blocks += skip
        wanted = hashes[skip:]
        if self.kvstore is None or not wanted or self.layout is None:
            return 0
        fetched = await self.kvstore.fetch(wanted, self.layout.block_bytes)
        try:
            found = len(fetched)
            if found:
                await asyncio.get_running_loop().run_in_executor(
                    None, fetched.blocks[:found].tofile, str(path)
                )
        finally:
            fetched.release()
        self.counters.store_hit_blocks += found
        return found

    def persist(
        self, staged: Path, hashes: list[bytes], new_from: int, traffic_class: str, file_first: int = 0
    ) -> None:
        """Queue the staged full blocks from ``hashes[new_from]`` on for the kvstore; the file's
        block 0 is the prompt's block ``file_first`` (the mapping outlives the file)."""
        if self.kvstore is None or len(hashes) <= new_from or self.layout is None or not staged.exists():
            return
        total = staged.stat().st_size // self.layout.block_bytes
        mapped = np.memmap(staged, dtype=np.uint8, mode="r", shape=(total, self.layout.block_bytes))
        blocks = np.asarray(mapped)  # a plain view of the mapping (the store client wants ndarrays)
        new = range(max(new_from, file_first), min(len(hashes), file_first + total))
        if not new:
            return
        chosen = [blocks[i - file_first] for i in new]
        if self.kvstore.put_background([hashes[i] for i in new], chosen, traffic_class):
            self.counters.persisted_blocks += len(new)

    # ---- other instances -----------------------------------------------------------------------
    async def peer(self, address: str, connect_timeout: float) -> Peer:
        """A connected Peer to another engine instance (kept); DsiError when it cannot be reached."""
        assert self.ctx is not None
        return await kept_peer(
            self._peers, address, self.ctx, self.name, self.kind, self.settings.keys, connect_timeout
        )

    def staged(self, name: str) -> Path:
        """The staging file of one transfer (the connector writes or reads it)."""
        return self.staging / f"{name}.kv"
