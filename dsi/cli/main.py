"""``dsi``: the operator's command. Each subcommand lives in its own module and registers itself
through a ``register(subparsers)`` function that sets ``func`` on its parser."""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `dsi --help` lists them.
_COMMANDS = (
    "dsi.cli.serve",
    "dsi.cli.status",
    "dsi.cli.scale",
    "dsi.cli.drain",
    "dsi.cli.undrain",
    "dsi.cli.model",
    "dsi.cli.generate",
    "dsi.cli.recipe",
    "dsi.cli.sim",
    "dsi.bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsi", description="dsi: disaggregated serving for DeepSeek-V4 models"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
