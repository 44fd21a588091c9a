"""vLLM's side of ``dsi bench peers``, run by the peer venv's Python (it imports vLLM, never dsi).

    python peers_vllm_child.py --model DIR --prompts FILE --max-tokens N [--eager] [--dtype float32]

FILE is a JSON list of prompts as token id lists. The model loads once (``vllm.LLM`` on the CPU,
offline) and runs one warm-up ``generate`` of every prompt for 4 tokens; then each ``run`` of the
protocol of :mod:`dsi.bench.peer_child` is one timed run of every prompt for max-tokens greedy
tokens, EOS ignored. The protocol's two helpers are written out here: this file runs with the
peer venv's Python, which has no dsi.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _answer(channel, data: dict) -> None:
    channel.write(json.dumps(data) + "\n")
    channel.flush()


def _serve(args: argparse.Namespace, channel) -> None:
    from vllm import LLM, SamplingParams, __version__

    prompts = [{"prompt_token_ids": ids} for ids in json.loads(Path(args.prompts).read_text())]
    start = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=len(prompts),
        seed=0,
        enforce_eager=args.eager,
        enable_prefix_caching=False,  # every timed run prefills its prompts, as dsi's engine does
    )
    load_s = time.perf_counter() - start
    warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False)
    llm.generate(prompts, warm, use_tqdm=False)
    _answer(channel, {"ready": True, "load_s": load_s, "version": __version__})
    # token ids out, as dsi's engine returns them: neither side detokenizes in the timed runs
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        done = llm.generate(prompts, greedy, use_tqdm=False)
        elapsed = time.perf_counter() - start
        outputs = [list(d.outputs[0].token_ids) for d in done]
        _answer(channel, {"tok_s": sum(len(o) for o in outputs) / elapsed, "outputs": outputs})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--eager", action="store_true", help="no torch.compile (enforce_eager)")
    args = parser.parse_args()
    channel = os.fdopen(os.dup(1), "w")  # the answers; fd 1 itself goes to stderr from here on
    # (dsi.bench.peer_child.answer_channel)
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        _serve(args, channel)
    except Exception as exc:  # reported as data: the bench prints the reason beside the other figures
        _answer(channel, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
