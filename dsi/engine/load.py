"""EngineLoad: what an engine holds now and what it has done since it started.

``EngineService`` takes one after every step (and after every batch of admissions, aborts and
calls), on the task that owns the engine; roles read the latest for their load reports and
heartbeats, never the scheduler or the pools themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsi.engine.step_curve import StepCurve


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int = 0  # requests being stepped
    waiting: int = 0  # requests queued for admission (preempted ones included)
    kv_tokens: int = 0  # positions whose KV the running requests hold
    free_pages: int = 0  # Block KV pages neither used nor reserved
    free_slots: int = 0  # state slots neither used nor reserved
    # Counters since the engine started (computed positions count work done, recomputation included)
    prompt_tokens: int = 0  # prompt positions of added requests
    cached_tokens: int = 0  # of those, loaded from a cached prefix
    replay_tokens: int = 0  # prompt positions recomputed only to rebuild SWA rings
    computed_prompt_tokens: int = 0  # prompt positions run through the model (replay included)
    # Speculative decoding ([engine] speculative): the mode, the step-time curve a dspark engine
    # measured at start-up, and the acceptance rate of each draft position so far (None: never
    # verified with every draft before it accepted).
    speculative: str = "off"
    step_curve: StepCurve | None = None
    accept_rates: tuple[float | None, ...] = ()
