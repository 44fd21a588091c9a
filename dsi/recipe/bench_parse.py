"""Streaming-parser cost per generated token: ours beside deepseek-recipe's StreamProcessor.

Both parse the same V4 output ids (reasoning, an answer in English, Chinese and emoji, a DSML
tool call), one id per engine step, in the same run:

    parse_us_per_token     OutputParser.feed (ids -> events)
    recipe_us_per_token    StreamProcessor.push (ids -> Chat Completions chunk objects)
    parse_ratio_vs_recipe  recipe / ours (> 1: ours is faster)
    stream_us_per_token    OutputStream.feed for Chat Completions (ids -> SSE text)
    recipe_stream_us_per_token  StreamProcessor.push + chunk.to_json()

Also the builders of synthetic model outputs that the benchmark and the tests share:
``output_ids`` encodes text with the tokenizer's plain vocabulary (no added tokens, as a model's
ordinary text tokens are) and passes control ids through; ``byte_ids`` spells text one byte per
id; ``tool_calls_block`` writes DSML tool calls.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer

from dsi.recipe.detok import byte_table
from dsi.recipe.emit_common import OutputOptions
from dsi.recipe.emit_stream import OutputStream
from dsi.recipe.parser import OutputParser
from dsi.tokenizer import EOS_ID, tokenizer_path

THINK_ID, END_THINK_ID, DSML_ID = 128821, 128822, 128825

OutputPart = str | int


@functools.lru_cache(maxsize=1)
def plain_tokenizer() -> Tokenizer:
    """The V4 tokenizer without its added vocabulary: text never becomes a control id."""
    spec = json.loads(tokenizer_path().read_text(encoding="utf-8"))
    spec["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(spec))


def output_ids(parts: Sequence[OutputPart]) -> list[int]:
    """Model output ids: each str is plain text, each int a token id as is."""
    tok = plain_tokenizer()
    out: list[int] = []
    for part in parts:
        if isinstance(part, int):
            out.append(part)
        elif part:
            out += tok.encode(part, add_special_tokens=False).ids
    return out


@functools.lru_cache(maxsize=1)
def _single_byte_ids() -> dict[int, int]:
    table = byte_table()
    return {table[i][0]: i for i in range(len(table)) if len(table[i]) == 1}


def byte_ids(text: str) -> list[int]:
    """``text`` spelled one byte per id, so that multi-byte characters split across ids."""
    ids = _single_byte_ids()
    return [ids[b] for b in text.encode("utf-8")]


def tool_calls_block(calls: Sequence[tuple[str, Mapping[str, Any]]], version: str = "V4") -> list[OutputPart]:
    """The DSML block a model writes for ``calls`` (name, arguments): str arguments as
    ``string="true"``, anything else as JSON with ``string="false"``."""
    sp = " " if version == "V4.1" else ""
    block = "calls" if version == "V4.1" else "tool_calls"
    parts: list[OutputPart] = ["<", DSML_ID, f"{sp}{block}>\n"]
    for name, args in calls:
        parts += ["<", DSML_ID, f'{sp}invoke name="{name}">\n']
        for key, value in args.items():
            is_str = isinstance(value, str)
            text = value if is_str else json.dumps(value, ensure_ascii=False)
            parts += ["<", DSML_ID, f'{sp}parameter name="{key}" string="{"true" if is_str else "false"}">']
            parts += [text, "</", DSML_ID, f"{sp}parameter>\n"]
        parts += ["</", DSML_ID, f"{sp}invoke>\n"]
    parts += ["</", DSML_ID, f"{sp}{block}>"]
    return parts


def sample_output(min_tokens: int = 4096) -> list[int]:
    """A long thinking-mode answer that ends in a tool call and EOS."""
    thought = (
        "The user wants the weather in Paris and Tokyo. I should call the tool for each city, "
        "then compare temperatures 气温 and 湿度 before answering. 🌦️ Let me check the units.\n"
    )
    answer = "I'll look that up for you: 巴黎和东京的天气 ☀️🌧️. One moment.\n\n"
    call = [("get_weather", {"city": "Paris", "days": 3, "units": {"temp": "C", "wind": ["km/h", 1.5]}})]
    tail = output_ids([END_THINK_ID, answer, *tool_calls_block(call), EOS_ID])
    body = output_ids([thought])
    reps = max(1, (min_tokens - len(tail)) // len(body) + 1)
    return body * reps + tail


def _best_us_per_token(runs: dict[str, Callable[[], None]], tokens: int, repeats: int) -> dict[str, float]:
    """Best time of each run, in µs per token; runs interleave so load changes hit all alike."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t / tokens * 1e6 for name, t in best.items()}


def _recipe_runner(ids: list[int], to_json: bool) -> Callable[[], None]:
    import deepseek_recipe as r

    tokenizer = r.Tokenizer.from_file(str(tokenizer_path()))
    body = {
        "model": "DeepSeek-V4-Pro",
        "messages": [{"role": "user", "content": "weather?"}],
        "stream": True,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ],
    }
    # deepseek-recipe renders EOS as text; an engine strips it before handing ids over.
    steps = [r.InferenceChunk.tokens([i]) for i in ids if i != EOS_ID]

    def run() -> None:
        request = r.ChatCompletionRequest(body).convert(r.ConversionOptions())
        gen = r.ChatCompletionRequest.chunk_generator(request, "chatcmpl-bench", "DeepSeek-V4-Pro")
        proc = r.StreamProcessor(gen, request.parsing_options, tokenizer)
        proc.push(r.InferenceChunk.ready(prompt_usage=r.PromptUsage(prompt_tokens=16)))
        for step in steps:
            chunks = proc.push(step)
            if to_json:
                for c in chunks:
                    c.to_json()
        proc.push(r.InferenceChunk.finish(r.InferenceFinishReason.Stop))
        proc.finish()

    return run


def bench_parse(min_tokens: int = 4096, repeats: int = 9) -> dict[str, float]:
    """Per-token parse cost of ours and deepseek-recipe's on one output, best of ``repeats``."""
    ids = sample_output(min_tokens)
    OutputParser(starts_in_reasoning=True)  # build the byte table outside the timing

    def ours() -> None:
        parser = OutputParser(starts_in_reasoning=True, parse_tools=True)
        for i in ids:
            parser.feed((i,))
        parser.finish("stop")

    def ours_stream() -> None:
        options = OutputOptions(
            protocol="chat", model="DeepSeek-V4-Pro", request_id="chatcmpl-bench", created=0,
            tool_names=("get_weather",), prompt_tokens=16,
        )  # fmt: skip
        stream = OutputStream(options)
        for i in ids:
            stream.feed((i,))
        stream.finish("stop")

    n = len(ids)
    us = _best_us_per_token(
        {
            "parse": ours,
            "recipe": _recipe_runner(ids, to_json=False),
            "stream": ours_stream,
            "recipe_stream": _recipe_runner(ids, to_json=True),
        },
        n,
        repeats,
    )
    parse, recipe, stream, recipe_stream = us["parse"], us["recipe"], us["stream"], us["recipe_stream"]
    return {
        "tokens": n,
        "parse_us_per_token": round(parse, 3),
        "recipe_us_per_token": round(recipe, 3),
        "parse_ratio_vs_recipe": round(recipe / parse, 3),
        "stream_us_per_token": round(stream, 3),
        "recipe_stream_us_per_token": round(recipe_stream, 3),
        "stream_ratio_vs_recipe": round(recipe_stream / stream, 3),
    }


if __name__ == "__main__":
    print(json.dumps(bench_parse(), indent=2))
