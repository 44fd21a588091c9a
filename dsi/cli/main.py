"""``dsi``: the operator's command. Each subcommand lives in its own module and registers itself
through a ``register(subparsers)`` function that sets ``func`` on its parser."""

from __future__ import annotations

import argparse
import importlib
import sys

from dsi.paths import MissingPath

# Subcommand modules, in the order `dsi --help` lists them; each registers the command it is
# named for (see command_of).
_COMMANDS = (
    "dsi.cli.serve",
    "dsi.cli.status",
    "dsi.cli.scale",
    "dsi.cli.drain",
    "dsi.cli.undrain",
    "dsi.cli.keys",
    "dsi.cli.config",
    "dsi.cli.model",
    "dsi.cli.generate",
    "dsi.cli.recipe",
    "dsi.cli.sim",
    "dsi.bench.cli",
)


def command_of(module: str) -> str:
    """The command a subcommand module registers: its own name, or its package's for a ``cli``
    module (``dsi.bench.cli`` registers ``bench``)."""
    *package, name = module.split(".")
    return package[-1] if name == "cli" else name


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only ``command``'s when it names one: a command then imports
    its own module alone (``dsi status`` does not wait for the benchmarks' imports)."""
    parser = argparse.ArgumentParser(
        prog="dsi", description="dsi: disaggregated serving for DeepSeek-V4 models"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [m for m in _COMMANDS if command_of(m) == command] or _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MissingPath as exc:  # a trace or shipped file not found: what to pass, no traceback
        print(f"dsi {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
