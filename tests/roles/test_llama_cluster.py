"""SmolLM2-135M-Instruct (the Llama family) served by ``dsi serve`` through the disaggregated
cluster of configs/smollm2.toml (controller, entrypoint, prefill, decode, kvstore; one of each):
the OpenAI SDK's answer to the capital question names Paris; the greedy tokens of the eight
prompts of tests/smollm2.py equal transformers'; a repeated long prompt takes an exact prefix
hit (pages from the store) and answers alike; DeepSeek-only features are a 400.

The decode engine speculates with DSpark (``[engine] speculative = "dspark"``, its step-time
curve given by ``[engine] step_curve`` instead of measured at start-up): a seeded untrained
draft whose confidence head says every draft is all but sure to be accepted, and a curve where
drafts cost little, so DSpark verifies all 5 drafts of every request every step (the lengths
fixed-5 verifies) and nearly all are rejected and rolled back.
The greedy checks therefore say that DSpark leaves greedy output as it is through the cluster
(speculation off: transformers' tokens); ``dsi status`` shows its mode and that drafts were
verified.

One cluster serves every check (module fixture); the model directory links to the session's import.
"""

from __future__ import annotations

import asyncio
import json
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

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]

SMOLLM2_TOML = REPO_ROOT / "configs" / "smollm2.toml"
MODEL = "SmolLM2-135M-Instruct"
ROLES = ("controller-0", "entrypoint-0", "prefill-0", "decode-0", "kvstore-0")
# ms per step of 1 and 8 sequences x 1..6 tokens each: a draft token costs 2 % of a step
CURVE = {
    "batches": [1, 8],
    "lengths": [1, 2, 3, 4, 6],
    "step_ms": [[20, 20.4, 20.8, 21.2, 22], [30, 30.6, 31.2, 31.8, 33]],
    "draft_ms": [1, 2],
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir):
    """(gateway URL, controller address) of a running cluster; stopped by PID at teardown."""
    tmp = tmp_path_factory.mktemp("llama-cluster")
    model = tmp / "smollm2"  # links to the shared model plus this test's draft: the shared
    model.mkdir()  # directory stays as imported (vLLM loads every *.safetensors in it)
    for file in smollm2_dir.iterdir():
        (model / file.name).symlink_to(file)
    config = local_config(tmp, keep=ROLES, source=SMOLLM2_TOML)
    text = re.sub(r'(?m)^dir = "[^"]*"', f'dir = "{model}"', config.read_text())
    curve = tmp / "curve.json"
    curve.write_text(json.dumps(CURVE))
    text = text.replace("[engine]\n", f'[engine]\nspeculative = "dspark"\nstep_curve = "{curve}"\n', 1)
    config.write_text(text)
    draft = init_draft(576, torch.arange(4096), layers=1, ffn=64)
    draft["draft.conf_ab"] = torch.tensor([0.0, 12.0])  # every confidence sigmoid(12): verify all
    save_draft(model, draft)
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

    wait_until(lambda: decode().load.accept_rates[:1] >= (0.0,), timeout=10)  # position 1 verified
    load = decode().load
    assert load.speculative == "dspark" and len(load.accept_rates) == 5
    assert load.step_curve is not None and load.step_curve.step_ms == CURVE["step_ms"]  # the file's


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
