"""DecodeActor: one decode instance, running the engine.

Until prefill/decode disaggregation lands, a decode instance serves whole requests: prompt and
continuation on its own engine. ``Generate`` is a streaming call answered with TokenChunk items
(one per engine step that produced tokens); leaving the stream, or an ``Abort`` tell, aborts the
request in the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from dsi.actor import handles
from dsi.config import EngineOptions, ModelConfig
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.service import EngineService
from dsi.messages.control import Load
from dsi.messages.gateway import Abort, Generate, Sampling, TokenChunk
from dsi.roles.role import RoleActor

log = logging.getLogger(__name__)


def sampling_params(s: Sampling) -> SamplingParams:
    return SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          min_p=s.min_p, seed=s.seed, stop_token_ids=tuple(s.stop_token_ids),
                          ignore_eos=s.ignore_eos, logprobs=s.logprobs > 0, top_logprobs=s.logprobs,
                          structured=s.structured)


class DecodeActor(RoleActor):
    def __init__(self, name: str, options: EngineOptions, model: ModelConfig) -> None:
        super().__init__(name)
        self.options = options
        self.model = model
        self.service: EngineService | None = None

    async def on_start(self) -> None:
        self.service = EngineService(await asyncio.get_running_loop().run_in_executor(None, self._build_engine))
        self.service.start()
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.service is not None:
            await self.service.close()

    def _build_engine(self) -> Engine:
        from dsi.model.prepare import ensure_model
        from dsi.model.weights import load_model

        shape, weights = load_model(ensure_model(self.model.dir, self.model.config))
        cfg = EngineConfig(max_batch_tokens=self.options.max_batch_tokens, max_running=self.options.max_running,
                           num_slots=self.options.max_running)
        log.info("%s: engine ready (%s, %d pages)", self.name, shape.name, cfg.num_blocks)
        return Engine(shape, weights, cfg)

    def load(self) -> Load:
        if self.service is None:
            return super().load()
        engine = self.service.engine
        kv = sum(r.num_computed for r in list(engine.scheduler.running))
        return Load(running=len(engine.scheduler.running), queued=len(engine.scheduler.waiting), kv_tokens=kv,
                    inbox=self.inbox_depth)

    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        assert self.service is not None
        prompt_tokens = len(msg.token_ids)
        async for out in self.service.generate(msg.request_id, list(msg.token_ids), sampling_params(msg.sampling)):
            yield TokenChunk(msg.request_id, out.new_tokens, out.finish_reason or "" if out.finished else "",
                             prompt_tokens, 0, out.new_logprobs)

    @handles
    async def abort(self, msg: Abort) -> None:
        if self.service is not None:
            self.service.abort(msg.request_id)
