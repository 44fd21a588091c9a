"""One ``dsi serve`` cluster, one role killed after another under 16 streams (12 greedy, 4 seeded).

Every stream of a disturbed run must be the one an undisturbed run of the same cluster gave
(the first run here), the killed role must be replaced and listed as serving again by
``dsi status`` within 30 s of the kill, and stopping serve must stop every process it ever
started, the replacements included. The tests share the cluster and run in file order; a
replacement is checked while the next test runs, to keep the module short. At the end the
decodes are stopped (SIGSTOP: only missed heartbeats tell), one, then both at once: serve kills
each one the controller declares dead and replaces it, and the cluster serves again.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dsi.cli.status import ControllerUnreachable, fetch_instances
from tests.dsi.cli.procs import (
    LOCAL_TOML,
    Proc,
    Procs,
    config_ids,
    free_port,
    gone,
    instances,
    local_config,
    python_module,
    wait_until,
)
from tests.dsi.cli.streams import Seen, chat_body, run_streams

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
HEARTBEAT_TIMEOUT_S = 2.0
REROUTE_WAIT_S = 3.0
REPLACED_WITHIN_S = 30.0
WORDS = [
    "river",
    "stone",
    "lamp",
    "orbit",
    "cedar",
    "violet",
    "engine",
    "harbor",
    "quartz",
    "meadow",
    "signal",
]


def prompt(i: int, words: int = 160) -> str:
    """A distinct prompt of a few hundred tokens (more than one 128-token block)."""
    rng = random.Random(i)
    return f"Story {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))


# "exact": a prefix hit never changes the output, so every run is comparable with the first.
BODIES = [chat_body(prompt(i), MAX_TOKENS, hit_policy="exact") for i in range(12)] + [
    chat_body(prompt(100 + i), MAX_TOKENS, temperature=0.8, seed=1000 + i, hit_policy="exact")
    for i in range(4)
]


@dataclass(frozen=True, slots=True)
class Killed:
    role_id: str
    pid: int
    kind: str
    count: int  # instances of `kind` that serve once it is back
    deadline: float  # monotonic seconds


@dataclass
class Served:
    config: Path
    port: int
    server: Proc
    procs: Procs
    pids: set[int] = field(default_factory=set)  # every role pid ever listed
    reference: list[tuple[str, str, list[str]]] = field(default_factory=list)
    killed: list[Killed] = field(default_factory=list)  # not yet seen replaced

    def log(self) -> str:
        """Everything serve and its roles logged so far."""
        return self.server.log_path.read_text(errors="replace")

    def listed(self) -> dict[str, dict]:
        """The instances by id, as ``dsi status --json`` prints them."""
        return self._seen(instances("--config", str(self.config)))

    def table(self) -> dict[str, dict] | None:
        """The same, asked in this process (cheaper to poll); None while the controller is away."""
        address = re.search(r'(?m)^controller = "([^"]+)"', self.config.read_text()).group(1)  # type: ignore[union-attr]
        try:
            infos = asyncio.run(fetch_instances(address, None, 2.0)).instances
        except ControllerUnreachable:
            return None
        return self._seen({i.instance_id: {"pid": i.pid, "state": i.state} for i in infos})

    def _seen(self, table: dict[str, dict]) -> dict[str, dict]:
        fresh = {info["pid"] for info in table.values()} - self.pids
        self.pids |= fresh
        self.procs.adopt(fresh)
        return table

    def pid(self, role_id: str) -> int:
        table = self.table()
        assert table is not None
        return table[role_id]["pid"]

    def killer(self, role_id: str, count: int, sig: signal.Signals = signal.SIGKILL) -> Callable[[], None]:
        """An action that sends `sig` to `role_id` as it runs now (looked up beforehand, so that the
        action itself is instant); it expects a replacement within 30 s (`assert_back`): serve
        replaces a killed process at once, and a stopped one once the controller declares it dead."""
        pid = self.pid(role_id)

        def kill() -> None:
            os.kill(pid, sig)
            self.killed.append(
                Killed(role_id, pid, role_id.rsplit("-", 1)[0], count, time.monotonic() + REPLACED_WITHIN_S)
            )

        return kill

    def busy_killer(
        self, role_id: str, count: int, cpu_s: float = 0.2
    ) -> tuple[Callable[[], None], threading.Thread]:
        """An action that kills `role_id` (as ``killer``) once it has used `cpu_s` more CPU seconds
        than when the action ran: mid-way through the work the streams just gave it, whatever the
        machine's speed. The action returns at once; the thread it starts does the waiting."""
        kill = self.killer(role_id, count)
        pid = self.pid(role_id)

        def cpu() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        start = cpu()

        def watch() -> None:
            deadline = time.monotonic() + 60
            while cpu() - start < cpu_s and time.monotonic() < deadline:
                time.sleep(0.005)
            kill()

        thread = threading.Thread(target=watch, daemon=True)
        return thread.start, thread

    def assert_back(self) -> dict:
        """Wait until every killed role serves under a new pid with its kind at full count; then
        ``dsi status`` must show it so. The table."""
        for k in self.killed:
            wait_until(
                lambda k=k: _back(k, self.table()), timeout=max(0.0, k.deadline - time.monotonic()), every=0.3
            )
        listed = self.listed()
        for k in self.killed:
            assert _back(k, listed), f"dsi status does not show {k.role_id} back: {listed}"
        self.killed.clear()
        return listed


