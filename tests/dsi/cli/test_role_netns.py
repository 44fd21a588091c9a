"""Two hosts in network namespaces joined by a veth pair: a controller on one, a prefill on the
other, talking over 10.200.x.0/24 addresses that exist only inside the namespaces."""

import pytest

from tests.dsi.cli.procs import Procs, instances, python_module, wait_until
from tests.netns import two_hosts

pytestmark = pytest.mark.netns


@pytest.fixture
def namespaces():
    """(controller namespace, prefill namespace, subnet prefix); deleted again on teardown."""
    with two_hosts() as hosts:
        yield hosts


@pytest.fixture
def procs(namespaces, tmp_path):
    with Procs(tmp_path) as group:  # stopped before the namespaces are deleted
        yield group


def test_prefill_in_another_namespace_registers_with_the_controller(namespaces, procs, tmp_path):
    ns_controller, ns_prefill, net = namespaces
    controller = f"tcp://{net}.1:7100"
    config = tmp_path / "node.toml"
    config.write_text(f"""
[cluster]
name = "netns"
controller = "{controller}"
heartbeat_interval_s = 0.5
heartbeat_timeout_s = 3.0

[security]
insecure = true  # two hosts without keys: allowed only when the file says so

[[roles]]
kind = "controller"
id = "controller-0"
bind = "{controller}"

[[roles]]
kind = "prefill"
id = "prefill-0"
bind = "tcp://{net}.2:7110"
""")
    for ns, role_id in ((ns_controller, "controller-0"), (ns_prefill, "prefill-0")):
        argv = [
            "ip",
            "netns",
            "exec",
            ns,
            *python_module("dsi.cli.role", "--config", str(config), "--role", role_id),
        ]
        assert procs.start(role_id, argv).wait_ready() == f"READY {role_id}"

    in_controller_ns = ["ip", "netns", "exec", ns_controller]

    def prefill_ready():
        listed = instances("--controller", controller, prefix=in_controller_ns)
        return listed if listed.get("prefill-0", {}).get("state") == "serving" else None

    listed = wait_until(prefill_ready, timeout=30)
    assert listed["prefill-0"]["address"] == f"tcp://{net}.2:7110"
    assert listed["prefill-0"]["host"] == f"{net}.2"
    assert listed["controller-0"]["state"] == "serving"
