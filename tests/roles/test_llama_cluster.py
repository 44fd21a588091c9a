"""SmolLM2-135M-Instruct (the Llama family) served by ``dsi serve`` through the disaggregated
cluster of configs/smollm2.toml (controller, entrypoint, prefill, decode, kvstore; one of each):
the OpenAI SDK's answer to the capital question names Paris; the greedy tokens of the eight
prompts of tests/smollm2.py equal transformers'; a repeated long prompt takes an exact prefix
hit (pages from the store) and answers alike; DeepSeek-only features are a 400.

The decode engine speculates (``[engine] speculative = "fixed"``, 5 drafts a step from a seeded
untrained draft, nearly all rejected and rolled back), so the greedy checks also say that
speculation leaves greedy output as it is through the cluster; ``dsi status`` shows its mode.

One cluster serves every check (module fixture); the model directory is the session's import.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import pytest
import torch

from dsi.cli.status import fetch_instances
from dsi.kvcache.shm import remove_files_of
from dsi.model.draft import init_draft, save_draft
from tests.dsi.cli.procs import REPO_ROOT, Procs, free_port, gone, local_config, python_module, wait_until
from tests.smollm2 import GREEDY_TOKENS, PROMPTS

pytestmark = pytest.mark.slow

SMOLLM2_TOML = REPO_ROOT / "configs" / "smollm2.toml"
MODEL = "SmolLM2-135M-Instruct"
ROLES = ("controller-0", "entrypoint-0", "prefill-0", "decode-0", "kvstore-0")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    """(gateway URL, controller address) of a running cluster; stopped by PID at teardown."""
    tmp = tmp_path_factory.mktemp("llama-cluster")
    config = local_config(tmp, keep=ROLES, source=SMOLLM2_TOML)
    text = re.sub(r'(?m)^dir = "[^"]*"', f'dir = "{smollm2_dir}"', config.read_text())
    text = text.replace("[engine]\n", '[engine]\nspeculative = "fixed"\n', 1)
    config.write_text(text)
    save_draft(smollm2_dir, init_draft(576, torch.arange(4096), layers=1, ffn=64))
    controller = re.search(r'(?m)^controller = "([^"]+)"', text).group(1)  # type: ignore[union-attr]
    port = free_port()
    with Procs(tmp) as procs:
        argv = ["serve", "--config", str(config), "--port", str(port), "--ready-timeout", "120"]
        server = procs.start("serve", python_module("dsi.cli.main", *argv))
        server.read_line(timeout=150)  # the banner, once every role serves
        yield f"http://127.0.0.1:{port}", controller
        roles = _children(server.pid)
    # Procs SIGKILLed serve by PID; its roles got SIGTERM from the kernel at once (they ask for
    # it when their parent dies) and stop in parallel, removing their /dev/shm files.
    wait_until(lambda: all(gone(pid) for pid in roles), timeout=30)
    for pid in roles:
        remove_files_of(pid)


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _replica_blocks(gateway: str) -> int:
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return int(re.search(r"(?m)^dsi_kv_replica_blocks (\d+)", text).group(1))  # type: ignore[union-attr]


def test_openai_sdk_answer_names_paris(cluster):
    import openai

    client = openai.OpenAI(base_url=f"{cluster[0]}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=MODEL,
        max_tokens=24,
        temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert "<|im_end|>" not in reply.choices[0].message.content


def test_greedy_tokens_through_the_cluster_equal_transformers(cluster, smollm2_greedy):
    """The prompts go through the gateway's routing (prefill, KV handoff, decode) as token ids."""
    from tests.roles.disagg_client import run

    prompts, expected = smollm2_greedy
    got = asyncio.run(run(cluster[1], prompts, GREEDY_TOKENS))
    stopped = [e[: e.index(2) + 1] if 2 in e else e for e in expected]  # the engine stops at EOS
    assert got == stopped


def test_status_shows_the_decode_speculating(cluster):
    """...and, once a decode step verified drafts, its acceptance rate of the first position."""
    from tests.roles.disagg_client import run

    asyncio.run(run(cluster[1], [[1, 9690, 198, 2683, 314, 260]], 3))  # decodes: drafts are verified

    def decode():
        table = asyncio.run(fetch_instances(cluster[1], None, 10.0))
        return next(i for i in table.instances if i.role == "decode")

    wait_until(lambda: decode().load.accept_rates[:1] >= (0.0,), timeout=10)
    assert decode().load.speculative == "fixed" and len(decode().load.accept_rates) == 5


def test_a_repeated_long_prompt_hits_its_pages_exactly(cluster):
    """Full attention keeps no SWA rings: the second request loads the stored pages (an exact hit)
    and its greedy answer is the first one's."""
    import openai

    client = openai.OpenAI(base_url=f"{cluster[0]}/v1", api_key="none")
    question = " ".join(PROMPTS) * 4 + " Answer the last question."

    def ask():
        return client.chat.completions.create(
            model=MODEL, max_tokens=6, temperature=0, messages=[{"role": "user", "content": question}]
        )

    before = _replica_blocks(cluster[0])
    first = ask()
    assert first.usage.prompt_tokens > 256
    # The decode persists the full pages after the request; the gateway's replica follows the index.
    wait_until(lambda: _replica_blocks(cluster[0]) >= before + 2, timeout=30)
    again = ask()
    assert again.usage.prompt_tokens_details.cached_tokens == 256
    assert again.choices[0].message.content == first.choices[0].message.content


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
    ],
)
def test_deepseek_only_features_are_a_400(cluster, extra, param):
    import openai

    client = openai.OpenAI(base_url=f"{cluster[0]}/v1", api_key="none")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}], **extra
        )
    assert info.value.body["param"] == param and "DeepSeek" in info.value.body["message"]
