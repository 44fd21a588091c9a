"""Two hosts (network namespaces joined by a veth pair), every role bound on ``0.0.0.0``, CURVE on.

    host A (<net>.1): controller-0, entrypoint-0, prefill-0    one dsi-role process
    host B (<net>.2): decode-0, kvstore-0                      one dsi-role process

Every address a role tells others comes from the address rule (dsi.config.addresses): the
interface toward the controller, on each host. Checked from a client in host A: the instance
table names those addresses; a chat request over HTTP is prefilled on A and decoded on B (the
decode's lease names B's address) and streams what one in-process engine gives; a prefix hit
whose SWA state the decode on B holds is pulled across the hosts and gives the hit-free output;
the gateway's replica of the kvstore's index follows it across the hosts.

Peers without the keys (none, a client key no role admits, a made-up server key; dsi's own
clients and raw sockets, see tests.roles.intruders) get no answer and change nothing, against the
live roles: the data planes of prefill-0 (A) and decode-0 (B) take no chunk and give no byte back
(only a sender with the cluster's keys is answered; a replayed Hello is not), and those engines'
control planes answer no state pull, handoff or stats; the next handoff and state pull between
them then serve the same tokens. The controller (A) answers no drain or heartbeat; the kvstore (B)
answers no put, read, snapshot or stats, its publisher gives such a subscriber no delta, and its
counters and an attacked block's bytes are what they were. Where the config has a key that
encrypts the data plane's tcp links, it is set too.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from dsi.config import DataPlaneConfig
from dsi.transport.keyset import create_key_set
from tests.dsi.cli.procs import SHARED_MODEL_DIR, Procs, python_module
from tests.netns import two_hosts
from tests.roles.cluster import reference_outputs
from tests.roles.intruders import NO_REPLY, WELCOME
from tests.roles.test_disaggregation_http import bodies, deltas, expected_streams

pytestmark = [pytest.mark.netns, pytest.mark.slow]

BS = 128
HTTP_PORT = 8000


def data_plane_encryption() -> str:
    """``[data_plane]`` lines turning on tcp link encryption, where the config has such a key."""
    keys = [
        f.name
        for f in dataclasses.fields(DataPlaneConfig)
        if "encrypt" in f.name and f.type in (bool, "bool")
    ]
    return "\n".join(f"{name} = true" for name in keys)


def node_config(tmp_path, net: str, security: str) -> str:
    controller = f"tcp://{net}.1:7100"
    roles = [
        ("controller", "controller-0", 7100, ""),
        ("entrypoint", "entrypoint-0", 7101, f'http = "0.0.0.0:{HTTP_PORT}"'),
        ("prefill", "prefill-0", 7110, ""),
        ("decode", "decode-0", 7120, ""),
        ("kvstore", "kvstore-0", 7130, f'store_dir = "{tmp_path}/run/kvstore"\npublish_interval_s = 0.3'),
    ]
    entries = "\n".join(
        f'[[roles]]\nkind = "{kind}"\nid = "{role_id}"\nbind = "tcp://0.0.0.0:{port}"\n{extra}\n'
        for kind, role_id, port, extra in roles
    )
    return f"""
[cluster]
name = "two-hosts"
controller = "{controller}"
heartbeat_interval_s = 0.5
heartbeat_timeout_s = 3.0

{security}
[model]
name = "dsi-tiny"
dir = "{SHARED_MODEL_DIR}"
config = "tiny"

[data_plane]
backend = "tcp"
{data_plane_encryption()}

