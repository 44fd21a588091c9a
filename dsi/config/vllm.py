"""[roles.vllm]: how a prefill or decode role with ``engine = "vllm"`` builds its vLLM engine.

    [[roles]]
    kind = "decode"
    id = "decode-0"
    bind = "tcp://127.0.0.1:7120"
    engine = "vllm"
    [roles.vllm]
    dtype = "float32"
    max_model_len = 4096
    kv_cache_gib = 1
    args = { enforce_eager = true, max_num_seqs = 32 }

The role embeds vLLM's ``AsyncLLM`` (see dsi.vllm). ``args`` are passed to vLLM's
``AsyncEngineArgs`` as they are (checked against its fields when the role starts); the keys
dsi sets itself (model, dtype, max_model_len, the KV connector, KV events, the block size) are
refused there, so one setting never has two sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dsi.config.errors import Where
from dsi.config.reader import describe
from dsi.config.spec import Seen, at_most, greater, rule, spec
from dsi.vllm.cores import check_spelling

# AsyncEngineArgs fields dsi sets from its own config: ``args`` may not name them.
RESERVED_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "dtype",
        "max_model_len",
        "block_size",
        "kv_transfer_config",
        "kv_events_config",
        "enable_prefix_caching",
        "served_model_name",
    }
)
_SCALARS = (bool, int, float, str)


class EngineArgs(tuple):
    """``[roles.vllm] args`` as sorted (key, value) pairs: immutable and picklable (configs cross
    process boundaries); ``dict(args)`` gives the mapping."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self).get(key, default)


@rule("strings, numbers, booleans or arrays of them; not the arguments dsi sets")
def _engine_args(raw: Any, where: Where) -> EngineArgs:
    """A table of vLLM engine arguments: scalar values or arrays of scalars."""
    if not isinstance(raw, dict):
        raise where.error(f"expected a table of vLLM engine arguments, got {describe(raw)}")
    for key, value in raw.items():
        here = where.at(key)
        if key in RESERVED_ARGS:
            raise here.error("dsi sets this vLLM argument itself (see [model] and [roles.vllm])")
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, _SCALARS) for v in values):
            raise here.error(f"expected a string, number, boolean or an array of them, got {describe(value)}")
    return EngineArgs(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in raw.items()))


@dataclass(slots=True, frozen=True, kw_only=True)
class VllmOptions:
    """The vLLM engine of one role (a prefill or decode role with ``engine = "vllm"``)."""

    model: Path | None = field(
        default=None, metadata=spec(doc="A Hugging Face model directory (default: [model] dir).")
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata=spec(doc="The dtype vLLM computes in.")
    )
    max_model_len: int = field(
        default=4096,
        metadata=spec(doc="The longest sequence, prompt and output, in tokens.", checks=(greater(0),)),
    )
    kv_cache_gib: int = field(
        default=1,
        metadata=spec(
            doc="GiB of KV cache on a CPU build (VLLM_CPU_KVCACHE_SPACE; on a GPU build "
            "args.gpu_memory_utilization decides); args.kv_cache_memory_bytes, where set, takes its place.",
            checks=(greater(0), at_most(4096)),
        ),
    )
    cpu_threads: str = field(
        default="auto",
        metadata=spec(
            doc='The cores its OpenMP threads bind to on a CPU build: CPU ids ("0-3"), positions among '
            'the CPUs the role may run on ("@0-3"), "nobind", or "auto" (vLLM\'s choice); see dsi.vllm.cores.',
            checks=(rule('"auto", "nobind", CPU ids or @positions')(check_spelling),),
        ),
    )
    start_timeout_s: float = field(
        default=600.0,
        metadata=spec(
            doc="Seconds the role waits for vLLM to load the model and profile memory before it gives up.",
            checks=(greater(0.0),),
        ),
    )
    python: Path | None = field(
        default=None,
        metadata=spec(
            doc="The interpreter whose environment has vLLM (default: .venv-vllm beside dsi's source, "
            "made by make venv-vllm, or this interpreter when it has vLLM)."
        ),
    )
    args: EngineArgs = field(
        default_factory=EngineArgs,
        metadata=spec(doc="Further vLLM AsyncEngineArgs, passed as they are.", reader=_engine_args),
    )


@rule('only with engine = "vllm"')
def only_for_vllm(value: VllmOptions, seen: Seen) -> str | None:
    """A [roles.vllm] table on a role whose engine is dsi's own would be read and ignored."""
    if seen.get("engine") != "vllm" and value != VllmOptions():
        return 'only a role with engine = "vllm" reads it'
    return None
