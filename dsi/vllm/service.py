"""VllmService: vLLM's AsyncLLM embedded in a dsi role, behind one door.

    role --generate(request_id, token ids, SamplingParams, kv params)--> AsyncLLM --> VllmOutput stream
    role --abort(request_id)--> AsyncLLM.abort
    vLLM's scheduler stats (every engine step) --> _LoadLogger --> ``load`` (a VllmLoad, any reader)

``start`` builds the engine off the event loop (loading weights and profiling memory take tens of
seconds) on a thread the service keeps until ``close``: vLLM's engine core is a child process
that dies with that thread's process (see dsi.vllm.connector), and the KV connector dsi wires in
(see dsi.vllm.wiring) is loaded there. The service sets the process environment vLLM reads at
start (CPU KV cache size, OpenMP core binding, offline Hugging Face hub): a vLLM role owns its
process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsi.config.vllm import VllmOptions
from dsi.engine.params import SamplingParams
from dsi.errors import DsiError, InvalidRequest
from dsi.vllm.cores import resolve_cores
from dsi.vllm.sampling import split_logprobs, vllm_sampling

log = logging.getLogger(__name__)


class VllmFailed(DsiError):
    """vLLM's engine failed (its core process died, or a step raised): the role cannot serve."""

    code = "vllm_failed"


@dataclass(frozen=True, slots=True)
class VllmLoad:
    """The engine's latest scheduler stats: requests running and waiting, the fraction of KV
    blocks in use (0..1); and its prompt tokens since start by where their KV came from (vLLM's
    ``prompt_tokens_by_source``): computed here, found in its local prefix cache, or loaded by
    the connector (``external``)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    computed_tokens: int = 0
    local_hit_tokens: int = 0
    external_tokens: int = 0


@dataclass(frozen=True, slots=True)
class VllmShape:
    """What the engine is: its KV blocks (tokens each, how many), the model's vocabulary, its
    maximum sequence length and vLLM's version."""

    block_size: int
    num_blocks: int
    vocab_size: int
    max_model_len: int
    version: str

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks


@dataclass(slots=True)
class VllmOutput:
    """New tokens of one request since the last output. ``cached_tokens``: prompt tokens vLLM did
    not compute (its local prefix cache and KV loaded by the connector); ``kv_transfer_params``:
    what the connector returned when the request finished."""

    new_tokens: list[int]
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finished: bool = False
    finish_reason: str = ""
    cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None


KV_CACHE_VARIABLE = "VLLM_CPU_KVCACHE_SPACE"  # the CPU build's KV cache GiB


