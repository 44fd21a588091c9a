"""Two hosts (network namespaces joined by a veth pair), every role bound on ``0.0.0.0``, CURVE on.

    host A (<net>.1): controller-0, entrypoint-0, prefill-0    one dsi-role process
    host B (<net>.2): decode-0, kvstore-0                      one dsi-role process

Every address a role tells others comes from the address rule (dsi.config.addresses): the
interface toward the controller, on each host. Checked from a client in host A: the instance
table names those addresses; a chat request over HTTP is prefilled on A and decoded on B (the
decode's lease names B's address) and streams what one in-process engine gives; a prefix hit
whose SWA state the decode on B holds is pulled across the hosts and gives the hit-free output;
the gateway's replica of the kvstore's index follows it across the hosts; a caller without keys
gets no answer from the controller (A) or the kvstore (B), and its drain and put change nothing. Where the config has a key that encrypts the data plane's tcp links,
it is set too.
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
        ("kvstore", "kvstore-0", 7130, f'store_dir = "{tmp_path}/run/kvstore"'),
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
    assert prefill["handoffs"] == 3 and prefill["failed_handoffs"] == 0  # chat, first, second

    assert got["unkeyed.drain"] and got["unkeyed.put"] and got["unkeyed.stats"]
    assert got["instances.after"]["decode-0"]["state"] == "serving"
    before, after = got["kvstore.before"], got["kvstore.after"]
    assert (after["blocks"], after["puts"]) == (before["blocks"], before["puts"])
