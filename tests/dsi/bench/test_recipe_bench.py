"""``dsi bench recipe`` end to end with small sizes: every figure is reported and positive, both
serving processes are reaped. Speed is not asserted (a benchmark prints figures; the machine may
be shared)."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing

from dsi.bench import cli as bench_cli
from dsi.bench.recipe import TokenSource, format_table, register, stream_ids
from dsi.messages.gateway import Generate

HEADLINE = (
    "encode_4mb_ratio_vs_recipe",
    "parse_us_per_token",
    "parse_ratio_vs_recipe",
    "gateway_overhead_ratio",
)
RAW = (
    "encode_1mb_en_s", "encode_1mb_en_recipe_s", "encode_1mb_en_tokens",
    "encode_1mb_zh_s", "encode_1mb_zh_recipe_s", "encode_1mb_zh_tokens", "encode_1mb_ratio_vs_recipe",
    "recipe_us_per_token", "stream_us_per_token", "recipe_stream_us_per_token", "stream_ratio_vs_recipe",
    "gateway_us_per_token", "bare_us_per_token", "gateway_server_cpu_us_per_token",
    "bare_server_cpu_us_per_token", "gateway_cpu_ratio",
)  # fmt: skip
SMALL = ["--encode-mb", "1", "--encode-repeats", "1", "--parse-tokens", "256", "--parse-repeats", "1",
         "--streams", "8", "--tokens", "6", "--gateway-repeats", "1"]  # fmt: skip


def test_json_has_every_figure_positive(capsys):
    assert "dsi.bench.recipe" in bench_cli._BENCHES
    parser = argparse.ArgumentParser(prog="dsi bench")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["recipe", "--json", *SMALL])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for name in (*HEADLINE, *RAW):
        assert figures[name] > 0, name
    assert figures["encode_1mb_en_same_ids"] and figures["encode_1mb_zh_same_ids"]
    assert figures["encode_largest_mb"] == 1
    assert figures["encode_4mb_ratio_vs_recipe"] == round(figures["encode_1mb_ratio_vs_recipe"], 3)
    assert (figures["streams"], figures["stream_tokens"]) == (8, 6)
    assert multiprocessing.active_children() == []  # both serving processes were terminated
    table = format_table(figures)
    for row in (
        "encode en 1 MB",
        "encode zh 1 MB",
        "parse us/token",
        "wall us/token, 8 streams",
        "server CPU",
    ):
        assert row in table


def test_token_source_sends_one_token_per_chunk_and_finishes_on_the_last():
    ids = stream_ids(5)

    async def collect():
        return [chunk async for chunk in TokenSource(ids).generate(Generate("r1", [1, 2, 3]))]

    chunks = asyncio.run(collect())
    assert [c.token_ids for c in chunks] == [[i] for i in ids]
    assert [c.finish for c in chunks] == ["", "", "", "", "stop"]
    assert {c.request_id for c in chunks} == {"r1"} and chunks[0].prompt_tokens == 3
