"""dsi bench vllm-cluster: its options, request bodies and table (the measurement itself starts
vLLM instances and takes minutes: it is the benchmark, not a test)."""

import argparse

import pytest

from dsi.bench import vllm_cluster
from dsi.bench.vllm_cluster import BenchConfig, print_table
from dsi.bench.vllm_cluster_load import bodies
from dsi.bench.vllm_cluster_trace import BenchRequest


def test_registered_with_its_defaults():
    parser = argparse.ArgumentParser()
    vllm_cluster.register(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["vllm-cluster", "--json", "--requests", "8", "--skip-router"])
    assert args.json and args.requests == 8 and args.skip_router and not args.skip_single
    assert (args.concurrency, args.dir, args.tokens_per_id, args.max_output_tokens) == (
        4,
        "run/bench-vllm-cluster",
        64,
        24,
    )


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="concurrency"):
        BenchConfig(concurrency=0)


def test_every_request_is_a_greedy_streamed_chat_that_ignores_eos():
    (body,) = bodies([BenchRequest(3, (0, 1), "alpha beta", 16, 1)], "SmolLM2-135M-Instruct")
    assert body["messages"] == [{"role": "user", "content": "alpha beta"}]
    assert body["model"] == "SmolLM2-135M-Instruct" and body["max_tokens"] == 16
    assert body["temperature"] == 0.0 and body["stream"] and body["ignore_eos"]
    assert body["stream_options"] == {"include_usage": True}


def test_the_table_names_each_figure_and_whether_its_goal_is_met(capsys):
    row = {"dsi": 1.0, "peer": 2.0, "dsi_over_peer": 0.5, "goal": "<= 0.6", "met": True}
    side = {"error": None}
    result = {
        "workload": {"requests": 32, "concurrency": 4},
        "wall_s": 300.0,
        "cluster": {
            "comparison": {"computed_tokens_per_request": row},
            "dsi": side,
            "peer": {"error": "no router"},
        },
    }
    print_table(result)
    out = capsys.readouterr().out
    assert "computed_tokens_per_request" in out and "met" in out and "peer: no router" in out
