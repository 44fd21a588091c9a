"""Engine: requests in, tokens out; continuous batching with asynchronous scheduling.

Synchronous mode runs ``schedule -> execute -> update`` in turn. Asynchronous mode keeps the
device busy: while step N executes on the worker thread, the CPU schedules step N+1 and submits
it, then processes N's tokens while N+1 runs::

    CPU:     sched N+1 | wait N | update N | sched N+2 | wait N+1 | update N+1 ...
    worker:  [---- step N ----][---- step N+1 ----][---- step N+2 ----]

A request that finishes in N still has a slice in N+1 (its extra token is discarded); its
pages and slot are freed only once N+1 has run. A step that could only be scheduled by
preempting waits until nothing is in flight, so preemption never races the worker. On CUDA the
worker is a stream; on the CPU it is one thread (torch releases the GIL inside kernels).
Speculative decoding in this mode: see dsi.engine.speculator (a request's drafts proposed by
step N are filled into its N + 1 slice by the worker; after a verify slice the next slice's
position is set by the worker too).

Prefix hits (``add_request(..., cached=CachedPrefix)``): the hit's pages are loaded on
admission (``layered_hit_load``: layer by layer beside the request's first forward, see
dsi.engine.hit_load; otherwise all before it) and the request computes only positions >= R
(the bounded SWA replay and the uncached tokens), with the semantics that
:func:`dsi.model.reference.reference_logits` defines for ``hit = H``. A preempted hit request keeps its CachedPrefix and is admitted the same way
again, so its output stays that of the reference with the hit. An exact hit (``cached.rings``,
``H <= exact_hit_limit``) loads the producer SWA rings too and computes from H: its output is
the hit-free one. With ``collect_ring_snapshots`` every request that finishes (not aborted) or
is exported queues the rings of its last block boundary (``take_ring_snapshots``), what a later
exact hit loads.

Structured output: a request's constraint is built on admission and from then on touched only by
the worker, in step order (sampling runs there). It has accepted every token the worker sampled
for the request, including one the CPU has not appended yet; a request that finishes by
completing its constraint ends with "stop" and no EOS token. After a preemption, and on import,
the constraint is rebuilt by replaying the request's output tokens.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from dsi.engine.admission import check_cached, check_prompt, check_state
from dsi.engine.device import KEY, decode_kernels, parse_device, resolve_device
from dsi.engine.experts import ExpertLayer
from dsi.engine.full_pages import FullPages
from dsi.engine.hit_load import HitLoader
from dsi.engine.images import ImageEmbeds, block_extras, check_images, packed, unpacked
from dsi.engine.leases import Leases
from dsi.engine.load import EngineLoad
from dsi.engine.params import SamplingParams
from dsi.engine.penalties import OutputCounts
from dsi.engine.prefix import CachedPrefix, EngineStats, FullPage, RequestStats, RingSnapshot
from dsi.engine.request import Request, Status, constraint_at, stop_reason
from dsi.engine.ring_snapshots import RingSnapshots
from dsi.engine.runner import ModelRunner
from dsi.engine.runner_dense import DenseRunner
from dsi.engine.runner_gemma3 import Gemma3Runner
from dsi.engine.sampler import Sampled, sample
from dsi.engine.scheduler import PLACEHOLDER, Scheduler, Step
from dsi.engine.shape import EngineShape
from dsi.engine.spec_steps import build_speculator, propose_step, verify_step
from dsi.engine.speculator import MODES
from dsi.engine.step_curve import StepCurve
from dsi.engine.transfer import RequestState, Reservation
from dsi.errors import InvalidRequest
from dsi.model.config import ModelConfig
from dsi.model.gemma3 import Gemma3Config
from dsi.model.llama import LlamaConfig
from dsi.model.reference import consumer_start, replay_start
from dsi.structured import SpecError, default_compiler


@dataclass(slots=True)
class EngineConfig:
    num_blocks: int = 1024  # Block KV pages (including the null page)
    num_slots: int = 96  # state slots = most running sequences
    max_batch_tokens: int = 2048  # token budget per step (prefill chunk size bound)
    max_running: int = 96
    replay: bool = True  # decoder-side bounded replay (consumer layers on the last `keep` tokens)
    async_scheduling: bool | None = None  # None: the faster mode of the device (see scheduling_mode)
    batch_invariant: bool = True  # a request's tokens do not depend on the rest of the batch
    root_seed: int = 0  # cluster-wide seed of the page hash chain (cluster.root_seed)
    collect_full_pages: bool = False  # queue a FullPage copy of every page that fills (decode persistence)
    collect_ring_snapshots: bool = False  # queue a RingSnapshot of every finished or exported request
    speculative: str = "off"  # "off" | "fixed" (num_drafts each step) | "dspark" (variable length)
    num_drafts: int = 5  # drafts proposed per request and step (1..5)
    step_curve: StepCurve | None = None  # dspark: a curve to use instead of measuring one at start-up
    device: str = "cpu"  # any torch device string (dsi.engine.device); only the CPU runs a step so far
    # Copy a prefix hit's pages layer by layer while its first forward runs (dsi.engine.hit_load;
    # the same bits, `dsi bench hit-load` measures the time); False: all of them before it.
    layered_hit_load: bool = True

    def __post_init__(self) -> None:
        if self.num_blocks < 2 or self.num_slots < 1 or self.max_batch_tokens < 1 or self.max_running < 1:
            raise ValueError("engine sizes must be positive (num_blocks >= 2)")
        if self.speculative not in MODES:
            raise ValueError(f"speculative must be one of {', '.join(MODES)}, not {self.speculative!r}")
        parse_device(self.device)


def auto_async(device: str) -> bool:
    """The faster scheduling mode of a device kind, as ``dsi bench engine`` measures it: on the CPU
    the forward is Python-dispatched and holds the GIL, so a scheduling thread beside it only
    contends for the interpreter and the cores (sync wins at batch 1, 16 and 64); on CUDA the
    forward is queued asynchronously and the overlap hides the CPU's scheduling time."""
    return device == "cuda"


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    new_tokens: list[int]
    output: list[int]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    new_logprobs: list[float]
    new_top_logprobs: list[list[tuple[int, float]]]
    logprobs: list[float] | None = None  # every output token's logprob, on the finishing output only


