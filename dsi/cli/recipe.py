"""``dsi recipe render``: one request body on stdin -> its prompt, as the gateway would build it.

    $ echo '{"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}]}' \\
        | dsi recipe render --protocol chat
    {"prompt": "<｜begin▁of▁sentence｜>...", "special_ranges": [[0, 21], ...],
     "token_ids": [0, ...], "model_version": "V4"}

``token_ids`` come from the shipped V4 vocabulary. A prompt that needs a control token this
vocabulary lacks (``<｜System｜>`` of V4.1: reasoning effort, system prompts) is still printed,
with ``"token_ids": null`` and a ``token_ids_unavailable`` sentence naming the tokens and the
tokenizer file (serving such a request is a 400). A bad request prints the protocol's error body
and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsi.recipe import RequestPrompt

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
        rendered = Recipe(aliases).render_prompt(args.protocol, body)
    except RequestError as err:
        print(json.dumps(error_body(err, args.protocol), ensure_ascii=False))
        return EXIT_BAD_REQUEST
    print(json.dumps(_output(rendered), ensure_ascii=False))
    return 0


def _output(rendered: RequestPrompt) -> dict[str, Any]:
    """The printed JSON: ``token_ids_unavailable`` only where ``token_ids`` is null."""
    ids = rendered.token_ids
    out: dict[str, Any] = {
        "prompt": rendered.prompt.text,
        "special_ranges": [list(r) for r in rendered.prompt.special_ranges],
        "token_ids": None if ids is None else list(ids),
    }
    if ids is None:
        out["token_ids_unavailable"] = rendered.token_ids_unavailable
    out["model_version"] = rendered.model_version.value
    return out
