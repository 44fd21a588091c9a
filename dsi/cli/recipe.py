"""``dsi recipe render``: one request body on stdin -> its prompt, as the gateway would build it.

    $ echo '{"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}]}' \\
        | dsi recipe render --protocol chat
    {"prompt": "<｜begin▁of▁sentence｜>...", "special_ranges": [[0, 21], ...],
     "token_ids": [0, ...], "model_version": "V4"}

``token_ids`` come from the shipped V4 vocabulary. A bad request prints the protocol's error
body and exits with status 2; so does a prompt that needs a control token this vocabulary lacks
(``<｜System｜>`` of V4.1).
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_BAD_REQUEST = 2
DEFAULT_ALIASES = ("dsi-tiny=V4",)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("recipe", help="render protocol requests into prompts")
    cmds = parser.add_subparsers(dest="recipe_command", required=True)
    render = cmds.add_parser("render", help="read one request JSON on stdin, print its prompt and token ids")
    render.add_argument("--protocol", required=True, choices=["chat", "responses", "messages"])
    render.add_argument(
        "--alias",
        action="append",
        default=None,
        metavar="NAME=VERSION",
        help=f"serve NAME with the V4 or V4.1 format (default: {', '.join(DEFAULT_ALIASES)})",
    )
    render.set_defaults(func=_render)


def _render(args: argparse.Namespace) -> int:
    from dsi.recipe import ModelVersion, Recipe, RequestError, error_body

    aliases = {}
    for item in args.alias or DEFAULT_ALIASES:
        name, _, version = item.partition("=")
        try:
            aliases[name] = ModelVersion(version)
        except ValueError:
            print(f"dsi recipe render: --alias {item!r}: the version must be V4 or V4.1", file=sys.stderr)
            return 1
    body = sys.stdin.buffer.read()
    try:
        req = Recipe(aliases).prepare(args.protocol, body)
    except RequestError as err:
        print(json.dumps(error_body(err, args.protocol), ensure_ascii=False))
        return EXIT_BAD_REQUEST
    out = {
        "prompt": req.prompt.text,
        "special_ranges": [list(r) for r in req.prompt.special_ranges],
        "token_ids": list(req.prompt_token_ids),
        "model_version": req.model_version.value,
    }
    print(json.dumps(out, ensure_ascii=False))
    return 0
