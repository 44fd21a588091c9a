"""The ``dsi serve`` configs of ``dsi bench vllm-cluster``, derived from ``configs/vllm.toml``.

The source config's controller, entrypoint, kvstore and balancer stay as they are; its vLLM
prefill and decode roles are replaced by the instances of a :class:`Layout`, each a copy of the
source's role of that kind (its ``[roles.vllm]`` table: dtype, context, KV cache, engine args)
with its own id, address and ``cpu_threads``:

    DECODES   decode-0 @0, decode-1 @1     two colocated vLLM decodes (prompt and continuation)
    PD        prefill-0 @0, decode-0 @1    the source's own layout (used when DECODES is refused)
    SINGLE    decode-0 @0                  one colocated vLLM decode

:func:`write_config` puts the result, with the model directory absolute, through
:func:`dsi.bench.soak_cluster.private_config` (free 127.0.0.1 ports, the kvstore's directory
under the bench's own directory).
"""

from __future__ import annotations

import re
from pathlib import Path

from dsi import paths
from dsi.bench.peers_served import with_model_dir
from dsi.config import EngineOptions, NodeConfig
from dsi.config.vllm import VllmOptions


def source_config() -> Path:
    """dsi's ``configs/vllm.toml`` as :func:`dsi.paths.config` hands it out."""
    return paths.config("vllm.toml")


# (kind, role id, cpu_threads) of each vLLM instance
Layout = tuple[tuple[str, str, str], ...]
DECODES: Layout = (("decode", "decode-0", "@0"), ("decode", "decode-1", "@1"))
PD: Layout = (("prefill", "prefill-0", "@0"), ("decode", "decode-0", "@1"))
SINGLE: Layout = (("decode", "decode-0", "@0"),)
_ENGINE_KINDS = ("prefill", "decode")


def _kind(block: str) -> str | None:
    found = re.search(r'(?m)^kind = "(\w+)"', block)
    return found.group(1) if found else None


def with_layout(text: str, layout: Layout, kv_cache_bytes: int | None = None) -> str:
    """``text`` (a config with one prefill and one decode role at least) with its engine roles
    replaced by ``layout``'s, written where the first engine role was; each with
    ``args.kv_cache_memory_bytes = kv_cache_bytes`` where that is given (in place of the source's
    ``kv_cache_gib``)."""
    head, *blocks = text.split("[[roles]]")
    templates = {}
    for block in blocks:
        templates.setdefault(_kind(block), block)
    missing = sorted({kind for kind, _, _ in layout} - set(templates))
    if missing:
        raise ValueError(f"the source config has no {', '.join(missing)} role to copy")
    engines = [
        _instance(templates[kind], role_id, cores, i, kv_cache_bytes)
        for i, (kind, role_id, cores) in enumerate(layout)
    ]
    first = next(i for i, block in enumerate(blocks) if _kind(block) in _ENGINE_KINDS)
    others = [block for block in blocks if _kind(block) not in _ENGINE_KINDS]
    kept = [*others[:first], *engines, *others[first:]]
    return "[[roles]]".join([head, *kept])


def _instance(template: str, role_id: str, cores: str, index: int, kv_cache_bytes: int | None) -> str:
    block = re.sub(r'(?m)^id = "[^"]*"', f'id = "{role_id}"', template, count=1)
    # a distinct address per instance (private_config moves each to a free port)
    block = re.sub(
        r'(?m)^bind = "tcp://127\.0\.0\.1:\d+"', f'bind = "tcp://127.0.0.1:{7190 + index}"', block, count=1
    )
    block, found = re.subn(r'(?m)^cpu_threads = "[^"]*"', f'cpu_threads = "{cores}"', block, count=1)
    if not found:
        block = block.replace("[roles.vllm]\n", f'[roles.vllm]\ncpu_threads = "{cores}"\n', 1)
    if kv_cache_bytes is not None:
        sized = f"kv_cache_memory_bytes = {kv_cache_bytes}"
        block, found = re.subn(r"(?m)^args = \{", f"args = {{ {sized},", block, count=1)
        if not found:
            block = block.replace("[roles.vllm]\n", f"[roles.vllm]\nargs = {{ {sized} }}\n", 1)
    return block if block.endswith("\n\n") else block.rstrip("\n") + "\n\n"


def write_config(
    layout: Layout,
    model_dir: Path,
    side_dir: Path,
    source: Path | None = None,
    kv_cache_bytes: int | None = None,
) -> Path:
    """The private config of ``layout`` in ``side_dir`` (see the module docstring), derived from
    ``source`` (default :func:`source_config`)."""
    from dsi.bench.soak_cluster import private_config

    source = source or source_config()
    derived = side_dir / "derived" / source.name
    derived.parent.mkdir(parents=True, exist_ok=True)
    spelled = ", ".join(f"{role_id} {cores}" for _, role_id, cores in layout)
    text = with_model_dir(with_layout(source.read_text(), layout, kv_cache_bytes), model_dir)
    derived.write_text(f"# dsi bench vllm-cluster: {source.name} with vLLM instances {spelled}\n{text}")
    return private_config(derived, side_dir)


def vllm_roles(cfg: NodeConfig) -> dict[str, VllmOptions]:
    """Each vLLM role's id -> its [roles.vllm] options, in config order."""
    return {
        role.id: role.options.vllm
        for role in cfg.roles
        if isinstance(role.options, EngineOptions) and role.options.engine == "vllm"
    }