def _back(k: Killed, table: dict[str, dict] | None) -> bool:
    if table is None:
        return False
    info = table.get(k.role_id)
    fresh = info is not None and info["pid"] != k.pid and info["state"] == "serving"
    return (
        fresh
        and len([i for i, x in table.items() if i.startswith(k.kind) and x["state"] == "serving"]) == k.count
    )


def gateway_decodes(port: int) -> int:
    """The serving decodes the gateway knows of (its /health), 0 while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return json.load(resp).get("instances", 0)
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def processes_of(config: Path) -> set[int]:
    """Every process whose command line names `config`: serve and the roles it started."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and not gone(int(entry)):
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if str(config).encode() in cmdline:
                found.add(int(entry))
    return found


def started_tokens(streams: list[Seen]) -> bool:
    return all(s.deltas >= 1 or s.finish or s.status not in (0, 200) for s in streams)


def assert_undisturbed(served: Served, streams: list[Seen]) -> None:
    for i, seen in enumerate(streams):
        assert seen.error is None and seen.done, f"stream {i}: {seen.error or seen.body}"
        assert seen.outcome == served.reference[i], f"stream {i} differs from the undisturbed run"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-failover")
    # Without the balancer: its short-request band may put every stream on one decode, and each kill
    # here needs streams mid-way on the instance it stops. Kills with a balancer run in the soak.
    # No encoder either: these streams are text only.
    ids = [i for i in config_ids(LOCAL_TOML) if not i.startswith(("balancer", "encoder"))]
    config = local_config(tmp, keep=ids, interval_s=0.5)
    text = re.sub(
        r"(?m)^heartbeat_timeout_s = .*$", f"heartbeat_timeout_s = {HEARTBEAT_TIMEOUT_S}", config.read_text()
    )
    config.write_text(re.sub(r'(?m)^(http = "[^"]+")$', rf"\1\nreroute_wait_s = {REROUTE_WAIT_S}", text))
    port = free_port()
    with Procs(tmp) as procs:
        server = procs.start(
            "serve", python_module("dsi.cli.main", "serve", "--config", str(config), "--port", str(port))
        )
        assert server.read_line().startswith("dsi serve: gateway")
        cluster = Served(config, port, server, procs)
        cluster.listed()
        streams, _ = run_streams(port, BODIES)
        assert all(s.error is None and s.done and s.finish for s in streams)
        cluster.reference = [s.outcome for s in streams]
        assert len({r[0] + r[1] for r in cluster.reference}) == len(
            BODIES
        )  # distinct prompts, distinct answers
        yield cluster


def test_a_killed_decode_is_replaced_and_its_greedy_and_seeded_streams_are_the_undisturbed_ones(served):
    streams, killed = run_streams(served.port, BODIES, started_tokens, served.killer("decode-1", 2))
    assert killed
    assert_undisturbed(served, streams)
    reruns = re.findall(r"peer_lost on decode-1 after (\d+) tokens", served.log())
    assert any(int(n) > 0 for n in reruns), "no stream was mid-way on decode-1"


def test_a_killed_prefill_has_its_requests_rerouted_to_the_other(served):
    # Long prompts new to the store (BODIES hit it by now, and their short prefills are over in a
    # moment), and the kill once prefill-0 computes: it holds some of them then.
    long = [chat_body(prompt(300 + i, 1000), MAX_TOKENS, hit_policy="exact") for i in range(8)]
    start_watch, watch = served.busy_killer("prefill-0", 2)
    streams, started = run_streams(served.port, long, lambda s: True, start_watch)
    watch.join(timeout=60)
    assert started and served.killed and served.killed[-1].role_id == "prefill-0"
    assert all(s.error is None and s.done for s in streams), [s.error or s.body for s in streams]
    assert "prefill_lost on prefill-0" in served.log()  # some were in it, and went to prefill-1
    served.assert_back()
    again, _ = run_streams(served.port, long)  # undisturbed (exact hits: the hit-free tokens)
    assert [s.outcome for s in streams] == [s.outcome for s in again]


