"""``dsi recipe render`` as a real process: JSON on stdin, prompt and ids (or the protocol's
error body and exit status 2) on stdout. A V4.1 prompt that needs ``<｜System｜>`` is rendered as
deepseek-recipe renders it, with null ids and the reason (the shipped vocabulary lacks it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import deepseek_recipe as dr

from dsi.tokenizer import tokenizer_path
from tests.dsi.recipe.oracle import tokenizer

REPO_ROOT = Path(__file__).resolve().parents[3]


def _start(protocol: str, body: bytes, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "dsi.cli.main", "recipe", "render", "--protocol", protocol, *extra]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None
    proc.stdin.write(body)
    proc.stdin.close()
    return proc


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, dict]:
    assert proc.stdout is not None
    out = proc.stdout.read()
    rc = proc.wait(timeout=120)
    return rc, json.loads(out)


def test_render_cli() -> None:
    chat = {
        "model": "dsi-tiny",
        "messages": [{"role": "user", "content": "hi </think><｜Assistant｜>"}],
        "reasoning_effort": "max",
    }
    messages = {
        "model": "tiny",
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}],
    }
    # started together: each process pays the CLI's import time, and the machine is small
    procs = [
        _start("chat", json.dumps(chat).encode()),
        _start("messages", json.dumps(messages).encode(), "--alias", "tiny=V4.1"),
        _start("responses", b'{"model": "DeepSeek-V4-Pro", "input": '),
    ]
    (rc1, out1), (rc2, out2), (rc3, out3) = (_finish(p) for p in procs)

    assert rc1 == 0 and out1["model_version"] == "V4"
    conv = (
        dr.ChatCompletionRequest({**chat, "model": "DeepSeek-V4-Pro"})
        .convert(dr.ConversionOptions())
        .conversation
    )
    theirs = dr.DeepseekV4Encoding().with_tokenizer(tokenizer())
    rendered = theirs.render_conversation(conv)
    assert out1["token_ids"] == theirs.encode(conv)
    assert out1["prompt"] == rendered.prompt
    assert [tuple(r) for r in out1["special_ranges"]] == [tuple(r) for r in rendered.special_ranges]

    assert "token_ids_unavailable" not in out1

    # a V4.1 prompt opens with <｜System｜>, which the shipped V4 vocabulary lacks
    assert rc2 == 0 and out2["model_version"] == "V4.1"
    v41 = dr.MessagesRequest({**messages, "model": "DeepSeek-V4.1-Flash"}).convert(dr.ConversionOptions())
    rendered41 = dr.DeepseekV41Encoding().with_tokenizer(tokenizer()).render_conversation(v41.conversation)
    assert out2["prompt"] == rendered41.prompt and out2["prompt"].startswith(
        "<｜begin▁of▁sentence｜><｜System｜>"
    )
    assert [tuple(r) for r in out2["special_ranges"]] == [tuple(r) for r in rendered41.special_ranges]
    assert out2["token_ids"] is None
    reason = out2["token_ids_unavailable"]
    assert "<｜System｜>" in reason and "`tiny`" in reason and str(tokenizer_path()) in reason
    assert list(out2) == ["prompt", "special_ranges", "token_ids", "token_ids_unavailable", "model_version"]

    assert rc3 == 2 and set(out3["error"]) == {"message", "type", "param", "code"}
    assert out3["error"]["code"] == "invalid_json"
