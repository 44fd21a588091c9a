"""``dsi bench soak`` argument checks (the soak itself starts a cluster for minutes: run by hand)."""

from __future__ import annotations

import argparse

from dsi.bench import cli as bench_cli
from dsi.bench.soak import run


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
