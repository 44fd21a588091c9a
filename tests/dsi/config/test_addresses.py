"""The address rule as a pure function: interfaces are a stand-in, nothing touches the network."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dsi.config import AddressError, ConfigError, RoleAddresses, parse_config, with_role_subset
from dsi.config.addresses import role_addresses
from dsi.config.interfaces import HostInterfaces

CONTROLLER = "tcp://10.0.0.1:7100"


@dataclass
class FakeInterfaces:
    """``routes``: host -> the source address toward it; ``listed``: interface addresses."""

    routes: dict[str, str] = field(default_factory=dict)
    listed: Sequence[str] = ("127.0.0.1",)
    asked: list[tuple[str, int]] = field(default_factory=list)

    def source_toward(self, host: str, port: int) -> str | None:
        self.asked.append((host, port))
        return self.routes.get(host)

    def addresses(self) -> Sequence[str]:
        return self.listed


ROUTED = FakeInterfaces({"10.0.0.1": "10.0.0.12"}, ("127.0.0.1", "192.168.5.5", "10.0.0.12"))


def test_a_concrete_bind_is_told_as_itself_and_the_network_is_not_asked():
    net = FakeInterfaces()
    got = role_addresses("tcp://10.0.0.11:7110", "", CONTROLLER, net)
    assert got == RoleAddresses("10.0.0.11", "10.0.0.11")
    assert got.told("tcp://10.0.0.11:7110") == "tcp://10.0.0.11:7110"
    assert net.asked == []


def test_a_set_host_wins_for_every_listener_bound_where_the_role_binds():
    got = role_addresses("tcp://10.0.0.11:7110", "prefill-0.internal", CONTROLLER, FakeInterfaces())
    assert got == RoleAddresses("10.0.0.11", "prefill-0.internal")
    assert got.told("tcp://10.0.0.11:41234") == "tcp://prefill-0.internal:41234"  # its data plane
    assert got.told("tcp://10.9.9.9:7131") == "tcp://10.9.9.9:7131"  # bound elsewhere: as written
    wild = role_addresses("tcp://0.0.0.0:7110", "prefill-0.internal", CONTROLLER, ROUTED)
    assert wild == RoleAddresses("0.0.0.0", "prefill-0.internal")


def test_a_wildcard_bind_is_told_as_the_address_that_routes_to_the_controller():
    net = FakeInterfaces({"10.0.0.1": "10.0.0.12"}, ("127.0.0.1", "192.168.5.5", "10.0.0.12"))
    got = role_addresses("tcp://0.0.0.0:7110", "", CONTROLLER, net)
    assert got == RoleAddresses("0.0.0.0", "10.0.0.12")  # not the first listed interface
    assert net.asked == [("10.0.0.1", 7100)]
    assert got.listen() == "tcp://0.0.0.0:*"  # the data plane and publisher bind every interface too
    assert got.told("tcp://0.0.0.0:41234") == "tcp://10.0.0.12:41234"
    assert got.told("tcp://*:7110") == "tcp://10.0.0.12:7110"
    assert got.told("ipc:///tmp/x.sock") == "ipc:///tmp/x.sock"


def test_without_a_route_the_first_interface_beyond_loopback_is_told():
    net = FakeInterfaces({}, ("127.0.0.1", "127.0.1.1", "192.168.5.5", "10.0.0.12"))
    assert role_addresses("tcp://*:7110", "", CONTROLLER, net) == RoleAddresses("*", "192.168.5.5")
    ipc_controller = role_addresses("tcp://0.0.0.0:7110", "", "ipc:///run/c.sock", net)
    assert ipc_controller.host == "192.168.5.5"


def test_an_ipv6_route_is_told_in_brackets():
    net = FakeInterfaces({"fd00::1": "fd00::12"})
    got = role_addresses("tcp://[::]:7110", "", "tcp://[fd00::1]:7100", net)
    assert got == RoleAddresses("[::]", "[fd00::12]")
    assert got.told("tcp://[::]:41234") == "tcp://[fd00::12]:41234"
    assert got.http_host == "fd00::12"


def test_no_address_found_refuses_with_the_host_key_named():
    with pytest.raises(AddressError) as caught:
        role_addresses("tcp://0.0.0.0:7110", "", CONTROLLER, FakeInterfaces(), "decode-3")
    text = str(caught.value)
    assert "decode-3" in text and "roles[i].host" in text and "every interface" in text
    assert isinstance(caught.value, ValueError)  # RoleHost turns it into RoleStartError


def test_an_ipc_bind_keeps_its_other_listeners_on_loopback():
    assert role_addresses("ipc:///run/p.sock", "", CONTROLLER, FakeInterfaces()) == RoleAddresses(
        "127.0.0.1", "127.0.0.1"
    )


def test_the_config_leaves_host_unset_for_a_wildcard_bind_only(tmp_path: Path):
    roles = [
        {"kind": "decode", "id": "d0", "bind": "tcp://0.0.0.0:7120"},
        {"kind": "decode", "id": "d1", "bind": "tcp://10.0.0.5:7121"},
    ]
    data = {"cluster": {"controller": CONTROLLER}, "roles": roles, "security": {"insecure": True}}
    cfg = parse_config(data, tmp_path / "node.toml")
    assert [role.host for role in cfg.roles] == ["", "10.0.0.5"]
    empty = [{"kind": "decode", "id": "d1", "bind": "tcp://10.0.0.5:7121", "host": ""}]
    with pytest.raises(ConfigError) as caught:
        parse_config({**data, "roles": empty}, tmp_path / "node.toml")
    assert caught.value.key == "roles[0].host"


def test_a_wildcard_balancer_is_told_by_the_rule_to_the_roles_of_its_file(tmp_path: Path):
    roles = [
        {"kind": "balancer", "id": "b0", "bind": "tcp://0.0.0.0:7150"},
        {"kind": "decode", "id": "d0", "bind": "tcp://127.0.0.1:7120"},
    ]
    data = {"cluster": {"controller": "tcp://127.0.0.1:7100"}, "roles": roles, "security": {"insecure": True}}
    cfg = with_role_subset(parse_config(data, tmp_path / "node.toml"), ["d0"])
    # the route toward a loopback controller leaves from loopback on every machine
    assert cfg.cluster.balancers == ("tcp://127.0.0.1:7150",)


def test_the_host_network_routes_to_loopback_and_lists_it():
    net = HostInterfaces()
    assert net.source_toward("127.0.0.1", 7100) == "127.0.0.1"
    assert "127.0.0.1" in net.addresses()
