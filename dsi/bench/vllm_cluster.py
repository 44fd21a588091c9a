"""``dsi bench vllm-cluster``: vLLM instances behind dsi beside the same instances plain, in one run.

    cluster   dsi serve: two colocated vLLM decodes (@0, @1) + kvstore, balancer, gateway
              vs two `vllm serve` (@0, @1) behind vllm-router in its default policy;
              a slice of Mooncake's conversation trace (dsi.bench.vllm_cluster_trace),
              closed loop at --concurrency, trace order; each instance's KV cache the
              config's, or --kv-cache-mib on both sides (a local cache smaller than the
              slice's prompts together: the regime a shared store is for)
    single    dsi serve: one colocated vLLM decode (@0)  vs  one `vllm serve` (@0) alone;
              a fixed batch of distinct prompts, all at once (decode-bound, no prefix reuse:
              the ratio is the cost of dsi's layer, not of a cache)

Both sides of a comparison run on equal terms (:mod:`dsi.bench.vllm_cluster_peer`: one role's
``[roles.vllm]`` options, environment and cores per instance, prefix caching on), one side at a
time, every request a streamed greedy Chat Completion with ``ignore_eos``. Each side gets one
short warm-up request per instance, then the replay; figures and goals are those of
:mod:`dsi.bench.vllm_cluster_summary`. When dsi serve refuses two decodes without a prefill, the
cluster comparison runs the source config's own layout (a vLLM prefill @0 and decode @1) and
the result says why. Every process started here is stopped by PID in a finally block.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsi import paths
from dsi.bench.vllm_cluster_config import DECODES, PD, SINGLE, Layout, source_config
from dsi.bench.vllm_cluster_load import Measured, bodies, measure, side_dict
from dsi.bench.vllm_cluster_summary import CLUSTER_GOALS, SINGLE_GOALS, compare, ratio
from dsi.bench.vllm_cluster_trace import BenchRequest, Scaling


@dataclass(slots=True, frozen=True)
class BenchConfig:
    scaling: Scaling = field(default_factory=Scaling)
    concurrency: int = 4
    workdir: Path = Path("run/bench-vllm-cluster")
    trace: Path | None = None  # None: dsi.paths.trace(), the conversation trace
    router: bool = True  # the peer side of the cluster comparison
    # each cluster instance's KV cache on both sides, in MiB (None: the source config's kv_cache_gib)
    kv_cache_mib: int | None = None
    cluster: bool = True
    single: bool = True
    single_streams: int = 16
    single_prompt_words: int = 256
    single_max_tokens: int = 64
    single_repeats: int = 2
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in (
            "concurrency",
            "single_streams",
            "single_prompt_words",
            "single_max_tokens",
            "single_repeats",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.kv_cache_mib is not None and self.kv_cache_mib < 64:
            raise ValueError(f"kv_cache_mib must be at least 64, got {self.kv_cache_mib}")

    @property
    def kv_cache_bytes(self) -> int | None:
        return self.kv_cache_mib << 20 if self.kv_cache_mib is not None else None


def _dsi_how(side, layout: Layout) -> dict:
    from dsi.vllm.cores import resolve_cores

    allowed = os.sched_getaffinity(0)
    return {
        "system": "dsi serve",
        "routing": "dsi's gateway and balancer (the source config's, default options)",
        "config": str(side.config),
        "instances": [
            {"role": role_id, "kind": kind, "cpu_threads": spec, "cores": resolve_cores(spec, allowed)}
            for kind, role_id, spec in layout
        ],
    }


def _cluster(config: BenchConfig, model_dir: Path, requests: list[BenchRequest], model: str) -> dict:
    from dsi.bench.vllm_cluster_dsi import DsiSide

    batch = bodies(requests, model)
    out: dict = {"layout": "two colocated vLLM decodes", "decodes_only_refused": None}
    out["kv_cache_per_instance"] = (
        f"{config.kv_cache_mib} MiB (--kv-cache-mib, both sides)" if config.kv_cache_mib else "the config's"
    )
    layout = DECODES
    side = DsiSide(layout, model_dir, config.workdir / "cluster-dsi", config.kv_cache_bytes)
    dsi = measure(side, [batch], config.concurrency, model, config.ready_timeout_s)
    if not dsi.started:
        out["decodes_only_refused"] = dsi.error
        out["layout"] = "fallback: a vLLM prefill and a vLLM decode (PD)"
        layout = PD
        side = DsiSide(layout, model_dir, config.workdir / "cluster-dsi-pd", config.kv_cache_bytes)
        dsi = measure(side, [batch], config.concurrency, model, config.ready_timeout_s)
    out["dsi"] = side_dict(_dsi_how(side, layout), dsi)
    peer, how = _routed_peer(config, model_dir, list(side.roles.values()), batch, model)
    out["peer"] = side_dict(how, peer)
    out["comparison"] = compare(dsi.figures, peer.figures, CLUSTER_GOALS)
    out["computed_floor"] = _floor(config, requests, dsi.figures or peer.figures, peer.figures)
    return out


def _floor(config: BenchConfig, requests: list[BenchRequest], seen, peer) -> dict | None:
    """The fewest prompt tokens per request any prefix cache computes on this slice, and its
    ratio to the peer's: the best ``computed_tokens_per_request`` ratio dsi can reach here."""
    from dsi.bench.vllm_cluster_trace import computed_floor
    from dsi.vllm.wiring import BLOCK_SIZE

    if seen is None or seen.prompt_tokens_per_request is None or not requests:
        return None
    words = sum(len(r.hash_ids) for r in requests) * config.scaling.tokens_per_id / len(requests)
    template = round(seen.prompt_tokens_per_request - words)  # the chat template's tokens
    floor = computed_floor(requests, config.scaling, template, BLOCK_SIZE)
    return {
        "tokens_per_request": floor,
        "floor_over_peer": ratio(floor, peer.computed_tokens_per_request if peer else None),
        "template_tokens": template,
        "what": f"every full {BLOCK_SIZE}-token block of every earlier request of the slice a hit",
    }