{entries}"""


def plan(net: str) -> dict:
    rng = random.Random(9)
    return {
        "http": f"{net}.1:{HTTP_PORT}",
        "chat": bodies(1, seed=3)[0],
        "first": [rng.randrange(3, 20_000) for _ in range(600)],  # + 48 generated: a state at 640
        "first_max": 48,
        "tail": [21, 22, 23, 24] * 50,  # the second prompt: 848 tokens, an exact hit can end at 640
        "second_max": 20,
    }


def in_namespace(ns: str, module: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *python_module(module, *args)]


def test_wildcard_binds_serve_a_handoff_and_an_swa_state_pull_across_two_hosts(tmp_path):
    keys = create_key_set(tmp_path / "keys")  # as `dsi keys create` does
    with two_hosts("th") as (ns_a, ns_b, net), Procs(tmp_path) as procs:
        config = tmp_path / "node.toml"
        config.write_text(node_config(tmp_path, net, keys.snippet()))
        host_a = procs.start(
            "host-a",
            in_namespace(ns_a, "dsi.cli.role", "--config", str(config), "--role", "controller-0",
                         "--role", "entrypoint-0", "--role", "prefill-0"),
        )  # fmt: skip
        host_b = procs.start(
            "host-b",
            in_namespace(
                ns_b, "dsi.cli.role", "--config", str(config), "--role", "decode-0", "--role", "kvstore-0"
            ),
        )
        steps = plan(net)
        (tmp_path / "plan.json").write_text(json.dumps(steps))
        assert host_a.wait_ready().split() == ["READY", "controller-0", "entrypoint-0", "prefill-0"]
        assert host_b.wait_ready().split() == ["READY", "decode-0", "kvstore-0"]
        client = procs.start(
            "client",
            in_namespace(ns_a, "tests.roles.two_hosts_client", str(config), str(tmp_path / "plan.json")),
        )
        # the references are computed while the client runs
        expected_sse = expected_streams([steps["chat"]])[0]
        expected_first = reference_outputs([steps["first"]], max_tokens=steps["first_max"])[0]
        second = steps["first"] + expected_first + steps["tail"]
        expected_second = reference_outputs([second], max_tokens=steps["second_max"])[0]
        try:
            got = json.loads(client.read_line(timeout=120))
        except (TimeoutError, RuntimeError) as exc:
            raise AssertionError(f"{exc}\nhost A: {host_a.log()}\nhost B: {host_b.log()}") from None

    told = {role_id: (info["host"], info["address"]) for role_id, info in got["instances"].items()}
    assert told == {
        "controller-0": (f"{net}.1", f"tcp://{net}.1:7100"),
        "entrypoint-0": (f"{net}.1", f"tcp://{net}.1:7101"),
        "prefill-0": (f"{net}.1", f"tcp://{net}.1:7110"),
        "decode-0": (f"{net}.2", f"tcp://{net}.2:7120"),
        "kvstore-0": (f"{net}.2", f"tcp://{net}.2:7130"),
    }
    assert got["instances"]["entrypoint-0"]["http"] == f"{net}.1:{HTTP_PORT}"
    assert got["index"]["publish"].startswith(f"tcp://{net}.2:")  # index deltas: B's address too
    # the gateway on A follows the kvstore's index on B (snapshot over RPC, deltas over pub/sub)
    assert got["replica.blocks"] == got["kvstore.before"]["blocks"] >= 5

    status, sse = got["sse"].split("\n", 1)
    assert status == "200" and deltas(sse) == expected_sse  # prefilled on A, decoded on B

    prefill, decode = got["prefill-0.stats"], got["decode-0.stats"]
    assert got["first"] == expected_first
    assert (prefill["states_pulled"], decode["states_served"]) == (1, 1), (prefill, decode)
    assert prefill["cached_tokens"] == 5 * BS and prefill["replay_tokens"] == 0
    assert got["second"] == expected_second  # the exact hit gives the hit-free output
    # chat, first, second
    assert prefill["handoffs"] == 3 and prefill["failed_handoffs"] == 0, (prefill, decode)

    # Each probe waits NO_REPLY_S at most, all of a phase at once: two phases of a few seconds.
    assert sum(got["intruders.seconds"]) < 30, got["intruders.seconds"]
    for role, host in (("prefill-0", f"{net}.1"), ("decode-0", f"{net}.2")):
        check_engine_untouched(got["intruders.engines"][role], host)

    probes = got["intruders.cluster"]
    assert probes.pop("deltas heard, the cluster's keys") >= 1  # the publisher is live
    assert probes == dict.fromkeys(probes, 0) | {k: NO_REPLY for k in probes if "deltas" not in k}
    assert set(got["instances.after"]) == set(got["instances"])  # no intruder-0 either
    assert got["instances.after"]["decode-0"]["state"] == "serving"
    before, after = got["kvstore.before"], got["kvstore.after"]
    assert {k: after[k] for k in STORE} == {k: before[k] for k in STORE}
    assert got["block.after"] == got["block.before"] and got["fresh.matched"] == 0


STORE = ("blocks", "bytes", "puts", "stored", "expired", "evicted", "segments")
ENGINE = ("free_blocks", "free_slots", "running", "leases", "regions", "handoffs", "prefills")
ENGINE_STATES = ("states_kept", "states_pulled", "states_served", "migrated_in", "precopied_pages")


def check_engine_untouched(seen: dict, host: str) -> None:
    """The intruders at one live engine: two probes with the cluster's keys answered (so the
    others reached a live keyed data plane), every other one unanswered, and the engine's memory,
    counters and links as they were, but for the frames it dropped and the two links it admitted."""
    probes, before, after = seen["probes"], seen["before"], seen["after"]
    assert before["data_address"].startswith(f"tcp://{host}:"), before["data_address"]
    assert "unknown or expired transfer id" in probes.pop("push, the cluster's keys")
    assert probes.pop("a hello, then replayed") == [WELCOME, NO_REPLY]
    assert probes == dict.fromkeys(probes, NO_REPLY)
    kept = ENGINE + ENGINE_STATES + ("links_rejected",)
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    assert after["links_accepted"] == before["links_accepted"] + 2
    assert after["links_refused"] >= before["links_refused"] + 8  # what the intruders sent, dropped
