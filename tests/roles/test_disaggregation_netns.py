"""Prefill and decode on two hosts (network namespaces joined by veth), ``tcp`` data plane."""

from __future__ import annotations

import json

import pytest

from tests.dsi.cli.procs import SHARED_MODEL_DIR, Procs, python_module
from tests.netns import two_hosts
from tests.roles.cluster import reference_outputs
from tests.roles.test_disaggregation import prompts

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_prefill_and_decode_on_two_hosts_give_identical_outputs(tmp_path):
    with two_hosts("pd") as (ns_a, ns_b, net), Procs(tmp_path) as procs:
        controller = f"tcp://{net}.1:7100"
        config = tmp_path / "node.toml"
        config.write_text(f"""
[cluster]
name = "netns-pd"
controller = "{controller}"
heartbeat_interval_s = 0.5
heartbeat_timeout_s = 3.0

[security]
insecure = true  # two hosts without keys: allowed only when the file says so

[model]
name = "dsi-tiny"
dir = "{SHARED_MODEL_DIR}"
config = "tiny"

[data_plane]
backend = "tcp"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "{controller}"

[[roles]]
kind = "decode"
id = "decode-0"
bind = "tcp://{net}.1:7120"

[[roles]]
kind = "prefill"
id = "prefill-0"
bind = "tcp://{net}.2:7110"
""")
        started = []
        for ns, role_id in ((ns_a, "controller-0"), (ns_a, "decode-0"), (ns_b, "prefill-0")):
            argv = [
                "ip",
                "netns",
                "exec",
                ns,
                *python_module("dsi.cli.role", "--config", str(config), "--role", role_id),
            ]
            started.append((role_id, procs.start(role_id, argv)))
        for role_id, proc in started:
            assert proc.wait_ready() == f"READY {role_id}"
        batch = prompts(8, seed=5, lo=1, hi=500)
        (tmp_path / "prompts.json").write_text(json.dumps(batch))
        client = procs.start(
            "client",
            [
                "ip",
                "netns",
                "exec",
                ns_a,
                *python_module("tests.roles.disagg_client", controller, str(tmp_path / "prompts.json"), "10"),
            ],
        )
        got = json.loads(client.read_line(timeout=120))
        assert client.wait(30) == 0
        assert got == reference_outputs(batch, max_tokens=10)
