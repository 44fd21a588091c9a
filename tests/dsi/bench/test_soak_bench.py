"""``dsi bench soak`` argument checks (the soak itself starts a cluster for minutes: run by hand)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from dsi.bench import cli as bench_cli
from dsi.bench.soak import _Watch, run


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", "soak", *argv])


def test_the_defaults_are_a_twenty_minute_soak_with_a_kill_every_three_minutes():
    args = parse()
    assert (args.minutes, args.kill_every_s, args.warmup_s, args.func) == (20.0, 180.0, 60.0, run)
    assert args.kill_kinds.split(",") == ["decode", "prefill", "kvstore", "controller"]


def test_a_soak_no_longer_than_its_warm_up_is_refused_before_anything_starts(capsys):
    assert run(parse("--minutes", "0.5", "--warmup-s", "60")) == 2
    assert "--minutes must exceed --warmup-s" in capsys.readouterr().err
    assert run(parse("--concurrency", "0")) == 2
    assert run(parse("--kill-kinds", "decode,decoder")) == 2
    assert "unknown role kinds ['decoder']" in capsys.readouterr().err


def info(instance_id: str, state: str = "serving", pid: int = 1) -> SimpleNamespace:
    return SimpleNamespace(instance_id=instance_id, role=instance_id.rsplit("-", 1)[0], state=state, pid=pid)


def test_no_capacity_spans_are_the_times_without_a_serving_decode_not_a_partial_table():
    watch, kinds = _Watch(), {"decode", "prefill"}
    watch.update([info("decode-0"), info("decode-1", pid=2), info("prefill-0", pid=3)], kinds, 0.0)
    watch.update([info("decode-0"), info("decode-1", "dead", 2), info("prefill-0", pid=3)], kinds, 1.0)
    watch.update([info("prefill-0", pid=3)], kinds, 2.0)  # a restarted controller that heard one role yet
    assert watch.spans(3.0) == []
    watch.update(
        [info("decode-0", "dead"), info("decode-1", "dead", 2), info("prefill-0", pid=3)], kinds, 4.0
    )
    watch.update([info("decode-0", pid=9), info("prefill-0", pid=3)], kinds, 6.0)
    assert watch.spans(7.0) == [(4.0, 6.0)]
    assert watch.pids == {"decode-0": 9, "decode-1": 2, "prefill-0": 3} and watch.seen == {1, 2, 3, 9}
