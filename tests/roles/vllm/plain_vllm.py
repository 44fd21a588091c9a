"""Plain vLLM, for the tests' reference outputs: run by the vLLM venv's Python (never dsi's).

    python plain_vllm.py --model DIR --prompts FILE --max-tokens N

FILE is a JSON list of prompts as token id lists; prints one JSON line: each prompt's greedy
output token ids. The engine is vLLM's offline ``LLM`` with the settings the tests' vLLM roles
use (fp32, 128-token blocks, eager), so the two differ only in dsi's layer around them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    args = parser.parse_args()
    from vllm import LLM, SamplingParams

    prompts = [{"prompt_token_ids": ids} for ids in json.loads(Path(args.prompts).read_text())]
    llm = LLM(
        model=args.model, dtype="float32", max_model_len=4096, block_size=128, enforce_eager=True, seed=0
    )
    done = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    print(json.dumps([list(d.outputs[0].token_ids) for d in done]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
