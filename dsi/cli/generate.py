"""``dsi generate``: one prompt through the offline engine; prints the text and token ids."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dsi.engine.params import SamplingParams
from dsi.errors import DsiError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="generate a completion offline")
    parser.add_argument("--model", required=True, type=Path, help="model directory")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--chat",
        action="store_true",
        help="render PROMPT as one user turn in the model's chat template (non-DeepSeek families)",
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from dsi.llm import LLM

    if not (args.model / "config.json").exists():
        print(
            f"dsi generate: {args.model} is not a model directory (run `dsi model init --out DIR`)",
            file=sys.stderr,
        )
        return 2
    llm = LLM(args.model)
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        out = llm.generate([llm.chat_ids(args.prompt) if args.chat else args.prompt], params)[0]
    except (DsiError, ValueError) as exc:
        print(f"dsi generate: {exc}", file=sys.stderr)
        return 2
    finally:
        llm.close()
    if args.json:
        print(
            json.dumps(
                {
                    "text": out.text,
                    "token_ids": out.token_ids,
                    "prompt_ids": out.prompt_ids,
                    "finish_reason": out.finish_reason,
                }
            )
        )
    else:
        print(out.text)
        print(f"token_ids: {out.token_ids}")
    return 0
