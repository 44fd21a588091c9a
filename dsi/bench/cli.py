"""``dsi bench <name> [--json]``: each benchmark module registers one sub-subcommand."""

from __future__ import annotations

import argparse
import importlib

# Benchmark modules; each has register(subparsers).
_BENCHES = (
    "dsi.bench.rpc",
    "dsi.bench.engine",
    "dsi.bench.hit_load",
    "dsi.bench.replay",
    "dsi.bench.recipe",
    "dsi.bench.kvstore",
    "dsi.bench.trace_hits",
    "dsi.bench.kv_transfer",
    "dsi.bench.hit_agreement",
    "dsi.bench.replay_quality",
    "dsi.bench.prefill_lb",
    "dsi.bench.decode_lb",
    "dsi.bench.drain",
    "dsi.bench.route",
    "dsi.bench.soak",
    "dsi.bench.chaos",
    "dsi.bench.encoder",
    "dsi.bench.eplb",
    "dsi.bench.spec",
    "dsi.bench.peers",
    "dsi.bench.peers_served",
    "dsi.bench.vllm_cluster",
    "dsi.bench.control_plane",
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print its figures")
    benches = parser.add_subparsers(dest="bench", required=True)
    for name in _BENCHES:
        importlib.import_module(name).register(benches)
