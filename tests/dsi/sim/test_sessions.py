"""A growing context hashes as the whole token stream would, and its turns share prefixes."""

from __future__ import annotations

import numpy as np

from dsi.kvcache.hashchain import HashChain, keys_of
from dsi.sim.sessions import SEGMENT_TOKENS, Context

CHAIN = HashChain(model="sim", block_size=128)


def _tokens(segments: list[tuple[int, int]]) -> np.ndarray:
    return np.concatenate(
        [
            (np.arange(n, dtype=np.uint64) + (uid * SEGMENT_TOKENS & 0xFFFFFFFF)).astype(np.uint32)
            for uid, n in segments
        ]
    )


def test_incremental_keys_equal_the_chain_over_all_tokens():
    ctx = Context(CHAIN)
    segments = [(0, 300), (1 << 30, 77), ((1 << 30) + 1, 500), ((1 << 30) + 2, 129)]
    for uid, n in segments:
        ctx.extend(uid, n)
    whole = keys_of(CHAIN.hashes(_tokens(segments)))
    assert ctx.tokens == 1006 and np.array_equal(ctx.keys(len(whole)), whole)


def test_a_turn_returns_prompt_pages_and_prompt_plus_answer_pages():
    ctx = Context(CHAIN)
    ctx.extend(0, 200)
    prompt, keys, persist = ctx.turn(10, 300, 11, 200)
    assert prompt == 500 and len(keys) == 3 and len(persist) == (500 + 200 - 1) // 128
    _, keys2, _ = ctx.turn(12, 50, 13, 10)
    assert np.array_equal(keys2[: len(persist)], persist)  # the next turn hits all of it
