"""``vllm bench serve`` as peers-served's second client: its command line, the figures read from
the JSON it saves, what a failed run reports, and dsi's ratios to each vLLM mode."""

import sys
from pathlib import Path

from dsi.bench import peers_served_vllm_bench as second
from dsi.bench.peers_served import ServedConfig, bench_ratios, figures, summarise
from dsi.bench.peers_served_client import ServedRun, StreamStat

SAVED = {
    "output_throughput": 123.456,
    "median_ttft_ms": 410.04,
    "p99_ttft_ms": 980.0,
    "completed": 32,
    "failed": 0,
}


def test_the_same_chat_load_for_every_server():
    argv = second.bench_argv(
        Path("/v/bin/python"),
        "http://127.0.0.1:9",
        "m",
        Path("/tok"),
        32,
        128,
        Path("/d"),
        "f.json",
    )
    assert argv[1:3] == ["-c", second.RUNNER] and "vllm.benchmarks.serve" in second.RUNNER
    flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert (flag("--backend"), flag("--endpoint")) == (
        "openai-chat",
        "/v1/chat/completions",
    )
    assert (
        flag("--num-prompts"),
        flag("--max-concurrency"),
        flag("--random-output-len"),
    ) == (
        "32",
        "32",
        "128",
    )
    assert (flag("--request-rate"), flag("--seed"), flag("--metric-percentiles")) == (
        "inf",
        "0",
        "50,99",
    )
    assert "--ignore-eos" in argv and "ttft" in flag("--percentile-metrics") and flag("--temperature") == "0"


def test_figures_come_from_the_saved_json():
    f = second.parse(SAVED)
    assert (f.tok_s, f.ttft_p50_ms, f.ttft_p99_ms, f.completed, f.failed) == (
        123.5,
        410.0,
        980.0,
        32,
        0,
    )


def test_a_failed_run_says_why(tmp_path):
    argv = second.bench_argv(
        Path(sys.executable),
        "http://127.0.0.1:9",
        "m",
        tmp_path,
        1,
        1,
        tmp_path,
        "vllm-bench-x.json",
    )
    why = second.run(argv, tmp_path, "x", env={})
    assert isinstance(why, str) and "vllm bench serve exited" in why  # dsi's Python has no vLLM


def test_dsis_ratios_to_each_vllm_mode():
    dsi, fast = (
        second.parse(SAVED),
        second.parse({**SAVED, "output_throughput": 246.912, "p99_ttft_ms": 490.0}),
    )
    ratios = bench_ratios({"dsi": dsi, "vllm-compile": fast, "vllm-eager": "vLLM server exited"})
    assert ratios["vllm-compile"] == {
        "dsi_vs_vllm": 0.5,
        "ttft_p50_ratio": 1.0,
        "ttft_p99_ratio": 2.0,
    }
    assert ratios["vllm-eager"] == {
        "dsi_vs_vllm": None,
        "ttft_p50_ratio": None,
        "ttft_p99_ratio": None,
    }
    result = summarise(
        ServedConfig(cores=(0,)),
        figures([ServedRun(1.0, [StreamStat(0.1, 8)])]),
        "x",
        {"dsi": dsi},
    )
    assert result.vllm_bench["dsi"]["tok_s"] == 123.5 and result.vllm_bench_ratios == {}
