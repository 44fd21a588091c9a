"""bench_parse runs and reports its fields (the figures themselves are printed by the benchmark)."""

from __future__ import annotations

import json

from dsi.recipe.bench_parse import bench_parse, sample_output
from dsi.recipe.parser import ContentDelta, Finish, OutputParser, ReasoningDelta, ToolCallEnd


def test_sample_output_is_what_the_benchmark_claims():
    p = OutputParser(starts_in_reasoning=True)
    events = [e for i in sample_output(600) for e in p.feed([i])]
    assert any(isinstance(e, ReasoningDelta) for e in events)
    assert any(isinstance(e, ContentDelta) for e in events)
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert json.loads(end.arguments)["units"] == {"temp": "C", "wind": ["km/h", 1.5]}
    assert events[-1] == Finish("tool_calls")


def test_bench_parse_fields():
    figures = bench_parse(min_tokens=300, repeats=1)
    assert figures["tokens"] >= 300
    for key in ("parse_us_per_token", "recipe_us_per_token", "parse_ratio_vs_recipe", "stream_us_per_token"):
        assert figures[key] > 0, key
