"""`dsi sim`: a run prints its figures or its JSON, the same for the same seed."""

from __future__ import annotations

import json

from dsi.cli.main import main


def test_a_generated_run_prints_the_same_json_twice(capsys):
    argv = ["sim", "--generator", "chat", "--rate", "0.2", "--hours", "0.3", "--seed", "3", "--json"]
    assert main(argv) == 0
    one = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == one
    summary = json.loads(one)
    assert summary["workload"]["requests"] > 0 and summary["config"]["decode_lb"] == "bands"


def test_a_trace_run_prints_text_and_an_unplottable_run_says_why(capsys, tmp_path, monkeypatch):
    from dsi.sim import plots

    monkeypatch.setattr(plots, "available", lambda: False)
    assert main(["sim", "--limit", "300", "--prefill-lb", "round-robin", "--plots", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("300 requests") and "hit rate" in out
    assert "matplotlib is not importable" in err and not list(tmp_path.iterdir())


def test_a_bad_value_is_an_error_not_a_trace(capsys):
    assert main(["sim", "--limit", "10", "--time-scale", "0"]) == 2
    assert "time_scale" in capsys.readouterr().err


def test_a_one_host_cluster_shares_its_cores_and_its_first_tokens_come_later(capsys):
    argv = ["sim", "--profile", "cpu", "--limit", "200", "--time-scale", "4", "--prefills", "2",
            "--decodes", "2", "--reserve-at-step", "--json"]  # fmt: skip
    assert main(argv) == 0
    apart = json.loads(capsys.readouterr().out)
    shared = [*argv, "--shared-cores", "2", "--engine-threads", "2", "--prefill-batch-tokens", "8192",
              "--path-s", "0.05", "--path-s-per-token", "1e-4"]  # fmt: skip
    assert main(shared) == 0
    one_host = json.loads(capsys.readouterr().out)
    assert one_host["config"]["shared_cores"] == 2 and one_host["config"]["prefill_batch_tokens"] == 8192
    assert one_host["ttft_s"]["p50"] > apart["ttft_s"]["p50"] + 0.05  # the path and the shared cores
    assert one_host["workload"]["requests"] == apart["workload"]["requests"] == 200
