"""dsi's cluster layer around real vLLM instances (vLLM's CPU build, SmolLM2-135M-Instruct).

One ``dsi serve`` of configs/vllm.toml grown to two vLLM prefills and two vLLM decodes (on free
ports), shared by the tests in file order:

- the OpenAI SDK's chat answer names Paris;
- 16 prompts through prefill -> decode give plain vLLM's greedy tokens (same weights, settings);
- PD handoff: for prompts of 200 to 3,000 tokens the decodes' vLLM reports every prompt token but
  the last as loaded through the connector and computes one;
- a long prompt prefilled on one prefill, then on the other (whose vLLM never saw it), is a
  kvstore hit there: it computes at most one block plus the tail;
- kill -9 of a vLLM decode under 16 streams: every stream is the undisturbed one, and serve
  replaces the decode; ``dsi drain`` of a decode under 16 streams: the same.

The kill comes early: the replacement's vLLM loads (about a minute on two cores) while the tests
that need one decode run on the one left (``Served.live``); the test that checks the replacement
serves comes after them, then the tests that need both decodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import zmq.asyncio

from dsi.cli.main import main as dsi_main
from dsi.config.vllm import VllmOptions
from dsi.engine.params import SamplingParams
from dsi.messages import ALL
from dsi.messages.gateway import Generate, TokenChunk
from dsi.messages.handoff import EngineStats, GetEngineStats, Handoff
from dsi.messages.kvstore import GetStats
from dsi.provision.python import NoVllm, vllm_python
from dsi.transport.client import Peer
from dsi.vllm.cores import resolve_cores
from dsi.vllm.wiring import staging_dir
from tests.dsi.cli.procs import (
    REPO_ROOT,
    Procs,
    free_port,
    instances,
    local_config,
    python_module,
    wait_until,
)
from tests.dsi.cli.streams import chat_body, run_streams
from tests.dsi.cli.test_serve_failover import prompt
from tests.roles.cluster import role_addresses
from tests.smollm2 import PROMPTS, chat_ids

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MODEL = "SmolLM2-135M-Instruct"
READY_TIMEOUT_S = 420.0  # four vLLM engines load and profile on two shared cores
MORE_PROMPTS = (
    "What is the largest planet?",
    "Name a mammal that can fly.",
    "How many days are in a week?",
    "What color is a ripe banana?",
    "Spell the word 'apple' backwards.",
    "What is the boiling point of water in Celsius?",
    "Name the author of 'Pride and Prejudice'.",
    "What is 7 times 8?",
)
EXTRA_ROLES = """
[[roles]]
kind = "prefill"
id = "prefill-1"
bind = "tcp://127.0.0.1:7111"
engine = "vllm"
[roles.vllm]
dtype = "float32"
max_model_len = 4096
cpu_threads = "nobind"
args = { enforce_eager = true, max_num_seqs = 16 }

