"""dsi bench peers-served: its pure parts (SSE parsing, percentiles, figures, the result and the
configs and command lines it builds). The measurement itself is not run here: it takes minutes."""

import argparse
import re
from pathlib import Path

import pytest

from dsi.bench import peers_served
from dsi.bench.peers_served import (
    LONG_QUESTIONS,
    ServedConfig,
    bodies,
    figures,
    model_name,
    summarise,
    with_engine_threads,
    with_engines,
    with_model_dir,
)
from dsi.bench.peers_served_client import ServedRun, StreamStat, percentile, sse_data
from dsi.bench.peers_served_vllm import server_argv
from dsi.config.node import load_config

REPO = Path(__file__).resolve().parents[3]


def test_sse_lines():
    assert sse_data(b'data: {"choices": []}\n') == {"choices": []}
    assert sse_data(b"data: [DONE]\n") == "[DONE]"
    assert sse_data(b"\n") is None
    assert sse_data(b": keep-alive\n") is None
    assert sse_data(b"data: not json\n") is None


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([], 50) is None


def _run(wall: float, *streams: tuple[float | None, int]) -> ServedRun:
    return ServedRun(wall, [StreamStat(t, n) for t, n in streams])


def test_figures_are_medians_and_percentiles_over_streams():
    runs = [_run(2.0, (0.1, 100), (0.3, 100)), _run(1.0, (0.2, 128), (None, 0))]
    f = figures(runs)
    assert f.tok_s == 114.0  # median of 200 / 2 s and 128 / 1 s
    assert (f.ttft_p50_ms, f.ttft_p99_ms) == (200.0, 300.0)
    assert f.mean_tokens == 82.0 and f.errors == []


def test_result_fields_and_ratio():
    config = ServedConfig(vllm_modes=("eager",))
    dsi = figures([_run(1.0, (0.05, 50))])
    vllm = figures([_run(1.0, (0.02, 100))])
    r = summarise(config, dsi, vllm)
    assert (r.served_dsi_tok_s, r.served_vllm_tok_s, r.served_dsi_vs_vllm) == (50.0, 100.0, 0.5)
    assert (r.served_dsi_ttft_p50_ms, r.served_vllm_ttft_p99_ms) == (50.0, 20.0)
    assert r.served_vllm_error is None and r.served_dsi_error is None


def test_vllm_that_cannot_start_is_reported_not_raised():
    r = summarise(ServedConfig(), figures([_run(1.0, (0.05, 50))]), "vLLM server exited; see log")
    assert r.served_vllm_tok_s is None and r.served_dsi_vs_vllm is None
    assert r.served_vllm_error == "vLLM server exited; see log"
    assert r.served_dsi_tok_s == 50.0


def test_stream_errors_are_reported():
    bad = ServedRun(1.0, [StreamStat(None, 0, "HTTP 400: bad")])
    assert summarise(ServedConfig(), figures([bad]), "x").served_dsi_error == "HTTP 400: bad"


def test_config_rejects_zero():
    with pytest.raises(ValueError, match="--streams"):
        ServedConfig(streams=0)


def test_the_private_config_points_at_the_shared_weights():
    text = '[model]\nname = "SmolLM2-135M-Instruct"\ndir = "../run/models/x"\n'
    out = with_model_dir(text, Path("/abs/smollm2"))
    assert 'dir = "/abs/smollm2"' in out and model_name(out) == "SmolLM2-135M-Instruct"


def test_the_served_layout_keeps_the_first_engines_of_each_kind(tmp_path):
    text = (REPO / "configs" / "smollm2.toml").read_text()
    ids = lambda t: re.findall(r'(?m)^id = "([^"]+)"', t)  # noqa: E731
    one = with_engines(text, 1)
    assert [i for i in ids(one) if i.startswith(("prefill", "decode"))] == ["prefill-0", "decode-0"]
    assert set(ids(text)) - set(ids(one)) == {"prefill-1", "decode-1"}
    assert with_engines(text, 2) == text
    path = tmp_path / "smollm2.toml"
    path.write_text(one)
    assert [r.id for r in load_config(path).roles] == ids(one)  # still a valid config


def test_bodies_are_the_same_greedy_streams_for_both_systems():
    b = bodies(ServedConfig(streams=40, max_tokens=16), "m")
    assert len(b) == 40 and b[32]["messages"] == b[0]["messages"]
    assert b[0]["messages"][0]["content"] == LONG_QUESTIONS[0]
    assert all(x["temperature"] == 0.0 and x["stream"] and x["max_tokens"] == 16 for x in b)
    assert all(x["ignore_eos"] is True for x in b)  # both systems generate exactly max_tokens


def test_vllm_server_is_eager_without_prefix_caching_on_loopback():
    argv = server_argv(Path("/v/bin/python"), Path("/m"), "name", 1234, 32)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "1234"


