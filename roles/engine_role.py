"""EngineRole: what prefill and decode instances share - an engine, its service, a data plane.

The engine is built off the event loop (weights load, model generated on first use) and run by
an :class:`EngineService`, the role's only way to it: its calls, its ``shape`` (sizes, hash
chain) and its ``load``. The data plane carries KV + state between instances; a decode
receives into leases, a prefill sends into them. ``EngineStats`` reports the memory both hold,
so an operator (or a test) can see that nothing leaks after failures.

SWA states: the engine snapshots the producer rings at the last block boundary each request
reached; when the request finishes (or leaves a prefill) the snapshot goes into this host's
:class:`StateCache` and the kvstore is told who holds it. ``PullState`` sends one to a prefill
whose prefix hit ends at that boundary.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec
import torch
import zmq.asyncio

from dsi.actor import handles
from dsi.config import EngineOptions, ModelConfig, NodeConfig, RoleAddresses, RoleConfig, addresses_of
from dsi.config.addresses import LOOPBACK
from dsi.config.sections import EngineSection
from dsi.engine import (
    EngineConfig,
    EngineLoad,
    EngineService,
    EngineShape,
    ImageEmbeds,
    machine_fingerprint,
    step_thread,
    unpacked_images,
)
from dsi.engine.hit_policy import DEFAULT_HIT_POLICY, HitPolicy
from dsi.eplb import EpSize, policy_for, resize
from dsi.eplb.group import EpOptions, ExpertGroup, healthy_ranks
from dsi.errors import DsiError, InvalidRequest
from dsi.messages import ALL
from dsi.messages.balancer import LoadReport
from dsi.messages.control import Load, StepCurveView
from dsi.messages.gateway import Generate
from dsi.messages.handoff import EngineStats, GetEngineStats, KvLease, PullState, StateMissing, StatePulled
from dsi.messages.vision import PullEmbeds
from dsi.roles.curve import server_keys
from dsi.roles.data_plane import data_plane_stats, start_data_plane
from dsi.roles.kvstore.client import KvstoreClient
from dsi.roles.load_report import LoadReporter
from dsi.roles.role import RoleActor
from dsi.roles.state_cache import StateCache
from dsi.transport.client import Peer
from dsi.transport.kv import DataPlane, Inbound, KvTarget
from dsi.transport.kv.ids import transfer_id
from dsi.transport.security import CurveKeys
from dsi.transport.sockets import peers_context

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Counters:
    """Handoff counters of one engine role, since start."""

    prefills: int = 0  # prefill-only requests run here
    handoffs: int = 0  # states sent (prefill) / leases opened (decode)
    failed_handoffs: int = 0
    leases: int = 0  # live decode leases
    persisted_blocks: int = 0  # full pages queued for the store
    states_pulled: int = 0
    states_served: int = 0
    migrated_in: int = 0
    migrated_out: int = 0
    precopied_pages: int = 0


@dataclass(frozen=True, slots=True)
class EngineRoleSettings:
    """Everything an engine role needs from its node config."""

    options: EngineOptions
    model: ModelConfig
    root_seed: int = 0
    controller: str | None = None  # finds the kvstore (and nothing is persisted without one)
    keys: CurveKeys | None = None
    data_backend: str = "tcp"
    # Where the data plane binds and the host its leases name (dsi.config.addresses).
    addresses: RoleAddresses = LOOPBACK
    lease_timeout_s: float = 30.0
    address: str = ""  # this role's control-plane address as told (where others pull its SWA states)
    state_cache_bytes: int = 256 << 20
    hit_policy: HitPolicy = DEFAULT_HIT_POLICY  # [kvcache]: for requests that do not name one
    compute: EngineSection = field(default_factory=EngineSection)  # [engine]: batch invariance, scheduling
    balancers: tuple[str, ...] = ()  # where load reports go (see dsi.roles.load_report)
    report_interval_s: float = 1.0  # seconds between load reports when nothing changes

    @classmethod
    def of(cls, role: RoleConfig, node: NodeConfig) -> EngineRoleSettings:
        assert isinstance(role.options, EngineOptions)
        told = addresses_of(role, node)
        return cls(
            role.options,
            node.model,
            node.cluster.root_seed,
            node.cluster.controller,
            server_keys(node.security),
            node.data_plane.backend,
            told,
            node.data_plane.lease_timeout_s,
            told.told(role.bind),
            hit_policy=node.kvcache.hit_policy,
            compute=node.engine,
            balancers=node.balancer_addresses,
            report_interval_s=node.cluster.heartbeat_interval_s,
        )


def lease_target(lease: KvLease) -> KvTarget:
    """The data-plane target a lease names."""
    return KvTarget(lease.backend, lease.address, lease.lease_id, lease.nbytes, lease.region)


class Arrival:
    """A request accepted by an engine role that its engine does not count yet (prefill: the
    un-cached tokens being computed; decode: a handoff until its KV is imported). ``settle`` when
    the engine counts it (or it failed); settling again only reports the change."""

    def __init__(self, role: EngineRole, tokens: int) -> None:
        self.role, self.tokens, self.settled = role, tokens, False
        role.accepted += 1
        role.incoming_requests += 1
        role.incoming_tokens += tokens
        role.load_changed()

    def settle(self) -> None:
        if not self.settled:
            self.settled = True
            self.role.incoming_requests -= 1
            self.role.incoming_tokens -= self.tokens
        self.role.load_changed()


class EngineRole(RoleActor):
    """Base of PrefillActor and DecodeActor."""

    kind = "engine"  # the role name this instance introduces itself with to its peers
    collect_full_pages = False
    speculates = False  # [engine] speculative applies (decode engines)

    def __init__(self, name: str, settings: EngineRoleSettings) -> None:
        super().__init__(name)
        self.settings = settings
        self.service: EngineService | None = None
        self.data: DataPlane | None = None
        self.ctx: zmq.asyncio.Context | None = None
        self.counters = Counters()
        self.kvstore: KvstoreClient | None = None
        self.states = StateCache(settings.state_cache_bytes)
        # Engine request ids whose pages and states are not shared: a hit served by bounded replay
        # (its positions past the hit follow the replay, and the store must only hold what a
        # hit-free run computes). Salted requests are shared under their salted chain.
        self._unshared: set[str] = set()
        self._collect_task: asyncio.Task | None = None
        self._peers: dict[str, Peer] = {}  # other engine instances (prefills, SWA state owners)
        self.accepted = 0  # requests accepted since start (load reports carry it)
        self.incoming_requests = 0  # accepted, not yet counted by the engine (see Arrival)
        self.incoming_tokens = 0
        self.reporter: LoadReporter | None = None
        self.ep: EpSize | None = None  # the expert-parallel group's size, once started
        self.experts: ExpertGroup | None = None  # its rank 0 (the engine owns and closes it)

    @property
    def shape(self) -> EngineShape:
        assert self.service is not None, "the engine is not started"
        return self.service.shape

    async def on_start(self) -> None:
        self.ctx = peers_context()  # kept Peers to the other engine instances (kept_peer)
        thread = step_thread()  # builds the engine, then steps it (see step_thread)
        self.service = await asyncio.get_running_loop().run_in_executor(thread, self._build_service, thread)
        self.service.start()
        self.data = await start_data_plane(
            self.settings.data_backend, self.settings.addresses, keys=self.settings.keys
        )
        if self.settings.controller:
            self.kvstore = KvstoreClient(
                self.settings.controller, self.ctx, keys=self.settings.keys, peer_id=self.name
            )
            await self.kvstore.start()
        self.service.on_finished = self._collect
        self._collect_task = asyncio.get_running_loop().create_task(self._collect_forever())
        await super().on_start()
        if self.settings.balancers:
            self.reporter = LoadReporter(
                self.name,
                self.settings.balancers,
                self.load_report,
                self.ctx,
                keys=self.settings.keys,
                interval_s=self.settings.report_interval_s,
            )
            await self.reporter.start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.reporter is not None:
            self.reporter.send_now()  # state "stopping": the balancers stop routing here
            await self.reporter.stop()
        for peer in self._peers.values():
            await peer.close()
        if self._collect_task is not None:
            self._collect_task.cancel()
            await asyncio.gather(self._collect_task, return_exceptions=True)
        if self.kvstore is not None:
            await self.kvstore.close()
        if self.service is not None:
            await self.service.close()
        if self.data is not None:
            await self.data.close()
        if self.ctx is not None:
            self.ctx.destroy(linger=0)

    def _build_service(self, thread: ThreadPoolExecutor) -> EngineService:
        from dsi.engine import load_curve
        from dsi.model.draft import load_draft
        from dsi.model.family import load_model_dir
        from dsi.model.prepare import ensure_model

        s = self.settings
        if s.compute.threads:
            torch.set_num_threads(s.compute.threads)
        model, weights = load_model_dir(ensure_model(s.model.dir, s.model.config, s.model.gguf))
        spec = s.compute.speculative if self.speculates else "off"
        draft = load_draft(s.model.dir, model.hidden) if spec != "off" else None
        cfg = EngineConfig(
            num_blocks=s.options.num_blocks,
            max_batch_tokens=s.options.max_batch_tokens,
            max_running=s.options.max_running,
            num_slots=s.options.max_running,
            root_seed=s.root_seed,
            collect_full_pages=self.collect_full_pages,
            collect_ring_snapshots=True,
            batch_invariant=s.compute.batch_invariant,
            async_scheduling=None if s.compute.scheduling == "auto" else s.compute.scheduling == "async",
            speculative=spec,
            num_drafts=s.compute.num_drafts,
            device=s.compute.device,
            layered_hit_load=s.compute.layered_hit_load,
            step_curve=load_curve(s.compute.step_curve)
            if spec == "dspark" and s.compute.step_curve is not None
            else None,
        )
        experts = self.experts = self._start_experts(model, weights)
        try:
            service = EngineService.create(
                model, weights, cfg, experts, draft, thread, s.compute.gather_ms / 1000
            )
        except BaseException:
            if experts is not None:
                experts.close()
            raise
        # After the thread count is set, and in the thread that set it; may build the C kernels.
        self.fingerprint = machine_fingerprint()
        log.info(
            "%s: engine ready (%s, %d pages), machine fingerprint %s",
            self.name, model.name, cfg.num_blocks, self.fingerprint.short(),
        )  # fmt: skip
        curve = service.load.step_curve
        if curve is not None:
            log.info("%s: speculative %s, step-time curve %s", self.name, spec, curve.as_dict())
        return service

    def _start_experts(self, model: ModelConfig, weights: dict) -> ExpertGroup | None:
        """The instance's expert-parallel group, sized for the healthy ranks (EP resize), or None
        when it is configured for one rank."""
        o = self.settings.options
        if o.ep_size == 1:
            return None
        healthy = healthy_ranks(o.ep_size)
        self.ep = resize(o.ep_size, healthy, model.n_experts, o.ep_redundant)
        if self.ep.size < o.ep_size:
            log.warning(
                "%s: %d of %d expert-parallel ranks healthy: serving with %d (capacity %.2f)",
                self.name, healthy, o.ep_size, self.ep.size, self.ep.capacity,
            )  # fmt: skip
        options = EpOptions(
            self.ep,
            policy_for(self.kind),
            window_steps=o.ep_window_steps,
            rebalance_steps=o.ep_rebalance_steps,
            batch_invariant=self.settings.compute.batch_invariant,
        )
        return ExpertGroup.start(model, weights, options)

    def load(self) -> Load:
        if self.service is None:
            return super().load()
        now = self.service.load
        return Load(
            running=now.running,
            queued=now.waiting,
            kv_tokens=now.kv_tokens,
            inbox=self.inbox_depth,
            uncached_tokens=now.prompt_tokens - now.cached_tokens,
            ep_ranks=self.ep.size if self.ep is not None else 0,
            ep_configured=self.ep.configured if self.ep is not None else 0,
            **speculation_load(now),
        )

    # ---- load reports to the balancers -----------------------------------------------------------
    def arrive(self, tokens: int) -> Arrival:
        return Arrival(self, tokens)

    def load_changed(self) -> None:
        if self.reporter is not None:
            self.reporter.poke()

    def load_report(self) -> LoadReport:
        """What this instance holds now, incoming requests included (see Arrival)."""
        now = self.service.load if self.service is not None else EngineLoad()
        report = LoadReport(
            self.name,
            self.kind,
            self.started_at,
            self.state,
            running=now.running,
            waiting=now.waiting,
            kv_tokens=now.kv_tokens,
            accepted=self.accepted,
        )
        if self.kind == "prefill":
            return msgspec.structs.replace(report, queued_tokens=self.incoming_tokens)
        capacity = (
            self.service.shape.num_pages * self.service.shape.block_size if self.service is not None else 0
        )
        return msgspec.structs.replace(
            report,
            running=now.running + self.incoming_requests,
            kv_tokens=now.kv_tokens + self.incoming_tokens,
            max_requests=self.settings.options.max_running,
            kv_capacity_tokens=capacity,
        )

    @handles
    def engine_stats(self, msg: GetEngineStats) -> EngineStats:
        c = self.counters
        counts = dict(
            prefills=c.prefills,
            handoffs=c.handoffs,
            failed_handoffs=c.failed_handoffs,
            leases=c.leases,
            persisted_blocks=c.persisted_blocks,
            states_pulled=c.states_pulled,
            states_served=c.states_served,
            migrated_in=c.migrated_in,
            migrated_out=c.migrated_out,
            precopied_pages=c.precopied_pages,
            **data_plane_stats(self.data),
        )
        if self.service is None:
            return EngineStats(**counts)
        shape, now = self.service.shape, self.service.load
        return EngineStats(
            total_blocks=shape.num_pages,
            free_blocks=now.free_pages,
            total_slots=shape.num_slots,
            free_slots=now.free_slots,
            running=now.running + now.waiting,
            regions=self.data.stats.regions_live if self.data is not None else 0,
            cached_tokens=now.cached_tokens,
            replay_tokens=now.replay_tokens,
            computed_prompt_tokens=now.computed_prompt_tokens,
            states_kept=len(self.states),
            **counts,
        )

    # ---- other engine instances and the data plane --------------------------------------------
    async def peer(self, address: str, connect_timeout: float) -> Peer:
        """A connected Peer to another engine instance (kept); DsiError when it cannot be reached."""
        assert self.ctx is not None
        return await kept_peer(
            self._peers, address, self.ctx, self.name, self.kind, self.settings.keys, connect_timeout
        )

    def lease(self, inbound: Inbound, num_blocks: int, expires_in_s: float) -> KvLease:
        """What a sender needs to write into ``inbound`` (a receive region of this data plane)."""
        t = inbound.target
        return KvLease(t.transfer_id, t.backend, t.address, t.nbytes, num_blocks, expires_in_s, t.region)

    # ---- image embeddings -------------------------------------------------------------------------
    async def pull_images(self, req: Generate) -> tuple[ImageEmbeds, ...]:
        """The embeddings of the request's images, written by the encoder that holds them into a
        receive region of this data plane (see dsi.messages.vision); () for a text prompt."""
        if not req.images:
            return ()
        assert self.data is not None
        if not req.encoder:
            raise InvalidRequest("the request has images but names no encoder that holds their embeddings")
        hidden, rows = self.shape.hidden, sum(s.tokens for s in req.images)
        timeout = self.settings.lease_timeout_s
        transfer = transfer_id(self.name, "images")
        inbound = self.data.expect(transfer, rows * hidden * 4, timeout)
        try:
            peer = await self.peer(req.encoder, timeout)
            await peer.ask(
                PullEmbeds([s.digest for s in req.images], self.lease(inbound, 0, timeout)), timeout=timeout
            )
            buf = await inbound.wait()
            embeds = torch.frombuffer(bytearray(buf), dtype=torch.float32).view(rows, hidden)
        finally:
            inbound.release()
        return unpacked_images(embeds, [(s.offset, s.tokens, s.digest) for s in req.images])

    # ---- SWA states ------------------------------------------------------------------------------
    @handles(concurrent=True)
    async def pull_state(self, msg: PullState) -> StatePulled:
        found = self.states.get(msg.block_hash)
        if found is None:
            raise StateMissing(f"{self.name} holds no SWA state for that block")
        assert self.data is not None
        boundary, rings = found
        await self.data.send(
            lease_target(msg.lease), [memoryview(rings.numpy()).cast("B")], timeout_s=msg.lease.expires_in_s
        )
        self.counters.states_served += 1
        return StatePulled(boundary)

    def on_full_pages(self, pages: list) -> None:
        """Decode persists them; other roles drop them."""

    async def _collect_forever(self, interval_s: float = 0.05) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._collect()

    def _collect(self) -> None:
        """Take the engine's full pages and ring snapshots: every ``interval_s``, and at once after
        a step that finished a request (so its state is announced before its answer ends)."""
        if self.service is None:
            return
        try:
            pages = self.service.take_full_pages()
            if pages:
                self.on_full_pages(pages)
            self._keep_states(self.service.take_ring_snapshots())
        except Exception:  # the loop must survive anything one batch does
            log.exception("%s: collecting pages and states failed", self.name)

    def _keep_states(self, snapshots: list) -> None:
        kept = []
        for snap in snapshots:
            if snap.request_id in self._unshared:
                continue
            if self.states.put(snap.block_hash, snap.boundary, snap.rings):
                kept.append(snap.block_hash)
        if kept and self.kvstore is not None and self.settings.address:
            self.kvstore.announce_states(self.settings.address, kept)


async def kept_peer(
    peers: dict[str, Peer],
    address: str,
    ctx: zmq.asyncio.Context,
    name: str,
    kind: str,
    keys: CurveKeys | None,
    connect_timeout: float,
) -> Peer:
    """The Peer of ``peers`` at ``address``, connected on first use and kept there (an engine
    role's link to other engine instances); DsiError, and nothing kept, when it cannot connect."""
    peer = peers.get(address)
    if peer is None:
        peer = peers[address] = Peer(
            address, ctx, types=ALL, peer_id=name, role=kind, keys=keys, timeout=connect_timeout
        )
        try:
            await peer.connect(timeout=connect_timeout)
        except DsiError:
            peers.pop(address, None)
            await peer.close()
            raise
    return peer


def speculation_load(now: EngineLoad) -> dict:
    """The speculative-decoding fields of the heartbeat's Load (none when speculation is off)."""
    if now.speculative == "off":
        return {}
    curve = now.step_curve.as_dict() if now.step_curve is not None else None
    return {
        "speculative": now.speculative,
        "step_curve": StepCurveView(**curve) if curve is not None else None,
        "accept_rates": tuple(-1.0 if r is None else round(r, 4) for r in now.accept_rates),
    }