def _routed_peer(config: BenchConfig, model_dir: Path, options, batch: list[dict], model: str):
    from dsi.bench.route_peers import PEERS, install_peers
    from dsi.bench.vllm_cluster_peer import PeerInstances, RoutedPeers, router_policy

    how: dict = {"system": f"{len(options)} x vllm serve behind {PEERS['vllm_router']}"}
    if not config.router:
        return Measured(error="not run (--skip-router)"), how
    log_dir = config.workdir / "cluster-peer"
    log_dir.mkdir(parents=True, exist_ok=True)
    bin_dir, why = install_peers(config.workdir / "peers", ("vllm_router",))
    if bin_dir is None:
        return Measured(error=why), how
    how["policy"] = f"{router_policy(bin_dir)} (vllm-router's default: no --policy given)"
    instances = PeerInstances(_vllm_python(options[0]), model_dir, model, options, log_dir)
    how |= _peer_how(instances, options)
    measured = measure(
        RoutedPeers(instances, bin_dir, log_dir), [batch], config.concurrency, model, config.ready_timeout_s
    )
    return measured, how


def _peer_how(instances, options) -> dict:
    return {
        "instances": [
            {"url": url, "cpu_threads": o.cpu_threads, "cores": bind}
            for url, o, bind in zip(instances.urls, options, instances.bindings, strict=True)
        ],
        "argv": instances.servers[0].argv[1:],
    }


def _single(config: BenchConfig, model_dir: Path, words: tuple[str, ...], model: str) -> dict:
    from dsi.bench.vllm_cluster_dsi import DsiSide
    from dsi.bench.vllm_cluster_peer import PeerInstances
    from dsi.bench.vllm_cluster_trace import fixed_batch

    batches = [
        bodies(
            fixed_batch(
                config.single_streams, config.single_prompt_words, config.single_max_tokens, words, r
            ),
            model,
        )
        for r in range(config.single_repeats)
    ]
    concurrency = config.single_streams
    side = DsiSide(SINGLE, model_dir, config.workdir / "single-dsi")
    dsi = measure(side, batches, concurrency, model, config.ready_timeout_s)
    options = list(side.roles.values())
    log_dir = config.workdir / "single-peer"
    log_dir.mkdir(parents=True, exist_ok=True)
    instances = PeerInstances(_vllm_python(options[0]), model_dir, model, options, log_dir)
    peer = measure(instances, batches, concurrency, model, config.ready_timeout_s)
    return {
        "workload": {
            "streams": config.single_streams,
            "prompt_words": config.single_prompt_words,
            "max_tokens": config.single_max_tokens,
            "repeats": config.single_repeats,
            "how": "each repeat a new batch of distinct prompts, all streams at once; figures over all repeats",
        },
        "dsi": side_dict(_dsi_how(side, SINGLE), dsi),
        "peer": side_dict({"system": "vllm serve alone", **_peer_how(instances, options)}, peer),
        "comparison": compare(dsi.figures, peer.figures, SINGLE_GOALS),
    }


def _vllm_python(options) -> Path:
    from dsi.provision.python import vllm_python

    return vllm_python(options)