[[roles]]
kind = "decode"
id = "decode-1"
bind = "tcp://127.0.0.1:7121"
engine = "vllm"
[roles.vllm]
dtype = "float32"
max_model_len = 4096
cpu_threads = "nobind"
args = { enforce_eager = true, max_num_seqs = 32 }
"""


RESUMED = r"request \S+ resumed after (?:[2-9]|[1-9]\d+) delivered tokens"
STREAMS = [{**chat_body(prompt(i), 64), "model": MODEL} for i in range(16)]


class Served:
    def __init__(self, config: Path, port: int, procs: Procs, server, model_dir: Path) -> None:
        self.config, self.port, self.procs, self.server, self.model_dir = (
            config,
            port,
            procs,
            server,
            model_dir,
        )
        self.addresses = role_addresses(config)
        self.reference: list[tuple[str, str, list[str]]] = []
        self.prompts: list[list[int]] = []  # the 16 greedy-equality prompts, token ids
        self.plain = None  # the plain vLLM process computing their reference tokens
        self.killed: tuple[str, int] | None = None  # the decode killed by the kill test, its old pid

    @property
    def live(self) -> list[str]:
        """The decodes to send work to: both, but the one killed until its replacement serves."""
        decodes = ["decode-0", "decode-1"]
        if self.killed is not None:
            role_id, old_pid = self.killed
            info = self.table().get(role_id)
            if info is None or info["pid"] == old_pid or info["state"] != "serving":
                decodes.remove(role_id)
        return decodes

    def store_blocks(self) -> int:
        """How many blocks the kvstore holds."""
        return self.ask(GetStats(), "kvstore-0")["kvstore-0"].blocks

    def wait_stored(self, before: int, new: int) -> None:
        """Until the kvstore holds ``new`` blocks more than ``before`` (puts queue in the background)."""
        wait_until(lambda: self.store_blocks() - before >= new, timeout=60, every=0.3)

    def quiet_store_blocks(self, quiet_s: float = 1.5) -> int:
        """The kvstore's block count once it has not changed for ``quiet_s``: the background puts
        of earlier tests' requests have landed, so what is added from here is this test's."""
        count, since = self.store_blocks(), time.monotonic()
        deadline = since + 60
        while time.monotonic() - since < quiet_s:
            assert time.monotonic() < deadline, "the kvstore's block count never settled"
            time.sleep(0.3)
            now = self.store_blocks()
            if now != count:
                count, since = now, time.monotonic()
        return count

    def table(self) -> dict[str, dict]:
        found = instances("--config", str(self.config))
        self.procs.adopt({info["pid"] for info in found.values()})
        return found

    def log(self) -> str:
        return self.server.log_path.read_text(errors="replace")

    def stats(self, *role_ids: str) -> dict[str, EngineStats]:
        """Each role's EngineStats."""
        return self.ask(GetEngineStats(), *role_ids)

    def ask(self, msg, *role_ids: str) -> dict:
        """Each role's answer to ``msg`` (from a thread of its own: callers may be inside an event loop)."""
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self._ask_all(role_ids, msg)).result()

    async def _ask_all(self, role_ids, msg) -> dict:
        ctx = zmq.asyncio.Context()
        try:
            out = {}
            for role_id in role_ids:
                peer = Peer(self.addresses[role_id], ctx, types=ALL, peer_id="test", role="test", timeout=30)
                await peer.connect(timeout=30)
                out[role_id] = await peer.ask(msg, timeout=60)
                await peer.close()
            return out
        finally:
            ctx.destroy(linger=0)

    def handoff(self, decode: str, prefill: str, prompt: list[int], max_tokens: int = 4) -> list[TokenChunk]:
        """The chunks of one request sent to ``decode`` with its prompt prefilled on ``prefill``."""
        req = _greedy(prompt, max_tokens)
        return self._chunks(decode, Handoff(req, self.addresses[prefill], prefill))

    def generate(self, decode: str, prompt: list[int], max_tokens: int = 4) -> list[TokenChunk]:
        """The chunks of one request run colocated (prompt and continuation) on ``decode``."""
        return self._chunks(decode, _greedy(prompt, max_tokens))

    def _chunks(self, decode: str, msg) -> list[TokenChunk]:
        async def run() -> list[TokenChunk]:
            ctx = zmq.asyncio.Context()
            try:
                peer = Peer(self.addresses[decode], ctx, types=ALL, peer_id="test", role="test", timeout=120)
                await peer.connect(timeout=30)
                chunks = [c async for c in peer.stream(msg, timeout=120)]
                await peer.close()
                return chunks
            finally:
                ctx.destroy(linger=0)

        return asyncio.run(run())


