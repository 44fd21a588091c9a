"""EngineRole: what prefill and decode instances share - an engine, its service, a data plane.

The engine is built off the event loop (weights load, model generated on first use) and run by
an :class:`EngineService`. The data plane carries KV + state between instances; a decode
receives into leases, a prefill sends into them. ``EngineStats`` reports the memory both hold,
so an operator (or a test) can see that nothing leaks after failures.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq.asyncio

from dsi.actor import handles
from dsi.config import EngineOptions, ModelConfig, NodeConfig, RoleConfig
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.service import EngineService
from dsi.messages.control import Load
from dsi.messages.gateway import Sampling
from dsi.messages.handoff import EngineStats, GetEngineStats
from dsi.roles.curve import server_keys
from dsi.roles.role import RoleActor
from dsi.transport.kv import DataPlane, make_data_plane
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Counters:
    """Handoff counters of one engine role, since start."""

    prefills: int = 0  # prefill-only requests run here
    handoffs: int = 0  # states sent (prefill) / leases opened (decode)
    failed_handoffs: int = 0
    leases: int = 0  # live decode leases
    persisted_blocks: int = 0  # full pages queued for the store


@dataclass(frozen=True, slots=True)
class EngineRoleSettings:
    """Everything an engine role needs from its node config."""

    options: EngineOptions
    model: ModelConfig
    root_seed: int = 0
    controller: str | None = None  # finds the kvstore (and nothing is persisted without one)
    keys: CurveKeys | None = None
    data_backend: str = "tcp"
    data_host: str = "127.0.0.1"  # the data plane binds here (the role's own host)
    lease_timeout_s: float = 30.0

    @classmethod
    def of(cls, role: RoleConfig, node: NodeConfig) -> EngineRoleSettings:
        assert isinstance(role.options, EngineOptions)
        host = urlsplit(role.bind).hostname or "127.0.0.1"
        if host in ("*", "0.0.0.0"):
            host = "127.0.0.1"
        return cls(role.options, node.model, node.cluster.root_seed, node.cluster.controller,
                   server_keys(node.security), node.data_plane.backend, host, node.data_plane.lease_timeout_s)


def sampling_params(s: Sampling) -> SamplingParams:
    return SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          min_p=s.min_p, seed=s.seed, stop_token_ids=tuple(s.stop_token_ids),
                          ignore_eos=s.ignore_eos, logprobs=s.logprobs > 0, top_logprobs=s.logprobs,
                          structured=s.structured)


class EngineRole(RoleActor):
    """Base of PrefillActor and DecodeActor."""

    collect_full_pages = False

    def __init__(self, name: str, settings: EngineRoleSettings) -> None:
        super().__init__(name)
        self.settings = settings
        self.service: EngineService | None = None
        self.data: DataPlane | None = None
        self.ctx: zmq.asyncio.Context | None = None
        self.counters = Counters()

    @property
    def engine(self) -> Engine:
        assert self.service is not None, "the engine is not started"
        return self.service.engine

    async def on_start(self) -> None:
        self.ctx = zmq.asyncio.Context()
        engine = await asyncio.get_running_loop().run_in_executor(None, self._build_engine)
        self.service = EngineService(engine)
        self.service.start()
        self.data = make_data_plane(self.settings.data_backend, self.settings.data_host)
        await self.data.start()
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.service is not None:
            await self.service.close()
        if self.data is not None:
            await self.data.close()
        if self.ctx is not None:
            self.ctx.destroy(linger=0)

    def _build_engine(self) -> Engine:
        from dsi.model.prepare import ensure_model
        from dsi.model.weights import load_model

        s = self.settings
        shape, weights = load_model(ensure_model(s.model.dir, s.model.config))
        cfg = EngineConfig(num_blocks=s.options.num_blocks, max_batch_tokens=s.options.max_batch_tokens,
                           max_running=s.options.max_running, num_slots=s.options.max_running,
                           root_seed=s.root_seed, collect_full_pages=self.collect_full_pages)
        log.info("%s: engine ready (%s, %d pages)", self.name, shape.name, cfg.num_blocks)
        return Engine(shape, weights, cfg)

    def load(self) -> Load:
        if self.service is None:
            return super().load()
        sched = self.engine.scheduler
        kv = sum(r.num_computed for r in list(sched.running))
        return Load(running=len(sched.running), queued=len(sched.waiting), kv_tokens=kv, inbox=self.inbox_depth)

    @handles
    def engine_stats(self, msg: GetEngineStats) -> EngineStats:
        c = self.counters
        counts = dict(prefills=c.prefills, handoffs=c.handoffs, failed_handoffs=c.failed_handoffs, leases=c.leases,
                      persisted_blocks=c.persisted_blocks)
        if self.service is None:
            return EngineStats(**counts)
        engine = self.engine
        pool, slots, st = engine.runner.pool, engine.runner.slots, engine.stats
        return EngineStats(
            total_blocks=pool.num_blocks - 1, free_blocks=pool.num_free, total_slots=slots.num_slots,
            free_slots=slots.num_free, running=len(engine.scheduler.running) + len(engine.scheduler.waiting),
            regions=self.data.stats.regions_live if self.data is not None else 0, cached_tokens=st.cached_tokens,
            replay_tokens=st.replay_tokens, computed_prompt_tokens=st.computed_prompt_tokens, **counts)
