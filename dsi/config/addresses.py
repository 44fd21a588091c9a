"""The address rule: where a role listens, and the address it tells others.

One rule for every role and every listener of it: the control plane (its ROUTER), the KV data
plane (the tcp/shm/rdma listener on an ephemeral port; the leases it hands out name the told
host), a kvstore's index-delta publisher, the owner address an engine announces for its SWA
states, the heartbeat's ``host`` and ``address``, an entrypoint's HTTP address.

    roles[i].bind              roles[i].host      listens on    told to others
    tcp://10.0.0.11:7110       (unset)            10.0.0.11     10.0.0.11
    tcp://10.0.0.11:7110       node-11.internal   10.0.0.11     node-11.internal
    tcp://0.0.0.0:7110         node-11.internal   0.0.0.0       node-11.internal
    tcp://0.0.0.0:7110         (unset)            0.0.0.0       the address this host sends from
                                                                toward the controller (a)
    ipc:///run/dsi/p.sock      (unset)            127.0.0.1     127.0.0.1 (data plane: local)

(a) the interface the cluster's traffic takes: the controller is the one address every role
    of the cluster reaches. When no route to the controller is found (its name does not resolve
    here, or it is an ipc:// endpoint), the first non-loopback interface address in interface
    order; when there is none either, the role refuses to start (AddressError, naming ``host``).

An endpoint is told with its host replaced when it is bound where the role binds (the bind host,
or any wildcard); an endpoint bound elsewhere (a kvstore's ``publish`` on another interface) is
told as written.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsi.config.interfaces import HostInterfaces, Interfaces

if TYPE_CHECKING:
    from dsi.config.node import NodeConfig
    from dsi.config.roles import RoleConfig

WILDCARDS = ("*", "0.0.0.0", "[::]")  # bind hosts that listen on every interface


class AddressError(ValueError):
    """No address to tell others for a role bound on every interface; names the ``host`` key."""


@dataclass(frozen=True, slots=True)
class RoleAddresses:
    """``bind_host``: where the role's listeners bind (a wildcard stays one); ``host``: the name
    others reach them by (brackets around an IPv6 address, as in an endpoint)."""

    bind_host: str
    host: str

    def listen(self) -> str:
        """An endpoint for a further listener of the role: the bind host, an ephemeral port."""
        return f"tcp://{self.bind_host}:*"

    def told(self, endpoint: str) -> str:
        """``endpoint`` as others connect to it: bound where the role binds -> the told host."""
        scheme, sep, rest = endpoint.partition("://")
        where, colon, port = rest.rpartition(":")
        if scheme == "tcp" and sep and colon and (where in WILDCARDS or where == self.bind_host):
            return f"tcp://{self.host}:{port}"
        return endpoint

    @property
    def http_host(self) -> str:
        """The told host without IPv6 brackets (an HTTP ``HOST:PORT`` adds its own)."""
        return self.host.strip("[]")


LOOPBACK = RoleAddresses("127.0.0.1", "127.0.0.1")  # a role on 127.0.0.1 (tests, benchmarks)


def role_addresses(
    bind: str, host: str, controller: str, interfaces: Interfaces, role_id: str = "the role"
) -> RoleAddresses:
    """The rule as a pure function of the config and the host's ``interfaces``.

    ``bind``: the role's ``bind`` endpoint; ``host``: its ``host`` key ("" when unset);
    ``controller``: ``[cluster] controller``. Raises AddressError for a wildcard bind when no
    address is found (see the module docstring for the order tried).
    """
    bind_host = _bind_host(bind)
    if host:
        return RoleAddresses(bind_host, host)
    if bind_host not in WILDCARDS:
        return RoleAddresses(bind_host, bind_host)
    found = _toward(controller, interfaces) or _first_beyond_loopback(interfaces.addresses())
    if found is None:
        raise AddressError(
            f"{role_id}: bind {bind!r} listens on every interface, and this host has no address to "
            f"tell others (no route to the controller {controller!r}, no interface beyond loopback): "
            f'set host = "NAME" in its [[roles]] entry (roles[i].host)'
        )
    return RoleAddresses(bind_host, f"[{found}]" if ":" in found else found)


def addresses_of(role: RoleConfig, node: NodeConfig, interfaces: Interfaces | None = None) -> RoleAddresses:
    """The rule for one role of ``node``, on this machine's interfaces unless given."""
    return role_addresses(
        role.bind, role.host, node.cluster.controller, interfaces or HostInterfaces(), role.id
    )


def listens_everywhere(bind: str) -> bool:
    """Whether a ``bind`` endpoint has a wildcard host (every interface)."""
    return _bind_host(bind) in WILDCARDS


def _bind_host(bind: str) -> str:
    if bind.startswith("ipc://"):
        return "127.0.0.1"  # the other listeners of an ipc role stay on this host too
    return bind.removeprefix("tcp://").rpartition(":")[0]


def _toward(controller: str, interfaces: Interfaces) -> str | None:
    if not controller.startswith("tcp://"):
        return None
    where, _, port = controller.removeprefix("tcp://").rpartition(":")
    return interfaces.source_toward(where.strip("[]"), int(port))


def _first_beyond_loopback(addresses: Sequence[str]) -> str | None:
    for text in addresses:
        try:
            if not ipaddress.ip_address(text.split("%")[0]).is_loopback:
                return text
        except ValueError:
            continue
    return None