@dataclass(slots=True)
class StepTiming:
    start: float  # perf_counter seconds
    end: float
    tokens: int


class Engine:
    def __init__(
        self,
        cfg: ModelConfig | LlamaConfig | Gemma3Config,
        weights: dict[str, torch.Tensor],
        config: EngineConfig | None = None,
        experts: ExpertLayer | None = None,
        draft: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """``experts``: an expert-parallel MoE (V4 shape only); the engine closes it. ``draft``: the
        draft weights (:mod:`dsi.model.draft`), needed when speculating."""
        self.cfg = cfg
        self.config = config or EngineConfig()
        c = self.config
        self.device = resolve_device(c.device)  # ValueError naming the key: unknown or not here
        if self.device.type != "cpu":
            raise ValueError(
                f"{KEY} = {c.device!r}: only the CPU runs the engine's step loop so far (the runner's "
                "forward and the sampler still make host tensors); see dsi.engine.device"
            )
        self.experts = experts
        if cfg.family in ("llama", "gemma3"):
            if experts is not None:
                raise ValueError("expert parallelism needs an MoE model")
            runner = DenseRunner if cfg.family == "llama" else Gemma3Runner
            self.runner = runner(cfg, weights, c.num_blocks, c.num_slots, c.batch_invariant)
        elif experts is not None:  # attention data-parallel over the group's ranks
            self.runner = experts.runner(cfg, weights, c.num_blocks, c.num_slots, c.batch_invariant)
        else:
            kernels = decode_kernels(self.device)
            self.runner = ModelRunner(
                cfg,
                weights,
                c.num_blocks,
                c.num_slots,
                c.batch_invariant,
                device=self.device,
                kernels=kernels,
            )
        # The V4 runner waits per layer; an expert-parallel group's other ranks read the pages
        # with no way to wait on this process's copier, and the dense runners do not wait.
        self.hit_loader = (
            HitLoader(cfg, self.device)
            if c.layered_hit_load and isinstance(self.runner, ModelRunner) and experts is None
            else None
        )
        self.scheduler = Scheduler(
            self.runner.pool,
            self.runner.slots,
            cfg.block_size,
            c.max_batch_tokens,
            c.max_running,
            self.hit_loader,
        )
        self.requests: dict[str, Request] = {}
        self.shape = EngineShape.of(
            cfg, num_blocks=c.num_blocks, num_slots=c.num_slots, root_seed=c.root_seed, replay=c.replay
        )
        self.leases = Leases(cfg, self.runner.pool, self.runner.slots)
        self.full_pages = FullPages(
            self.shape.hash_chain, self.runner.pool, cfg.block_size, c.collect_full_pages
        )
        if c.collect_ring_snapshots and cfg.ring and not cfg.window - 1 <= cfg.snapshot_tokens <= cfg.window:
            raise ValueError(
                "ring snapshots need window - 1 or window positions (block_size for the V4 shape)"
            )
        self.ring_snapshots = RingSnapshots(self.shape.hash_chain, cfg.block_size, c.collect_ring_snapshots)
        self.stats = EngineStats()
        self.timings: list[StepTiming] = []
        self.async_scheduling = (
            c.async_scheduling if c.async_scheduling is not None else auto_async(self.device.type)
        )
        self._worker = (
            ThreadPoolExecutor(1, thread_name_prefix="dsi-engine") if self.async_scheduling else None
        )
        self._inflight: tuple[Step, Future] | None = None
        self._last_token: dict[int, int] = {}  # id(request) -> token sampled by the last step (worker-owned)
        self._resume: dict[int, int] = {}  # id(request) -> where its last verify slice left off (worker)
        self._output_counts = OutputCounts()  # for penalties (worker-owned)
        self._pending: list[RequestOutput] = []  # outputs of a step drained outside step()
        self.spec = (
            build_speculator(
                cfg,
                c.speculative,
                c.num_drafts,
                c.step_curve,
                self.runner,
                weights,
                draft,
                c.max_running,
                c.batch_invariant,
            )
            if c.speculative != "off"
            else None
        )
        if self.spec is not None:
            self.spec.pipelined = self.async_scheduling

    # ---- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        prefill_only: bool = False,
        cached: CachedPrefix | None = None,
        images: Sequence[ImageEmbeds] = (),
    ) -> None:
        """Validate and queue; raises InvalidRequest and changes nothing on bad input.
        ``cached``: a prefix hit (see the module docstring and CachedPrefix). ``images``: input
        embeddings of image positions (dsi.engine.images); their digests join the page hashes."""
        if request_id in self.requests:
            raise InvalidRequest(f"request id {request_id!r} is already in use")
        keep = self.shape.keep
        check_prompt(self.cfg, self.config.num_blocks, prompt, params)
        if cached is not None:
            check_cached(self.cfg, self.config.num_blocks, cached, len(prompt), keep)
        if images:
            if self.cfg.family != "v4":
                raise InvalidRequest(f"the {self.cfg.family} family takes no image input")
            check_images(self.cfg.hidden, len(prompt), images)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        start = consumer_start(len(prompt), keep)
        req = Request(
            request_id, list(prompt), params, start, seed, arrival=time.monotonic(), prefill_only=prefill_only
        )
        if cached is not None and cached.num_tokens:
            req.cached, req.num_cached = cached, cached.num_tokens
            # No SWA rings (a full-attention family): the pages are the whole cache, every hit is exact.
            exact = cached.exact or not self.cfg.ring
            req.replay_start = (
                cached.num_tokens if exact else replay_start(cached.num_tokens, start, self.cfg.window)
            )
        if images:
            req.images, req.block_extras = tuple(images), block_extras(images, self.cfg.block_size)
        if params.structured is not None:
            req.constraint = default_compiler().constraint(params.structured)
        self.stats.prompt_tokens += len(prompt)
        self.stats.cached_tokens += req.num_cached
        req.stats.cached_tokens = req.num_cached
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> bool:
        """Stop a request; a prefill-only request that is done gives its kept cache back."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        if req.finished:
            if not (req.prefill_only and req.slot >= 0):
                return False
            self._drain()
            self._release(req)
            del self.requests[request_id]
            return True
        self._finish(req, "abort")
        # Reported by the next step() even when nothing else runs (in sync mode no step is in flight).
        self._pending.append(
            RequestOutput(req.request_id, [], list(req.output), True, "abort", len(req.prompt), [], [])
        )
        del self.requests[request_id]
        return True

    def take_full_pages(self) -> list[FullPage]:
        """Pages that filled since the last call (``collect_full_pages``); any thread may call it."""
        return self.full_pages.take()

    def take_ring_snapshots(self) -> list[RingSnapshot]:
        """Snapshots of requests finished or exported since the last call (``collect_ring_snapshots``);
        any thread may call it."""
        return self.ring_snapshots.take()

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting or self._inflight or self._pending)

    def load(self) -> EngineLoad:
        """What the engine holds now, and its counters since it started."""
        sched, st = self.scheduler, self.stats
        return EngineLoad(
            len(sched.running),
            len(sched.waiting),
            sum(r.num_computed for r in sched.running),
            self.runner.pool.num_free,
            self.runner.slots.num_free,
            st.prompt_tokens,
            st.cached_tokens,
            st.replay_tokens,
            st.computed_prompt_tokens,
            self.config.speculative,
            self.spec.curve if self.spec is not None else None,
            tuple(self.spec.stats.accept_rates(self.spec.k)) if self.spec is not None else (),
        )

    def request_stats(self, request_id: str) -> RequestStats | None:
        """A copy of what a request has cost so far (held, finished or exported recently), or None."""
        req = self.requests.get(request_id)
        stats = req.stats if req is not None else self.stats.last_request(request_id)
        return dataclasses.replace(stats) if stats is not None else None

    # ---- stepping ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Advance by one device step; returns the requests that got tokens or finished."""
        if self._worker is None:
            step = self.scheduler.schedule()
            if not step.slices:
                return self._collect([])
            if self.spec is not None:
                self._add_drafts(step)
            return self._update(step, self._execute(step))
        if self._inflight is None:
            step = self.scheduler.schedule()
            if not step.slices:
                return self._collect([])
            if self.spec is not None:
                self._add_drafts(step)
            self._inflight = (step, self._worker.submit(self._execute, step))
        current, future = self._inflight
        following = self.scheduler.schedule(allow_preempt=False)
        if following.blocked:  # needs a preemption: undo nothing, retry once the worker is idle
            self._unschedule(following)
            following = Step()
        elif self.spec is not None and following.slices:
            self._add_drafts(following)
        nxt = (following, self._worker.submit(self._execute, following)) if following.slices else None
        sampled = future.result()
        self._inflight = nxt
        return self._update(current, sampled)

    def run_until_done(self) -> list[RequestOutput]:
        outputs = []
        while self.has_unfinished():
            outputs += self.step()
        return outputs

    def close(self) -> None:
        if self._inflight is not None:
            self._inflight[1].result()
            self._inflight = None
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        if self.hit_loader is not None:
            self.hit_loader.close()
        if self.experts is not None:
            self.experts.close()

    # ---- disaggregation --------------------------------------------------------------------------
    def export_request(self, request_id: str, skip: int = 0, hold: bool = False) -> RequestState:
        """Copy out a request's cache and counters and release it here (prefill-only or running).
        ``skip``: leading pages the receiver already holds (pre-copied full pages, see
        ``full_pages_of``); the state's ``pages`` are the ones after them. ``hold``: the pages are
        not copied but held in the pool (``state.page_rows`` views them, ``state.held`` names
        them) until ``release_held(state.held)``; the request is gone from the engine either way."""
        self._drain()
        req = self.requests.get(request_id)
        if req is None or req.slot < 0 or (req.finished and not req.prefill_only):
            raise InvalidRequest(f"request {request_id!r} has no cache to export")
        if req.num_computed == 0:
            raise InvalidRequest(f"request {request_id!r} has not run yet")
        if not 0 <= skip <= req.num_computed // self.cfg.block_size:
            raise InvalidRequest(
                f"request {request_id!r} has {req.num_computed // self.cfg.block_size} full "
                f"pages; {skip} cannot be skipped"
            )
        self._loaded(req)
        blocks = req.block_table[skip:]
        pool = self.runner.pool
        if hold:
            pool.hold(blocks)
            pages = torch.empty(len(blocks), pool.pages.shape[1], dtype=pool.pages.dtype, device="meta")
        else:
            pages = pool.pages[torch.tensor(blocks, dtype=torch.long)]  # a copy
        state = RequestState(
            req.request_id,
            list(req.prompt),
            list(req.output),
            req.params,
            req.seed,
            req.consumer_start,
            req.num_computed,
            pages,
            self.runner.slots.rings[req.slot].clone(),
            self.runner.slots.partial[req.slot].clone(),
            list(req.logprobs),
            req.num_cached,
            req.replay_start,
            packed(req.images, self.cfg.hidden) if req.images else None,
            [(im.offset, im.tokens, im.digest) for im in req.images],
        )
        if hold:
            state.page_rows, state.held = tuple(pool.pages[b] for b in blocks), tuple(blocks)
        if not req.finished:
            self.scheduler.finish(req, "migrated")
        self._queue_snapshot(req)
        self._release(req)
        del self.requests[request_id]
        return state

    def release_held(self, pages: tuple[int, ...]) -> None:
        """Give back the pool pages a held export kept (``state.held``), once they were sent."""
        self.runner.pool.free(list(pages))

    def full_pages_of(self, request_id: str, start: int) -> torch.Tensor:
        """A copy of a running request's full pages from ``start`` on: ``[m, page_elems]`` fp32
        (m may be 0). A full page never changes again, so a copy taken while the request keeps
        decoding stays valid (live migration pre-copies them). InvalidRequest when the request
        holds no cache here (unknown, finished, or preempted)."""
        self._drain()
        req = self.requests.get(request_id)
        if req is None or req.slot < 0 or req.finished:
            raise InvalidRequest(f"request {request_id!r} has no cache here")
        self._loaded(req)
        full = min(req.num_computed // self.cfg.block_size, len(req.block_table))
        blocks = req.block_table[start:full]
        return (
            self.runner.pool.pages[torch.tensor(blocks, dtype=torch.long)].clone()
            if blocks
            else self.runner.pool.pages.new_empty((0, self.runner.pool.pages.shape[1]))
        )

    def reserve(self, num_blocks: int) -> Reservation:
        """Take ``num_blocks`` pages and a state slot out of the scheduler's reach (for an import)."""
        return self.leases.reserve(num_blocks)

    def release(self, res: Reservation) -> None:
        """Give a reservation's pages and slot back; a no-op once released or imported."""
        self.leases.release(res)

    def grow_reservation(self, res: Reservation, num_blocks: int) -> None:
        """Reserve more pages so that ``res`` holds at least ``num_blocks`` (InvalidRequest: no room)."""
        self.leases.grow(res, num_blocks)

    def write_pages(self, res: Reservation, start: int, pages: torch.Tensor) -> None:
        """Copy full pages into a reservation from page ``start`` on (reserved memory: any thread)."""
        self.leases.write_pages(res, start, pages)

    def write_reservation(self, state: RequestState, res: Reservation, held: int = 0) -> None:
        """Copy a state's buffers into a reservation's pages and slot. The memory is reserved, so
        this may run on any thread while the engine steps; ``import_request`` then copies nothing.
        ``held``: leading pages already written (``write_pages``); ``state.pages`` follow them."""
        self.leases.write(state, res, held)

    def import_request(
        self, state: RequestState, reservation: Reservation | None = None, held: int = 0
    ) -> None:
        """Admit a request with imported cache; it continues from ``num_computed``. With a
        reservation its pages and slot are used (extra pages go back to the pool); on an error
        the reservation stays held for the caller to release. ``held`` (with a reservation): its
        first pages already hold the request's leading pages, and ``state.pages`` the rest."""
        self._drain()
        if state.request_id in self.requests:
            raise InvalidRequest(f"request id {state.request_id!r} is already in use")
        if held and reservation is None:
            raise InvalidRequest("pre-copied pages need the reservation that holds them")
        check_state(self.cfg, state, held)
        params = state.params
        check_prompt(self.cfg, self.config.num_blocks, state.prompt, params)
        n = held + state.pages.shape[0]
        if reservation is None and (n > self.runner.pool.num_free or not self.runner.slots.num_free):
            raise InvalidRequest("not enough free pages or state slots to import the request")
        if reservation is not None and not reservation.active:
            raise InvalidRequest("the reservation was released")
        req = Request(
            state.request_id,
            list(state.prompt),
            params,
            state.consumer_start,
            state.seed,
            arrival=time.monotonic(),
            output=list(state.output),
            logprobs=list(state.logprobs),
        )
        if state.image_spans:
            if state.images is None:
                raise InvalidRequest("the imported state names images but carries no embeddings")
            req.images = unpacked(state.images, state.image_spans)
            check_images(self.cfg.hidden, len(req.prompt), req.images)
            req.block_extras = block_extras(req.images, self.cfg.block_size)
        if params.structured is not None:
            try:
                req.constraint = default_compiler().replay(params.structured, req.output)
            except SpecError as exc:
                raise InvalidRequest(f"imported request: {exc}") from None
            req.constraint_pos = len(req.output)
        req.block_table, req.slot = self.leases.take(state, reservation or self.reserve(n), held)
        if state.num_cached and state.replay_start == state.num_cached:
            # An exact hit: its rings at H are not in the state; a preemption here recomputes
            # from 0 (the hit-free run, which the exact hit equals). See Scheduler._preempt.
            req.num_cached, req.replay_start = state.num_cached, state.replay_start
        elif state.num_cached:  # kept so that a preemption here recomputes with the same hit
            blocks = state.num_cached // self.cfg.block_size
            pages = self.runner.pool.pages[torch.tensor(req.block_table[:blocks], dtype=torch.long)].clone()
            req.cached, req.num_cached, req.replay_start = (
                CachedPrefix(state.num_cached, pages),
                state.num_cached,
                state.replay_start,
            )
        req.num_computed = state.num_computed
        req.status = Status.RUNNING
        self.requests[req.request_id] = req
        self.scheduler.running.append(req)
        self.full_pages.update(req, req.num_computed)

    # ---- internals ---------------------------------------------------------------------------------
    @staticmethod
    def _loaded(req: Request) -> None:
        """Wait until a hit's pages are all in the pool (reads of pages outside the forward)."""
        if req.hit_load is not None:
            req.hit_load.wait_all()

    def _execute(self, step: Step) -> list[list[Sampled]]:
        """Runs on the worker: fill placeholders from the previous step, forward, sample (verify
        the drafts of verify slices); per sampled slice, the tokens it emits."""
        t0 = time.perf_counter()
        for i, (sl, req, fill) in enumerate(zip(step.slices, step.requests, step.fills, strict=True)):
            if i in step.floating:  # where the verify slice before it left off
                sl.start = self._resume.pop(id(req))
            if fill:
                k = step.draft_fills.get(i, 0)
                sl.tokens[-1 - k] = self._last_token[id(req)]
                if k:  # drafts proposed by the previous step (async scheduling)
                    assert self.spec is not None
                    sl.tokens[-k:] = self.spec.fill_drafts(req, sl.start + 1, k, self._last_token[id(req)])
        snapshots = step.snapshots if self.ring_snapshots.collect else None
        hidden: list[torch.Tensor] | None = None
        if self.spec is None:
            logits = self.runner.forward(step.slices, snapshots)
        else:  # the V4 or dense runner: the draft is fed by its last hidden states
            hidden = []
            logits = self.runner.forward(step.slices, snapshots, hidden)
        if self.experts is not None:
            self.experts.end_step()  # a rebalance runs here, between this step and the next
        chosen = [(sl, req) for sl, req in zip(step.slices, step.requests, strict=True) if sl.sample]
        rows = _first_rows([sl.num_logits for sl, _ in chosen])
        single = [i for i, (sl, _) in enumerate(chosen) if sl.num_logits == 1]
        plain = [chosen[i] for i in single]
        counts = [self._output_counts.before(r, sl.end, self._last_token.get(id(r))) for sl, r in plain]
        sampled = sample(
            logits if len(single) == len(rows) else logits[[rows[i] for i in single]],
            [r.params for _, r in plain],
            [r.seed for _, r in plain],
            [sl.end for sl, _ in plain],
            [constraint_at(sl.end, r) for sl, r in plain],
            counts,
        )
        out: list[list[Sampled]] = [[s] for s in sampled]
        if len(single) != len(rows):  # verify slices: drafts checked against their rows
            out = verify_step(self.spec, step, chosen, rows, logits, single, sampled)
            for j, accepted in step.accepted.items():  # before the next step's forward
                sl, req = step.slices[j], step.requests[j]
                self._resume[id(req)] = sl.start + accepted + 1
                self.runner.rollback(sl.slot, sl.start + accepted + 1)
        for (_, req), new in zip(chosen, out, strict=True):
            for s in new:
                self._last_token[id(req)] = s.token
                self._output_counts.add(req, s.token)
                req.constraint_pos += req.constraint is not None
        if self.spec is not None and hidden is not None:
            propose_step(self.spec, chosen, rows, hidden[0], out)
        self.timings.append(StepTiming(t0, time.perf_counter(), step.num_tokens))
        return out

    def _update(self, step: Step, sampled: list[list[Sampled]]) -> list[RequestOutput]:
        self._count(step)
        self._rollback(step)  # before hashing: rejected positions fill no page
        self.ring_snapshots.commit(step.requests, step.snapshots)  # before finishing: queued on finish
        self._hash_full_pages(step)  # before finishing: a finishing request's pages are freed below
        touched: dict[int, tuple[Request, list[Sampled]]] = {}
        chosen = [req for sl, req in zip(step.slices, step.requests, strict=True) if sl.sample]
        for req, new in zip(chosen, sampled, strict=True):
            req.in_flight -= 1
            for s in new:
                if req.finished:
                    break  # finished while this step ran (or by an earlier token): discarded
                req.output.append(s.token)
                req.logprobs.append(s.logprob)
                req.top_logprobs.append(s.top)
                touched.setdefault(id(req), (req, []))[1].append(s)
                reason = s.finish or stop_reason(req, s.token, self.cfg.max_context, self.cfg.eos_id)
                if reason:
                    self._finish(req, reason)
        for req in step.to_free:
            self._release(req)
        return self._collect(touched.values())

    def _hash_full_pages(self, step: Step) -> None:
        """Give every page this step filled its chain hash (and queue a copy when collecting)."""
        for sl, req in zip(step.slices, step.requests, strict=True):
            if (req.finished and not req.prefill_only) or req.slot < 0:
                continue
            self.full_pages.update(req, min(sl.end, req.num_tokens, req.num_computed))

    # ---- speculative decoding -----------------------------------------------------------------------
    def _add_drafts(self, step: Step) -> None:
        """Give the decode slices of a scheduled step their drafts (the speculator's lengths).

        A slice whose input token is still being sampled by the step in flight (async
        scheduling) verifies the drafts that step proposes after sampling it; they are not known
        yet, so its lengths come from the confidences of the drafts before them (one step
        stale) and the worker fills the tokens in (``Step.draft_fills``)."""
        assert self.spec is not None
        decode = [
            i
            for i, (sl, req) in enumerate(zip(step.slices, step.requests, strict=True))
            if sl.sample and len(sl.tokens) == 1 and i not in step.floating and self.spec.eligible(req)
        ]
        if not decode:
            return
        budget = self.config.max_batch_tokens - step.num_tokens
        plan = self.spec.plan(
            [step.requests[i] for i in decode],
            [step.slices[i].start + 1 for i in decode],
            step.num_tokens,
            budget,
        )
        for i in decode:
            req = step.requests[i]
            n = plan.get(id(req), 0)
            if not n:
                continue
            drafts = [PLACEHOLDER] * n if step.fills[i] else self.spec.drafts_of(req, n)
            if self.scheduler.add_drafts(step, i, drafts) and step.fills[i]:
                step.draft_fills[i] = n

    def _rollback(self, step: Step) -> None:
        """Verify slices: keep the positions of the accepted drafts, drop the rest."""
        for j, accepted in step.accepted.items():
            sl, req = step.slices[j], step.requests[j]
            end = sl.start + accepted + 1
            self.scheduler.rollback(req, end)  # the runner's part ran on the worker (_execute)
            for k, (boundary, _snap) in list(step.snapshots.items()):
                if k == j and boundary > end:
                    del step.snapshots[k]

    def _count(self, step: Step) -> None:
        """Prompt positions this step computed, and which of them only rebuilt SWA rings."""
        for sl, req in zip(step.slices, step.requests, strict=True):
            computed = max(0, min(sl.end, len(req.prompt)) - sl.start)
            replayed = max(0, min(sl.end, req.num_cached) - max(sl.start, req.replay_start))
            req.stats.computed_prompt_tokens += computed
            req.stats.replay_tokens += replayed
            self.stats.computed_prompt_tokens += computed
            self.stats.replay_tokens += replayed

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req, reason)
        self.stats.record(req.request_id, req.stats)  # its figures are final; its pages may be freed later
        if req.prefill_only and reason == "prefilled":
            req.cached = None  # never preempted from here on: the caller's buffer is not needed
            return  # keeps its cache (and ring snapshot) until export_request
        if reason != "abort":
            self._queue_snapshot(req)
        if self._inflight is not None and req in self._inflight[0].requests:
            self._inflight[0].to_free.append(req)
        else:
            self._release(req)

    def _queue_snapshot(self, req: Request) -> None:
        if self.ring_snapshots.queue(req):
            self.stats.ring_snapshots += 1

    def _release(self, req: Request) -> None:
        if self.spec is not None:
            self.spec.forget(req)
        self.scheduler.free(req)
        self._last_token.pop(id(req), None)
        self._resume.pop(id(req), None)
        self._output_counts.drop(req)
        req.cached = None  # the caller's buffer is not needed any more
        self.stats.record(req.request_id, req.stats)

    def _collect(self, touched: Iterable[tuple[Request, list[Sampled]]]) -> list[RequestOutput]:
        outs, self._pending = self._pending, []
        for req, new in touched:
            outs.append(
                RequestOutput(
                    req.request_id,
                    [s.token for s in new],
                    list(req.output),
                    req.finished,
                    req.finish_reason,
                    len(req.prompt),
                    [s.logprob for s in new],
                    [s.top for s in new],
                    list(req.logprobs) if req.finished else None,
                )
            )
            if req.finished and not req.prefill_only:
                self.requests.pop(req.request_id, None)
        return outs

    def _unschedule(self, step: Step) -> None:
        """Roll back the counters of a step that will not run."""
        for i, (sl, req) in enumerate(zip(step.slices, step.requests, strict=True)):
            req.num_computed -= len(sl.tokens)
            if sl.sample:
                req.in_flight -= 1
            if i in step.floating:
                req.floating = False

    def _drain(self) -> None:
        if self._inflight is not None:
            step, future = self._inflight
            self._inflight = None
            # _update's outputs already include the earlier pending ones (and it empties the list)
            self._pending = self._update(step, future.result())


def _first_rows(counts: list[int]) -> list[int]:
    """The first logits row of each sampled slice, from each slice's row count."""
    rows, a = [], 0
    for n in counts:
        rows.append(a)
        a += n
    return rows
