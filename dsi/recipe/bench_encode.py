"""Encode time of one huge user message: our recipe next to deepseek-recipe, in the same run.

``bench_encode()`` times a Chat Completions request whose only user message is 1 MB or 4 MB of
English-like or Chinese text, from request body to prompt token ids, both ways:

    ours     Recipe.prepare (parse, render, encode: chunked, in parallel)
    recipe   deepseek-recipe ChatCompletionRequest.convert + DeepseekV4Encoding.encode

and checks that both give the same ids. Returns medians in seconds and
``encode_4mb_ratio_vs_recipe`` = their 4 MB time / ours (English and Chinese summed).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from dsi.recipe.conversation import ModelVersion
from dsi.recipe.models import ModelTable, ServedModel
from dsi.recipe.recipe import Recipe

MB = 1_000_000
BENCH_MODEL = "bench-v4"
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


def english_text(nbytes: int, seed: int = 0) -> str:
    """``nbytes`` of word-like ASCII text with punctuation and line breaks."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(_LETTERS) for _ in range(rng.randint(1, 11))) for _ in range(30_000)]
    out: list[str] = []
    size = 0
    while size < nbytes:
        word = rng.choice(words)
        tail = rng.choices(["", ",", ".", ".\n", "\n\n"], weights=[88, 5, 4, 2, 1])[0]
        out.append(word + tail)
        size += len(word) + len(tail) + 1
    return " ".join(out)[:nbytes]


def chinese_text(nbytes: int, seed: int = 0) -> str:
    """About ``nbytes`` of UTF-8 Chinese (3 bytes a character) with punctuation."""
    rng = random.Random(seed)
    chars = [chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(nbytes // 3)]
    for i in range(rng.randint(5, 25), len(chars), rng.randint(8, 30)):
        chars[i] = rng.choice("，。；、")
    return "".join(chars)


def bench_encode(repeats: int = 3, sizes_mb: tuple[int, ...] = (1, 4)) -> dict[str, Any]:
    """Medians (seconds) per (size, language) for ours and deepseek-recipe's, and the ratio."""
    recipe = Recipe(models=ModelTable({BENCH_MODEL: ServedModel(BENCH_MODEL, ModelVersion.V4, 1 << 30)}))
    theirs = _deepseek_recipe()
    out: dict[str, Any] = {"repeats": repeats, "chunked": recipe.encoder.chunking}
    for mb in sizes_mb:
        for lang, make in (("en", english_text), ("zh", chinese_text)):
            text = make(mb * MB)
            body = {
                "model": BENCH_MODEL,
                "messages": [{"role": "user", "content": text}],
                "thinking": {"type": "disabled"},
            }
            ours_ids: list[int] = []

            def run_ours(body: dict[str, Any] = body, keep: list[int] = ours_ids) -> None:
                keep[:] = recipe.prepare("chat", body).prompt_token_ids or ()

            out[f"encode_{mb}mb_{lang}_s"] = _median(run_ours, repeats)
            out[f"encode_{mb}mb_{lang}_tokens"] = len(ours_ids)
            if theirs is not None:
                their_ids: list[int] = []
                out[f"encode_{mb}mb_{lang}_recipe_s"] = _median(
                    lambda t=text, k=their_ids: theirs(t, k), repeats
                )
                out[f"encode_{mb}mb_{lang}_same_ids"] = their_ids == ours_ids
    big = max(sizes_mb)
    if theirs is not None:
        ours_s = out[f"encode_{big}mb_en_s"] + out[f"encode_{big}mb_zh_s"]
        their_s = out[f"encode_{big}mb_en_recipe_s"] + out[f"encode_{big}mb_zh_recipe_s"]
        out[f"encode_{big}mb_ratio_vs_recipe"] = their_s / ours_s
    return out


def _median(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _deepseek_recipe() -> Callable[[str, list[int]], None] | None:
    """deepseek-recipe's body -> ids path, or None where the package is not installed."""
    try:
        import deepseek_recipe as dr
    except ImportError:
        return None
    from dsi.tokenizer import tokenizer_path

    encoding = dr.DeepseekV4Encoding().with_tokenizer(dr.Tokenizer.from_file(str(tokenizer_path())))
    options = dr.ConversionOptions().with_model_versions_by_name({BENCH_MODEL: dr.ModelVersion.DeepseekV4Pro})

    def run(text: str, keep: list[int]) -> None:
        body = {
            "model": BENCH_MODEL,
            "messages": [{"role": "user", "content": text}],
            "thinking": {"type": "disabled"},
        }
        converted = dr.ChatCompletionRequest(body).convert(options)
        keep[:] = encoding.encode(converted.conversation)

    return run