def test_registered_arguments():
    parser = argparse.ArgumentParser()
    peers_served.register(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["peers-served", "--json", "--streams", "4", "--no-vllm"])
    assert args.json and args.streams == 4 and args.no_vllm and args.max_tokens == 128
    assert (args.cores, args.vllm_modes) == ("all", "compile,eager")


def test_each_vllm_mode_is_a_row_and_the_default_mode_fills_the_headline_fields():
    config = ServedConfig(cores=(0, 1))
    dsi = figures([_run(1.0, (0.05, 50))])
    rows = {"compile": figures([_run(1.0, (0.1, 100))]), "eager": figures([_run(1.0, (0.025, 25))])}
    r = summarise(config, dsi, rows)
    assert [row.mode for row in r.vllm_rows] == ["compile", "eager"]
    assert [row.dsi_vs_vllm for row in r.vllm_rows] == [0.5, 2.0]
    assert [row.ttft_p99_ratio for row in r.vllm_rows] == [0.5, 2.0]
    assert (r.served_vllm_mode, r.served_vllm_tok_s, r.served_dsi_vs_vllm) == ("compile", 100.0, 0.5)
    failed = summarise(config, dsi, {"compile": "vLLM server exited", "eager": rows["eager"]})
    assert (failed.served_vllm_mode, failed.served_dsi_vs_vllm) == ("eager", 2.0)  # the mode that ran
    assert failed.vllm_rows[0].error == "vLLM server exited" and failed.vllm_rows[0].tok_s is None


def test_both_systems_are_stated_on_the_same_cores_with_a_thread_per_core():
    r = summarise(ServedConfig(cores=(0, 1)), figures([_run(1.0, (0.05, 50))]), "x")
    assert (r.cores, r.threads) == ("0,1", 2)
    dsi, vllm = r.settings["dsi"], r.settings["vllm"]
    assert dsi["cores"] == vllm["cores"] == vllm["omp_bind"] == "0,1"
    assert dsi["torch_threads_per_engine"] == vllm["omp_threads"] == 2
    assert dsi["detokenize"] and vllm["detokenize"] and dsi["dtype"] == vllm["dtype"]
    assert vllm["modes"] == ["compile", "eager"]


def test_a_bad_vllm_mode_is_refused():
    with pytest.raises(ValueError, match="--vllm-modes"):
        ServedConfig(vllm_modes=("fast",))


def test_dsis_engines_get_a_torch_thread_per_core(tmp_path):
    text = (REPO / "configs" / "smollm2.toml").read_text()
    two = with_engine_threads(text, 2)
    path = tmp_path / "smollm2.toml"
    path.write_text(two)
    assert load_config(path).engine.threads == 2
    assert two.count("threads = ") == text.count("threads = ")  # replaced, not added
    bare = with_engine_threads('[model]\nname = "m"\n', 3)
    assert bare.endswith("[engine]\nthreads = 3\n")


def test_vllm_compile_mode_drops_enforce_eager():
    argv = server_argv(Path("/v/bin/python"), Path("/m"), "name", 1234, 32, eager=False)
    assert "--enforce-eager" not in argv and "--no-enable-prefix-caching" in argv


def test_dsi_engines_may_get_their_own_thread_count_and_the_result_says_how_they_wait(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    config = ServedConfig(cores=(0, 1), dsi_threads=1)
    r = summarise(config, figures([_run(1.0, (0.05, 50))]), "x")
    assert r.settings["dsi"]["torch_threads_per_engine"] == 1 and r.settings["vllm"]["omp_threads"] == 2
    assert r.settings["dsi"]["openmp_wait"] == "OMP_WAIT_POLICY=PASSIVE"
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    assert summarise(config, figures([_run(1.0, (0.05, 50))]), "x").settings["dsi"]["openmp_wait"] == (
        "GOMP_SPINCOUNT=10000"
    )
    assert ServedConfig(cores=(0, 1)).engine_threads == 2
    with pytest.raises(ValueError, match="--dsi-threads"):
        ServedConfig(dsi_threads=-1)


def test_no_prefills_leaves_decodes_that_prefill_themselves(tmp_path):
    text = (REPO / "configs" / "smollm2.toml").read_text()
    ids = lambda t: re.findall(r'(?m)^id = "([^"]+)"', t)  # noqa: E731
    colocated = with_engines(text, 1, prefills=0)
    assert [i for i in ids(colocated) if i.startswith(("prefill", "decode"))] == ["decode-0"]
    path = tmp_path / "smollm2.toml"
    path.write_text(colocated)
    assert [r.id for r in load_config(path).roles] == ids(colocated)
    assert ServedConfig(prefills=0).layout.startswith("1 colocated decode")
    with pytest.raises(ValueError, match="--prefills"):
        ServedConfig(prefills=-1)
