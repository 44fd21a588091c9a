"""Mask latency of llguidance and xgrammar on the 129,280-token V4 vocabulary.

For each library and each grammar (a JSON schema, free JSON, a regex) it walks a fixed valid
output token by token (the V4 tokenizer's ids of a known answer): compute the next-token mask
(timed), check that the next id is allowed, accept it (timed). llguidance also walks a DSML tool
call through dsi's own tool-call grammar (xgrammar is not measured there: its DeepSeek format
matches ``｜DSML｜`` as text, not as the control token). Figures, per grammar:

    compile_ms        grammar compile (llguidance: matcher construction, which compiles)
    cold              the first walk: first_mask_us, mask_us_median / p99 / max (lazy caches fill)
    warm              later walks, each from a fresh per-request matcher (instance_us):
                      mask_us_median / p99 / max over every step, accept_us_median

``apply_mask_us`` is the library-independent cost of turning one packed bitmask into ``-inf``
on a row of 129,280 fp32 logits (what the sampler does). A library that is not installed is
reported with its import error. Run: ``python -m dsi.structured.bench_mask [--repeats N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from importlib import metadata

import torch

from dsi.structured.grammar import grammar_text
from dsi.structured.mask import apply_bitmask, bitmask_words
from dsi.structured.spec import StructuredSpec
from dsi.structured.vocab import VOCAB_SIZE, guidance_tokenizer
from dsi.tokenizer import EOS_ID, load_tokenizer, tokenizer_path

SEPARATORS = (", ", ": ")

SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string"},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "email", "vip"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                },
                "required": ["sku", "qty", "price"],
                "additionalProperties": False,
            },
        },
        "notes": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["order_id", "status", "customer", "items", "notes", "tags"],
    "additionalProperties": False,
}

INSTANCE = {
    "order_id": "ORD-204981",
    "status": "shipped",
    "customer": {"name": "Zhang Wei (张伟)", "email": "zhang.wei@example.com", "vip": True},
    "items": [
        {"sku": "KB-MX-BROWN", "qty": 2, "price": 89.5},
        {"sku": "MS-ERGO-7", "qty": 1, "price": 45.0},
        {"sku": "CBL-USB-C-2M", "qty": 3, "price": 9.99},
    ],
    "notes": "Leave at the front desk; call on arrival. 请勿折叠",
    "tags": ["express", "gift", "fragile", "priority"],
}

REGEX = r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z (INFO|WARN|ERROR) [a-z_]{3,16}=[0-9]{1,6}( [a-z]+)*\n){4,8}"
REGEX_TEXT = "".join(
    f"2026-0{m}-1{m}T0{m}:3{m}:5{m}Z {level} {key}={value} {words}\n"
    for m, level, key, value, words in [
        (1, "INFO", "requests_total", 48213, "served from cache"),
        (2, "WARN", "queue_depth", 977, "above soft limit"),
        (3, "ERROR", "decode_failures", 3, "on instance seven"),
        (4, "INFO", "kv_hits", 120443, "prefix reuse"),
        (5, "INFO", "tokens_out", 905112, "steady"),
        (6, "WARN", "ttft_ms", 2210, "slow first token"),
    ]
)


TOOL = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["metric", "imperial"]},
            "include": {"type": "array", "items": {"enum": ["wind", "rain", "uv", "pollen"]}},
        },
        "required": ["city", "days", "units", "include"],
        "additionalProperties": False,
    },
}
TOOL_TEXT = (
    "\n\n<｜DSML｜tool_calls>\n"
    + "".join(
        f'<｜DSML｜invoke name="get_weather">\n'
        f'<｜DSML｜parameter name="city" string="true">{city}</｜DSML｜parameter>\n'
        f'<｜DSML｜parameter name="days" string="false">{days}</｜DSML｜parameter>\n'
        f'<｜DSML｜parameter name="units" string="true">metric</｜DSML｜parameter>\n'
        f'<｜DSML｜parameter name="include" string="false">["wind", "rain", "uv"]</｜DSML｜parameter>\n'
        f"</｜DSML｜invoke>\n"
        for city, days in [("Paris", 3), ("São Paulo <centro>", 7), ("北京", 14)]
    )
    + "</｜DSML｜tool_calls>"
)


def _ids(text: str) -> list[int]:
    """Ids of ``text``; ``｜DSML｜`` becomes the control token (the full tokenizer's added vocabulary)."""
    return load_tokenizer().encode(text, add_special_tokens=False).ids


def _stats(times_us: list[float]) -> dict[str, float]:
    ordered = sorted(times_us)
    return {
        "mask_us_median": round(statistics.median(ordered), 1),
        "mask_us_p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "mask_us_max": round(ordered[-1], 1),
    }


def _allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[token // 32]) >> (token % 32)) & 1)


def _walk(
    new_matcher: Callable[[], object],
    fill: Callable[[object, torch.Tensor], None],
    accept: Callable[[object, int], bool],
    ids: list[int],
    repeats: int,
) -> dict[str, object]:
    """Mask and accept over ``ids`` then EOS, ``repeats`` times with a fresh matcher each time.
    The first walk is reported apart (``cold``: lazily built lexer states and caches)."""
    bitmask = torch.zeros(bitmask_words(VOCAB_SIZE), dtype=torch.int32)
    walks = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        matcher = new_matcher()
        instance = time.perf_counter() - t0
        masks, accepts = [], []
        for i, token in enumerate([*ids, EOS_ID]):
            t0 = time.perf_counter()
            fill(matcher, bitmask)
            masks.append((time.perf_counter() - t0) * 1e6)
            if not _allowed(bitmask, token):
                raise RuntimeError(f"step {i}: token {token} is masked out; the benchmark text is invalid")
            if token == EOS_ID:
                break
            t0 = time.perf_counter()
            if not accept(matcher, token):
                raise RuntimeError(f"step {i}: token {token} was rejected")
            accepts.append((time.perf_counter() - t0) * 1e6)
        walks.append((instance, masks, accepts))
    warm = walks[1:] or walks
    return {
        "tokens": len(ids) + 1,
        "cold": {"first_mask_us": round(walks[0][1][0], 1), **_stats(walks[0][1])},
        "warm": {
            "instance_us": round(statistics.median(w[0] for w in warm) * 1e6, 1),
            **_stats([m for w in warm for m in w[1]]),
            "accept_us_median": round(statistics.median(a for w in warm for a in w[2]), 2),
        },
    }


def _llguidance(cases: dict[str, tuple[str, list[int]]], repeats: int) -> dict[str, object]:
    import llguidance

    t0 = time.perf_counter()
    tok = guidance_tokenizer()
    out: dict[str, object] = {
        "version": metadata.version("llguidance"),
        "tokenizer_s": round(time.perf_counter() - t0, 3),
    }
    options = {"item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1], "whitespace_flexible": False}
    grammars = {
        "json_schema": llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=options),
        "json_object": llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=options),
        "regex": llguidance.LLMatcher.grammar_from_regex(cases["regex"][0]),
        "tool_call": grammar_text(StructuredSpec.tool_call([TOOL], opener_in_prompt=False)),
    }
    for name, grammar in grammars.items():
        t0 = time.perf_counter()
        compiled = llguidance.LLMatcher(tok, grammar, log_level=0)
        compile_ms = (time.perf_counter() - t0) * 1e3
        if compiled.is_error():
            raise RuntimeError(compiled.get_error())

        def fill(m, bitmask):
            m.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

        out[name] = {
            "compile_ms": round(compile_ms, 2),
            **_walk(compiled.deep_copy, fill, lambda m, t: m.consume_token(t), cases[name][1], repeats),
        }
    return out


def _xgrammar(cases: dict[str, tuple[str, list[int]]], repeats: int) -> dict[str, object]:
    import xgrammar

    t0 = time.perf_counter()
    data = json.loads(tokenizer_path().read_text(encoding="utf-8"))
    vocab = [""] * VOCAB_SIZE
    for piece, i in data["model"]["vocab"].items():
        vocab[i] = piece  # added tokens stay "": special, never text (as in vocab.py)
    info = xgrammar.TokenizerInfo(
        vocab, xgrammar.VocabType.BYTE_LEVEL, vocab_size=VOCAB_SIZE, stop_token_ids=[EOS_ID]
    )
    out: dict[str, object] = {
        "version": metadata.version("xgrammar"),
        "tokenizer_s": round(time.perf_counter() - t0, 3),
    }
    compile_fns = {
        "json_schema": lambda c: c.compile_json_schema(
            json.dumps(SCHEMA), any_whitespace=False, separators=SEPARATORS
        ),
        "json_object": lambda c: c.compile_json_schema(
            json.dumps({"type": "object"}), any_whitespace=False, separators=SEPARATORS, strict_mode=False
        ),
        "regex": lambda c: c.compile_regex(cases["regex"][0]),
    }
    for name, compile_fn in compile_fns.items():
        compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        t0 = time.perf_counter()
        compiled = compile_fn(compiler)
        compile_ms = (time.perf_counter() - t0) * 1e3

        def fill(m, bitmask):
            m.fill_next_token_bitmask(bitmask.view(1, -1))

        out[name] = {
            "compile_ms": round(compile_ms, 2),
            **_walk(
                lambda c=compiled: xgrammar.GrammarMatcher(c),
                fill,
                lambda m, t: m.accept_token(t),
                cases[name][1],
                repeats,
            ),
        }
    return out


def _apply_cost(repeats: int = 200) -> float:
    logits = torch.randn(VOCAB_SIZE)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (bitmask_words(VOCAB_SIZE),), dtype=torch.int32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        apply_bitmask(logits.clone(), bitmask)
        times.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(times), 1)


def run(repeats: int = 5) -> dict[str, object]:
    """Both libraries on the same three grammars and token sequences; see the module docstring."""
    cases = {
        "json_schema": ("", _ids(json.dumps(INSTANCE, ensure_ascii=False))),
        "json_object": ("", _ids(json.dumps(INSTANCE, ensure_ascii=False))),
        "regex": (REGEX, _ids(REGEX_TEXT)),
        "tool_call": ("", _ids(TOOL_TEXT)),
    }
    out: dict[str, object] = {
        "vocab_size": VOCAB_SIZE,
        "repeats": repeats,
        "sequence_tokens": {k: len(v[1]) for k, v in cases.items()},
    }
    for name, backend in (("llguidance", _llguidance), ("xgrammar", _xgrammar)):
        try:
            out[name] = backend(cases, repeats)
        except ImportError as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    out["apply_mask_us"] = _apply_cost()
    out["torch_threads"] = torch.get_num_threads()  # apply_mask_us uses them; a busy host inflates it
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m dsi.structured.bench_mask", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=5, help="walks of each sequence per grammar")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.repeats), indent=2))


if __name__ == "__main__":
    main()