def engine_environment(options: VllmOptions, allowed_cpus: Iterable[int]) -> dict[str, str]:
    """The variables vLLM reads at start (set before vLLM is first imported): KV cache GiB (absent
    when ``args`` sets ``kv_cache_memory_bytes``: vLLM's CPU build lets the variable override the
    argument whenever it is set, see :func:`apply_engine_environment`) and core binding (CPU build;
    ``cpu_threads`` resolved against ``allowed_cpus``, the ids this process may run on:
    CoresUnavailable when it names others), offline hub, no usage reports, logs on stderr (a
    role's stdout carries only its READY line, see dsi.provision.process), and no working
    directory on the module path of the Python processes vLLM starts (``python -m ...`` from the
    repository root would otherwise find dsi's source folders, ``kernels/`` among them, as
    top-level packages: see dsi.folders).

    An unbound engine of one worker (``cpu_threads = "nobind"``, no tensor or pipeline
    parallelism, no executor chosen in ``args``) runs its model in vLLM's engine-core process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the uni-process executor) instead of a worker process
    beside it, which vLLM's CPU build starts by default: one process and one vLLM import fewer.
    ``AsyncLLM`` keeps its engine core in a process of its own either way. A bound engine keeps
    vLLM's executor: vLLM binds only its workers' threads to ``VLLM_CPU_OMP_THREADS_BIND``, and
    the worker leaves the engine core's scheduling and output work to the other cores (in one
    process, bound, that work took turns with the model: 0.90x the output tokens/s of ``vllm
    serve`` on one core, against 0.98x with the worker)."""
    env = {
        "PYTHONSAFEPATH": "1",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if "kv_cache_memory_bytes" not in dict(options.args):
        env[KV_CACHE_VARIABLE] = str(options.kv_cache_gib)
    cores = resolve_cores(options.cpu_threads, allowed_cpus)
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    if cores == "nobind" and one_worker(options):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def one_worker(options: VllmOptions) -> bool:
    """True when ``args`` ask for one worker and leave the executor to vLLM (an unbound one runs
    in the engine core, see :func:`engine_environment`)."""
    args = dict(options.args)
    parallel = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
    return (
        parallel == 1
        and int(args.get("data_parallel_size", 1)) == 1
        and "distributed_executor_backend" not in args
    )


def apply_engine_environment(
    environ: MutableMapping[str, str], options: VllmOptions, allowed_cpus: Iterable[int]
) -> None:
    """Set :func:`engine_environment` in ``environ`` (``os.environ``, or a child's copy), removing
    an inherited KV cache size the options replace with ``kv_cache_memory_bytes``."""
    env = engine_environment(options, allowed_cpus)
    if KV_CACHE_VARIABLE not in env:
        environ.pop(KV_CACHE_VARIABLE, None)
    environ.update(env)


def engine_args(options: VllmOptions, model_dir: Path, wiring: Mapping[str, Any]) -> Any:
    """vLLM's AsyncEngineArgs: dsi's settings, ``[roles.vllm] args``, and the connector wiring
    (``kv_transfer_config`` / ``kv_events_config`` / ``block_size``). InvalidRequest naming an
    argument vLLM does not have."""
    from dataclasses import fields

    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in fields(AsyncEngineArgs)}
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in options.args}
    unknown = sorted(set(given) - known)
    if unknown:
        raise InvalidRequest(
            f"[roles.vllm] args: vLLM {_version()} has no engine argument {', '.join(unknown)}"
        )
    model = str(options.model or model_dir)
    check_weight_files(Path(model))
    return AsyncEngineArgs(
        model=model,
        dtype=options.dtype,
        max_model_len=options.max_model_len,
        disable_log_stats=False,  # the load logger needs the scheduler stats
        **given,
        **dict(wiring),
    )


def check_weight_files(model: Path) -> None:
    """InvalidRequest when a local model directory holds safetensors files beside the model's
    own and no ``model.safetensors.index.json`` to name the model's: vLLM loads every
    ``*.safetensors`` it finds, so dsi's draft (``draft.safetensors``) or vision encoder
    (``vision.safetensors``) kept there would be read as model weights and fail vLLM's start."""
    if not model.is_dir() or (model / "model.safetensors.index.json").exists():
        return
    files = sorted(p.name for p in model.glob("*.safetensors"))
    extra = [name for name in files if name != "model.safetensors"]
    if "model.safetensors" in files and extra:
        raise InvalidRequest(
            f"{model}: vLLM would load {', '.join(extra)} as model weights beside "
            "model.safetensors; give vLLM a directory without them (links to the model's files "
            "do) or a model.safetensors.index.json naming the model's files"
        )


def _version() -> str:
    from vllm import __version__

    return __version__