def test_a_killed_kvstore_turns_hits_into_misses_and_fails_nothing(served):
    hot = chat_body(prompt(200, 300), 4)
    run_streams(served.port, [hot])  # its pages reach the store
    wait_until(lambda: run_streams(served.port, [hot])[0][0].cached_tokens, timeout=10)
    served.killer("kvstore-0", 1)()
    (miss,), _ = run_streams(served.port, [hot])
    assert miss.done and miss.error is None and miss.cached_tokens == 0
    streams, _ = run_streams(served.port, BODIES)
    assert_undisturbed(served, streams)


def test_a_killed_controller_leaves_the_streams_alone_and_its_replacement_rebuilds_the_table(served):
    before = served.assert_back()  # the decode, prefill and kvstore killed above are back
    streams, killed = run_streams(served.port, BODIES, started_tokens, served.killer("controller-0", 1))
    assert killed
    assert_undisturbed(served, streams)
    served.assert_back()
    # every other instance re-registers with the new controller within a heartbeat or two
    wait_until(
        lambda: (
            (t := served.table()) is not None
            and sorted(t) == sorted(before)
            and {x["state"] for x in t.values()} == {"serving"}
        ),
        timeout=10,
    )
    after = served.listed()
    assert sorted(after) == sorted(before)
    assert {i: x["pid"] for i, x in after.items() if i != "controller-0"} == {
        i: x["pid"] for i, x in before.items() if i != "controller-0"
    }
    assert {x["state"] for x in after.values()} == {"serving"}


def test_a_silent_decode_is_declared_dead_killed_and_replaced_and_its_streams_are_the_undisturbed_ones(
    served,
):
    before = len(re.findall(r"peer_lost on decode-0 after [1-9]", served.log()))
    pid = served.pid("decode-0")
    stop = served.killer("decode-0", 2, signal.SIGSTOP)  # alive, connected, but silent
    streams, stopped = run_streams(served.port, BODIES, started_tokens, stop)
    assert stopped
    assert_undisturbed(served, streams)
    after = len(re.findall(r"peer_lost on decode-0 after [1-9]", served.log()))
    assert after > before, "no stream was mid-way on decode-0"
    served.assert_back()  # nothing but serve kills it: the controller declared it dead
    assert gone(pid)
    assert f"decode-0: killing pid {pid} (the controller declared it dead" in served.log()
    streams, _ = run_streams(served.port, BODIES)
    assert_undisturbed(served, streams)


def test_with_every_decode_silent_the_streams_end_cleanly_and_serve_replaces_them(served):
    stops = [served.killer(role, 2, signal.SIGSTOP) for role in ("decode-0", "decode-1")]
    stop_at: list[float] = []

    def stop_both() -> None:
        for stop in stops:
            stop()
        stop_at.append(time.monotonic())

    streams, _ = run_streams(served.port, BODIES, started_tokens, stop_both)
    assert stop_at
    for i, seen in enumerate(streams):
        if seen.error is None:  # it finished first, or its re-run found a replacement in time
            assert seen.done and seen.outcome == served.reference[i]
        else:  # the tokens it had, then the error event: no [DONE], no finish, no splice
            assert "no_instance" in seen.error and not seen.done and not seen.finish
            assert served.reference[i][0].startswith(seen.outcome[0])
            # dead after HEARTBEAT_TIMEOUT_S, seen by the gateway's next refresh (1 s), then
            # REROUTE_WAIT_S without a decode (a re-run that found a replacement runs longer)
            assert seen.ended_at - stop_at[0] < HEARTBEAT_TIMEOUT_S + 1.0 + REROUTE_WAIT_S + 5.0
    served.assert_back()  # serve killed both and replaced them
    wait_until(lambda: gateway_decodes(served.port) == 2, timeout=5)  # its next refresh
    streams, _ = run_streams(served.port, BODIES)
    assert_undisturbed(served, streams)


def test_stopping_serve_stops_every_process_it_started_replacements_included(served):
    running = processes_of(served.config)
    assert served.server.pid in running and len(running) >= 6  # serve, and the roles not killed last
    served.procs.adopt(running)
    served.server.signal(signal.SIGINT)
    assert served.server.wait(60) == 0
    # decode-1, prefill-0, kvstore-0, controller-0 and decode-0 were replaced, then both decodes again
    assert len(served.pids) >= 7 + 7
    wait_until(lambda: all(gone(pid) for pid in served.pids | running), timeout=10)
    assert processes_of(served.config) == set()  # the replacements that were starting, too
