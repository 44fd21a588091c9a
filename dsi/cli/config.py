"""``dsi config``: the node config file.

dsi config docs     the reference of every table and key, in Markdown (docs/configuration.md
                    is its output: ``make docs`` writes it again)
"""

from __future__ import annotations

import argparse
import sys

from dsi.config.docs import reference


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="the node config file's reference")
    config = parser.add_subparsers(dest="config_command", required=True)
    docs = config.add_parser("docs", help="print the reference of every config table and key (Markdown)")
    docs.set_defaults(func=_docs)


def _docs(_args: argparse.Namespace) -> int:
    sys.stdout.write(reference())
    return 0
