"""``dsi keys``: the CURVE keys of a cluster, and the ``[security]`` section that uses them.

    dsi keys create --out DIR [--roles NAME ...] [--force]
    dsi keys show DIR [--client NAME]

``create`` writes a server keypair, one client keypair per ``--roles`` name (default: one,
"cluster"; name one per role kind or host to be able to shut one out alone) and the allow-list
of their public keys (see dsi.transport.keyset), then prints the public keys and the snippet.
Exit 1 when DIR already holds keys (without ``--force``) or holds none (``show``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsi.transport.keyset import DEFAULT_CLIENTS, KeySet, KeySetError, create_key_set, load_key_set


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("keys", help="make or show a cluster's CURVE keys")
    keys = parser.add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="write a new key set and print its [security] section")
    create.add_argument("--out", type=_path, required=True, metavar="DIR", help="folder of the key set")
    create.add_argument(
        "--roles",
        nargs="+",
        default=list(DEFAULT_CLIENTS),
        metavar="NAME",
        help="one client keypair per name, each admitted by every role (default: cluster)",
    )
    create.add_argument("--force", action="store_true", help="replace the keys DIR already holds")
    create.set_defaults(func=_create)
    show = keys.add_parser("show", help="print a key set's public keys and [security] section")
    show.add_argument("dir", type=_path, metavar="DIR")
    show.add_argument("--client", default=None, help="the client keypair the section names (default: first)")
    show.set_defaults(func=_show)


def _create(args: argparse.Namespace) -> int:
    try:
        keyset = create_key_set(args.out, args.roles, force=args.force)
    except KeySetError as exc:
        print(f"dsi keys create: {exc}", file=sys.stderr)
        return 1
    print(f"wrote a key set to {keyset.directory} (every file 0600)\n")
    print(describe(keyset, args.roles[0]))
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        text = describe(load_key_set(args.dir), args.client)
    except KeySetError as exc:
        print(f"dsi keys show: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


def describe(keyset: KeySet, client: str | None) -> str:
    """The public keys of ``keyset``, then its ``[security]`` section for ``client``."""
    lines = [f"server public key: {keyset.server_public.decode()}"]
    for c in keyset.clients:
        state = "" if c.authorized else "  (not in authorized/: roles refuse it)"
        lines.append(f"client {c.name}: {c.public.decode()}{state}")
    for name, public in keyset.extra_authorized:
        lines.append(f"authorized/{name}.key: {public.decode()}  (no client keypair in this folder)")
    lines += ["", "Add to the config of every node:", "", keyset.snippet(client)]
    return "\n".join(lines)


def _path(text: str) -> Path:
    if not text:
        raise argparse.ArgumentTypeError("a folder path must not be empty")
    return Path(text)