def _engine(model_dir: Path) -> dict:
    """The engine terms both sides share (from the source config's decode role)."""
    from dsi.bench.vllm_cluster_config import vllm_roles
    from dsi.config import load_config
    from dsi.vllm.wiring import BLOCK_SIZE

    options = next(o for r, o in vllm_roles(load_config(source_config())).items() if r.startswith("decode"))
    python = _vllm_python(options)
    probe = "import importlib.metadata as m; print(*m.packages_distributions()['vllm'], m.version(m.packages_distributions()['vllm'][0]))"
    version = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    return {
        "vllm": version.stdout.strip() or "unknown",
        "python": str(python),
        "model_dir": str(model_dir),
        "dtype": options.dtype,
        "max_model_len": options.max_model_len,
        "block_size": BLOCK_SIZE,
        "kv_cache_gib": options.kv_cache_gib,
        "args": dict(options.args),
        "prefix_caching": "on in every instance (vLLM's default; dsi's roles leave it on)",
        "core_binding": "VLLM_CPU_OMP_THREADS_BIND as dsi's role sets it, one core per instance",
        "requests": "streamed Chat Completions, temperature 0, ignore_eos, the same bodies to both sides",
    }


def run(config: BenchConfig) -> dict:
    """Every comparison, one side at a time; the result object (see the module docstring)."""
    from dsi.bench.vllm_cluster_trace import describe, read_trace, vocabulary_words, workload
    from dsi.config import load_config
    from dsi.model.prepare import ensure_model

    start = time.monotonic()
    trace = config.trace or paths.trace()
    source = load_config(source_config()).model
    model_dir = ensure_model(source.dir, source.config, source.gguf).resolve()
    config.workdir.mkdir(parents=True, exist_ok=True)
    words = vocabulary_words(model_dir / "tokenizer.json")
    rows = read_trace(trace)
    requests = workload(rows, config.scaling, words)
    workload_info = describe(requests, rows, config.scaling, trace)
    workload_info |= {"concurrency": config.concurrency, "replay": "closed loop, trace order"}
    result: dict = {
        "bench": "vllm-cluster",
        "model": f"{source.name} ({source.gguf} imported to fp32)",
        "engine": _engine(model_dir),
        "workload": workload_info,
    }
    if config.cluster:
        result["cluster"] = _cluster(config, model_dir, requests, source.name)
    if config.single:
        result["single"] = _single(config, model_dir, words, source.name)
    result["wall_s"] = round(time.monotonic() - start, 1)
    return result


def _main(args: argparse.Namespace) -> int:
    try:
        scaling = Scaling(
            requests=args.requests,
            tokens_per_id=args.tokens_per_id,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
        )
        config = BenchConfig(
            scaling=scaling,
            concurrency=args.concurrency,
            workdir=Path(args.dir).resolve(),
            trace=args.trace,
            router=not args.skip_router,
            kv_cache_mib=args.kv_cache_mib,
            cluster=not args.skip_cluster,
            single=not args.skip_single,
            single_streams=args.single_streams,
            single_max_tokens=args.single_max_tokens,
        )
    except ValueError as exc:
        print(f"dsi bench vllm-cluster: {exc}")
        return 2
    result = run(config)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def print_table(result: dict) -> None:
    w = result["workload"]
    print(f"dsi bench vllm-cluster: {w['requests']} trace requests at concurrency {w['concurrency']}, "
          f"{result['wall_s']} s")  # fmt: skip
    for part in ("cluster", "single"):
        if part not in result:
            continue
        print(f"  {part}:")
        for figure, row in result[part]["comparison"].items():
            met = {True: "met", False: "NOT met", None: "-"}[row["met"]]
            print(f"    {figure:<30} dsi {row['dsi']!s:>9}  peer {row['peer']!s:>9}  "
                  f"ratio {row['dsi_over_peer']!s:>6}  goal {row['goal']:<7} {met}")  # fmt: skip
        for side in ("dsi", "peer"):
            if result[part][side]["error"]:
                print(f"    {side}: {result[part][side]['error']}")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "vllm-cluster",
        help="vLLM instances behind dsi vs the same behind vllm-router, and one vs vllm serve alone",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--requests", type=int, default=32, help="trace requests replayed (cluster)")
    parser.add_argument("--concurrency", type=int, default=4, help="streams at once (cluster replay)")
    parser.add_argument("--dir", default="run/bench-vllm-cluster", help="configs, logs, the router's venv")
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help=f"Mooncake-format JSONL trace (default {paths.TRACE_DEFAULT})",
    )
    parser.add_argument("--tokens-per-id", type=int, default=64, help="words per 512-token trace id")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048, help="prompt cap, in words")
    parser.add_argument("--max-output-tokens", type=int, default=24, help="output cap per request")
    parser.add_argument(
        "--kv-cache-mib",
        type=int,
        default=None,
        help="KV cache of each cluster instance, both sides (default: the config's kv_cache_gib)",
    )
    parser.add_argument("--skip-router", action="store_true", help="no vllm-router side (cluster)")
    parser.add_argument("--skip-single", action="store_true", help="no one-instance comparison")
    parser.add_argument("--skip-cluster", action="store_true", help="no two-instance comparison")
    parser.add_argument("--single-streams", type=int, default=16, help="prompts per batch (one instance)")
    parser.add_argument(
        "--single-max-tokens", type=int, default=64, help="output tokens per prompt (one instance)"
    )
    parser.set_defaults(func=_main)