class _LoadLogger:
    """A vLLM stat logger that keeps the latest scheduler stats as a VllmLoad (vLLM calls it on
    its output thread; a reader takes one immutable value)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.load = VllmLoad()
        self._sources = [0, 0, 0]  # computed, local cache hit, external transfer

    def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
        prompts = getattr(iteration_stats, "prompt_token_stats", None)
        if prompts is not None:
            self._sources[0] += prompts.computed
            self._sources[1] += prompts.local_cache_hit
            self._sources[2] += prompts.external_kv_transfer
        last = self.load
        self.load = VllmLoad(
            running=scheduler_stats.num_running_reqs if scheduler_stats is not None else last.running,
            waiting=scheduler_stats.num_waiting_reqs if scheduler_stats is not None else last.waiting,
            kv_usage=float(scheduler_stats.kv_cache_usage) if scheduler_stats is not None else last.kv_usage,
            computed_tokens=self._sources[0],
            local_hit_tokens=self._sources[1],
            external_tokens=self._sources[2],
        )

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, *args: Any) -> None:
        pass


class VllmService:
    """One AsyncLLM; see the module docstring."""

    def __init__(self, engine: Any, shape: VllmShape, stats: _LoadLogger, thread: ThreadPoolExecutor) -> None:
        self._engine = engine
        self.shape = shape
        self._stats = stats
        self._thread = thread

    @classmethod
    async def start(cls, options: VllmOptions, model_dir: Path, wiring: Mapping[str, Any]) -> VllmService:
        """Build the engine (seconds to minutes); VllmFailed when vLLM cannot start. The process
        environment must already hold ``engine_environment(options)``."""
        thread = ThreadPoolExecutor(1, thread_name_prefix="dsi-vllm-owner")
        holder: list[_LoadLogger] = []

        def build() -> Any:
            from vllm.v1.engine.async_llm import AsyncLLM
            from vllm.v1.metrics.loggers import StatLoggerBase

            class LoadLogger(_LoadLogger, StatLoggerBase):
                def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                    _LoadLogger.__init__(self, vllm_config, engine_index)
                    holder.append(self)

            args = engine_args(options, model_dir, wiring)
            return AsyncLLM.from_engine_args(args, stat_loggers=[LoadLogger])

        loop = asyncio.get_running_loop()
        try:
            engine = await asyncio.wait_for(loop.run_in_executor(thread, build), options.start_timeout_s)
        except InvalidRequest:
            thread.shutdown(wait=False)
            raise
        except Exception as exc:  # vLLM raises anything: a bad argument, a model it cannot load, OOM
            thread.shutdown(wait=False)
            raise VllmFailed(f"vLLM did not start: {type(exc).__name__}: {exc}") from exc
        config = engine.vllm_config
        shape = VllmShape(
            block_size=config.cache_config.block_size,
            num_blocks=int(config.cache_config.num_gpu_blocks or 0),
            vocab_size=config.model_config.get_vocab_size(),
            max_model_len=config.model_config.max_model_len,
            version=_version(),
        )
        log.info("vLLM %s ready: %s, %d KV blocks of %d tokens (thread %s)", shape.version,
                 config.model_config.model, shape.num_blocks, shape.block_size, threading.get_ident())  # fmt: skip
        return cls(engine, shape, holder[0] if holder else _LoadLogger(None), thread)

    @property
    def load(self) -> VllmLoad:
        return self._stats.load

    async def generate(
        self,
        request_id: str,
        token_ids: list[int],
        sampling: SamplingParams,
        kv_transfer_params: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[VllmOutput]:
        """The request's outputs as vLLM produces them. InvalidRequest for what vLLM refuses
        (too long, a bad parameter); VllmFailed when the engine dies meanwhile. Leaving the
        stream early aborts the request in vLLM."""
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        params = vllm_sampling(sampling, kv_transfer_params)
        prompt = TokensPrompt(prompt_token_ids=list(token_ids))
        if sampling.cache_salt:  # tenants never share vLLM's local prefix cache either
            prompt["cache_salt"] = sampling.cache_salt
        try:
            stream = self._engine.generate(prompt, params, request_id)
            async for out in stream:
                yield _output(out, sampling)
        except ValueError as exc:  # vLLM's input checks (length, ids, parameters)
            raise InvalidRequest(f"vLLM refused the request: {exc}") from None
        except (EngineDeadError, EngineGenerateError) as exc:
            raise VllmFailed(f"vLLM failed: {type(exc).__name__}: {exc}") from None

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, engine.shutdown)
        self._thread.shutdown(wait=False)

    @property
    def dead(self) -> bool:
        return self._engine is None or bool(getattr(self._engine, "errored", False))


def _output(out: Any, sampling: SamplingParams) -> VllmOutput:
    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    logprobs, tops = split_logprobs(tokens, completion.logprobs, sampling)
    return VllmOutput(
        tokens,
        logprobs,
        tops,
        finished=bool(out.finished),
        finish_reason=(completion.finish_reason or "stop") if out.finished else "",
        cached_tokens=int(out.num_cached_tokens or 0),
        kv_transfer_params=out.kv_transfer_params,
    )
