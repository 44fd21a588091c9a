"""Workload generators: one seed, one workload; sessions reuse their context; kinds differ."""

from __future__ import annotations

import numpy as np
import pytest

from dsi.sim.generators import GeneratorConfig, generate


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        (x.arrival_s, x.prompt_tokens, x.output_tokens, x.session)
        == (y.arrival_s, y.prompt_tokens, y.output_tokens, y.session)
        and np.array_equal(x.keys, y.keys)
        for x, y in zip(a, b, strict=True)
    )


def test_one_seed_one_workload():
    cfg = GeneratorConfig(kind="chat", rate=0.05, hours=2.0, seed=4)
    assert _same(generate(cfg), generate(cfg))
    assert not _same(generate(cfg), generate(GeneratorConfig(kind="chat", rate=0.05, hours=2.0, seed=5)))


def test_a_session_turn_starts_with_the_previous_turn_and_its_answer():
    reqs = generate(GeneratorConfig(kind="chat", rate=0.05, hours=2.0, seed=1))
    by_session: dict[int, list] = {}
    for r in reqs:
        by_session.setdefault(r.session, []).append(r)
    turns = next(v for v in by_session.values() if len(v) >= 2)
    first, second = turns[0], turns[1]
    assert second.prompt_tokens > first.prompt_tokens + first.output_tokens - 1
    assert np.array_equal(second.keys[: len(first.persist_keys)], first.persist_keys)


def test_kinds_set_traffic_class_and_single_turns_share_system_prompts():
    agent = generate(GeneratorConfig(kind="agent", rate=0.01, hours=1.0, seed=0))
    assert {r.traffic_class for r in agent} == {"agent"}
    single = generate(GeneratorConfig(kind="poisson", rate=1.0, hours=0.2, seed=0))
    assert {r.session for r in single} == {-1}
    firsts = {r.keys[0].tobytes() for r in single}
    assert 1 < len(firsts) <= 16  # 16 system prompts of 2,048 tokens


def test_overrides_and_bad_configs():
    long_out = generate(GeneratorConfig(kind="poisson", rate=2.0, hours=0.1, output_tokens=3000, seed=0))
    assert np.median([r.output_tokens for r in long_out]) > 1500
    with pytest.raises(ValueError, match="unknown generator"):
        GeneratorConfig(kind="zipf")