def _greedy(prompt: list[int], max_tokens: int) -> Generate:
    return Generate(f"t{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))


def _config(tmp: Path, model_dir: Path) -> Path:
    text = (REPO_ROOT / "configs" / "vllm.toml").read_text()
    text = text.replace(
        '[[roles]]\nkind = "kvstore"', EXTRA_ROLES.strip() + '\n\n[[roles]]\nkind = "kvstore"'
    )
    text = re.sub(r'(?m)^(http = "[^"]+")$', r"\1\nreroute_wait_s = 120.0", text)
    text = re.sub(r"(?m)^dir = .*$", f'dir = "{model_dir}"', text)
    text = re.sub(r"(?m)^gguf = .*$", "", text)
    source = tmp / "vllm-source.toml"
    source.write_text(text)
    return local_config(tmp, source=source, interval_s=0.5)


@pytest.fixture(scope="module")
def vllm_bin() -> Path:
    try:
        return vllm_python(VllmOptions())
    except NoVllm as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_dir, vllm_bin):
    tmp = tmp_path_factory.mktemp("vllm-serve")
    config = _config(tmp, smollm2_dir)
    port = free_port()
    argv = python_module("dsi.cli.main", "serve", "--config", str(config), "--port", str(port),
                         "--ready-timeout", str(READY_TIMEOUT_S))  # fmt: skip
    prompts = [chat_ids(smollm2_dir, q) for q in (*PROMPTS, *MORE_PROMPTS)]
    (tmp / "prompts.json").write_text(json.dumps(prompts))
    with Procs(tmp) as procs:
        # plain vLLM's greedy reference runs while the cluster starts (both mostly wait on imports)
        plain = procs.start("plain-vllm", [str(vllm_bin), "-P", str(Path(__file__).with_name("plain_vllm.py")),
                            "--model", str(smollm2_dir), "--prompts", str(tmp / "prompts.json"), "--max-tokens", "16"],
                            env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_STREAM": "ext://sys.stderr",
                                 "VLLM_CPU_OMP_THREADS_BIND": resolve_cores("@0", os.sched_getaffinity(0)),
                                 # its engine in this one process: two fewer vLLM imports; one
                                 # thread, as each role's worker (bound to its one core) runs
                                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
                                 # vLLM's own subprocesses (its model inspection) must not find
                                 # the checkout's folders by their bare names either
                                 "PYTHONSAFEPATH": "1"})  # fmt: skip
        server = procs.start("serve", argv)
        try:
            assert server.read_line(timeout=READY_TIMEOUT_S + 30).startswith("dsi serve: gateway")
            cluster = Served(config, port, procs, server, smollm2_dir)
            cluster.prompts, cluster.plain = prompts, plain
            cluster.table()
            yield cluster
            server.signal(signal.SIGTERM)
            server.wait(60)
        finally:
            for role_id, bind in role_addresses(config).items():
                subprocess.run(["rm", "-rf", str(staging_dir(role_id, bind))], check=False)


