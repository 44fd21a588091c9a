"""vLLM's side of ``dsi bench peers``, run by the peer venv's Python (it imports vLLM, never dsi).

    python peers_vllm_child.py --model DIR --prompts FILE --max-tokens N --repeats R --dtype float32

FILE is a JSON list of prompts as token id lists. The model loads once (``vllm.LLM`` on the CPU,
offline); one warm-up ``generate`` of every prompt for 4 tokens, then ``repeats`` timed runs of
every prompt for ``max-tokens`` greedy tokens with EOS ignored. The last line of stdout is one
JSON object: ``tok_s`` (generated tokens / wall seconds of each run), ``load_s``, ``version``
and ``outputs`` (each prompt's tokens of the last run); or ``error`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _measure(args: argparse.Namespace) -> dict:
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
    warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate(prompts, warm, use_tqdm=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    tok_s, outputs = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        done = llm.generate(prompts, greedy, use_tqdm=False)
        elapsed = time.perf_counter() - start
        outputs = [list(d.outputs[0].token_ids) for d in done]
        tok_s.append(sum(len(o) for o in outputs) / elapsed)
    return {"tok_s": tok_s, "load_s": load_s, "version": __version__, "outputs": outputs}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--eager", action="store_true", help="no torch.compile (enforce_eager)")
    args = parser.parse_args()
    try:
        result = _measure(args)
    except Exception as exc:  # reported as data: the bench prints the reason beside the other figures
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