def test_the_openai_sdk_answer_names_paris(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none", timeout=120)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    assert "Paris" in answer.choices[0].message.content


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's children lists)."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *_descendants(child)]
    return found


def _allowed_cpus(pid: int) -> str:
    """The CPUs the main thread of ``pid`` may run on (``Cpus_allowed_list``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return re.search(r"(?m)^Cpus_allowed_list:\s*(\S+)$", status).group(1)  # type: ignore[union-attr]


def test_a_bound_role_runs_its_model_in_a_bound_worker_an_unbound_one_in_its_engine_core(served):
    """dsi.vllm.service.engine_environment: a bound engine keeps vLLM's executor, whose one worker
    vLLM binds to the role's ``cpu_threads`` (the engine core, scheduling and outputs, stays
    unbound like the role); an unbound one (``"nobind"``) runs its model in the engine core."""
    table = served.table()
    cores = {"prefill-0": "@0", "decode-0": "@1", "prefill-1": "nobind", "decode-1": "nobind"}  # the config's
    everywhere = _allowed_cpus(os.getpid())
    for role_id, spec in cores.items():
        pid = table[role_id]["pid"]
        below = {
            p: Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for p in _descendants(pid)
        }
        # multiprocessing's resource trackers (spawn start method) aside
        titles = {p: c.split()[0] for p, c in below.items() if "resource_tracker" not in c}
        engine = [p for p, t in titles.items() if t == "VLLM::EngineCore"]
        workers = [p for p, t in titles.items() if t.startswith("VLLM::Worker")]
        assert len(engine) == 1 and _allowed_cpus(pid) == _allowed_cpus(engine[0]) == everywhere, role_id
        if spec == "nobind":
            assert len(titles) == 1, (role_id, below)
        else:
            assert len(workers) == 1 and len(titles) == 2, (role_id, below)
            assert _allowed_cpus(workers[0]) == resolve_cores(spec, os.sched_getaffinity(0)), role_id


def _reference(served) -> None:
    if not served.reference:
        streams, _ = run_streams(served.port, STREAMS, timeout_s=300)
        assert all(s.error is None and s.done and s.finish for s in streams), [s.error for s in streams]
        served.reference = [s.outcome for s in streams]


def _busiest(served) -> tuple[str, int]:
    """The decode running the most requests now, and how many."""
    stats = served.stats("decode-0", "decode-1")
    busy = max(stats, key=lambda d: stats[d].running)
    return busy, stats[busy].running


def test_a_killed_vllm_decode_is_restarted_and_its_streams_are_the_undisturbed_ones(served):
    _reference(served)
    pids = {d: served.table()[d]["pid"] for d in ("decode-0", "decode-1")}
    killed: list[str] = []

    def kill() -> None:
        victim, running = _busiest(served)
        assert running > 0
        killed.append(victim)
        os.kill(pids[victim], signal.SIGKILL)

    streams, ran = run_streams(
        served.port,
        STREAMS,
        lambda seen: all(s.deltas >= 2 or s.finish for s in seen),
        kill,
        timeout_s=300,
    )
    assert ran
    assert [s.outcome for s in streams] == served.reference
    assert [s.error for s in streams] == [None] * len(STREAMS)
    assert re.search(rf"on {killed[0]} after [1-9]\d* tokens; retrying elsewhere", served.log())
    assert re.search(RESUMED, served.log())  # continued after what they delivered
    served.killed = (killed[0], pids[killed[0]])
    wait_until(lambda: re.search(rf"{killed[0]}: backoff -> starting \(restart", served.log()), timeout=30)


def test_greedy_tokens_of_16_prompts_are_plain_vllms(served):
    line = served.plain.read_line(timeout=600)  # its one stdout line: the outputs, as JSON
    while not line.startswith("["):
        line = served.plain.read_line(timeout=600)
    expected = json.loads(line)

    decodes = served.live

    def one(i: int) -> list[int]:
        decode, prefill = decodes[i % len(decodes)], f"prefill-{i // 2 % 2}"
        return [
            t for c in served.handoff(decode, prefill, served.prompts[i], max_tokens=16) for t in c.token_ids
        ]

    with ThreadPoolExecutor(4) as pool:  # four at a time: every prefill and decode pair busy
        got = list(pool.map(one, range(len(served.prompts))))
    assert got == expected


def test_the_decode_loads_every_prompt_token_but_the_last(served):
    decode = served.live[0]
    for n in (200, 1000, 3000):
        rng = random.Random(n)
        prompt = [rng.randrange(100, 40_000) for _ in range(n)]
        before = served.stats(decode)
        chunks = served.handoff(decode, "prefill-0", prompt)
        assert chunks[-1].finish == "length" and sum(len(c.token_ids) for c in chunks) == 4
        after = served.stats(decode)
        d0, d1 = before[decode], after[decode]
        assert d1.cached_tokens - d0.cached_tokens == n - 1, f"{n}-token prompt"
        assert d1.computed_prompt_tokens - d0.computed_prompt_tokens == 1
        assert d1.handoffs - d0.handoffs == 1


def test_a_prompt_prefilled_on_one_prefill_is_a_store_hit_on_the_other(served):
    rng = random.Random(7)
    prompt = [rng.randrange(100, 40_000) for _ in range(2_000)]
    decode, stored = served.live[0], served.quiet_store_blocks()
    first = served.handoff(decode, "prefill-0", prompt)
    served.wait_stored(stored, (2_000 - 1) // 128)  # prefill-0 puts its pages in the background
    before = served.stats("prefill-1")["prefill-1"]
    second = served.handoff(decode, "prefill-1", prompt)
    after = served.stats("prefill-1")["prefill-1"]
    loaded = after.cached_tokens - before.cached_tokens
    computed = after.computed_prompt_tokens - before.computed_prompt_tokens
    assert loaded == (2_000 - 1) // 128 * 128
    assert computed <= 128 + 2_000 % 128 and computed == 2_000 - loaded
    assert [t for c in second for t in c.token_ids] == [t for c in first for t in c.token_ids]


def test_a_prompt_vllm_holds_itself_is_not_fetched_from_the_store(served):
    rng = random.Random(13)
    prompt = [rng.randrange(100, 40_000) for _ in range(1_500)]
    decode = served.live[-1]
    first = served.generate(decode, prompt)
    time.sleep(1.0)  # vLLM's KV events reach the role
    before = served.stats(decode)[decode]
    second = served.generate(decode, prompt)
    after = served.stats(decode)[decode]
    full = (1_500 - 1) // 128
    assert after.store_skipped_blocks - before.store_skipped_blocks == full
    assert after.store_fetched_blocks == before.store_fetched_blocks
    assert after.persisted_blocks == before.persisted_blocks  # nothing new to stage or persist
    assert after.local_hit_tokens - before.local_hit_tokens == full * 128
    assert after.computed_prompt_tokens - before.computed_prompt_tokens == 1_500 - full * 128
    assert [t for c in second for t in c.token_ids] == [t for c in first for t in c.token_ids]


def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return float(re.search(rf"(?m)^{name} (\S+)$", text).group(1))  # type: ignore[union-attr]


def test_the_gateway_predicts_hits_on_the_vllm_engines_chain(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none", timeout=120)
    rng = random.Random(17)
    text = " ".join(rng.choice(("red", "green", "blue", "river", "stone", "cloud")) for _ in range(900))
    ask = [{"role": "user", "content": f"{text}\nWhich word came first?"}]
    client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, temperature=0)
    time.sleep(3.0)  # the pages reach the kvstore, the gateway's replica follows
    looked, hit = (
        _metric(served.port, "dsi_prefix_lookup_tokens_total"),
        _metric(served.port, "dsi_prefix_hit_tokens_total"),
    )
    client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, temperature=0)
    n = _metric(served.port, "dsi_prefix_lookup_tokens_total") - looked
    predicted = _metric(served.port, "dsi_prefix_hit_tokens_total") - hit
    assert n > 900 and predicted == (n - 1) // 128 * 128


def test_the_killed_vllm_decode_is_replaced_by_one_that_serves(served):
    assert served.killed is not None, "the kill test killed no decode"
    role_id, old_pid = served.killed
    wait_until(  # the table may not list the id between the old run's end and the new one's start
        lambda: (
            (row := served.table().get(role_id)) is not None
            and row["pid"] != old_pid
            and row["state"] == "serving"
        ),
        timeout=READY_TIMEOUT_S,
        every=1.0,
    )
    assert served.live == ["decode-0", "decode-1"]


def test_colocated_decodes_share_prompt_pages_through_the_store(served):
    rng = random.Random(11)
    prompt = [rng.randrange(100, 40_000) for _ in range(1_500)]
    stored = served.quiet_store_blocks()
    first = served.generate("decode-0", prompt)
    served.wait_stored(stored, (1_500 - 1) // 128)  # decode-0 puts its pages in the background
    before = served.stats("decode-1")["decode-1"]
    second = served.generate("decode-1", prompt)
    after = served.stats("decode-1")["decode-1"]
    loaded = after.cached_tokens - before.cached_tokens
    computed = after.computed_prompt_tokens - before.computed_prompt_tokens
    assert loaded == (1_500 - 1) // 128 * 128
    assert computed == 1_500 - loaded
    assert [t for c in second for t in c.token_ids] == [t for c in first for t in c.token_ids]


def test_a_drained_vllm_decode_hands_its_streams_over_unchanged(served):
    _reference(served)
    before = len(served.log())
    drains: list[tuple[str, Future]] = []
    pool = ThreadPoolExecutor(1)

    def drain() -> None:  # `dsi drain` in a thread: the streams go on while it runs; no grace
        # period, so what the decode runs when the order lands moves, however fast this host is
        busy, running = _busiest(served)
        assert running > 0
        argv = ["drain", busy, "--grace", "0", "--config", str(served.config)]
        drains.append((busy, pool.submit(dsi_main, argv)))

    streams, ran = run_streams(
        served.port, STREAMS, lambda seen: all(s.deltas >= 2 or s.finish for s in seen), drain, timeout_s=300
    )
    assert ran
    drained, done = drains[0]
    assert done.result(timeout=60) == 0
    pool.shutdown()
    assert [s.outcome for s in streams] == served.reference
    assert re.search(rf"{drained}: grace period over; [1-9]\d* requests re-run elsewhere", served.log())
    assert re.search(RESUMED, served.log()[before:])  # the moved streams went on from what they had
    wait_until(lambda: served.table().get(drained, {}).get("state") == "stopped", timeout=30)
