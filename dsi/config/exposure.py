"""Secure by default: a node config that reaches beyond its own host needs keys.

A node whose every ZeroMQ address is loopback (127.0.0.0/8, ::1, ``localhost``) or ``ipc://``
talks to no other machine, and nothing but its own host can reach its roles: it runs as
written (``make serve``, configs/local.toml). Any other address carries the cluster's messages
over a network:

    roles[i].bind        a concrete host or a wildcard (0.0.0.0, [::], *: every interface)
    roles[i].host        the name other machines reach the role by
    cluster.controller   cluster.balancers   roles[i].publish (a kvstore's index deltas)

Such a node must have CURVE on (``[security] curve = true``; ``dsi keys create`` makes the keys
and prints the section), or say ``[security] insecure = true``: the network is trusted, and
anyone on it may call every role. The HTTP listener of an entrypoint is not a ZeroMQ address
(its callers present API keys) and does not count.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from dsi.config.errors import ConfigError

if TYPE_CHECKING:  # node.py calls check_exposure
    from dsi.config.node import NodeConfig

_WILDCARDS = ("*", "0.0.0.0", "[::]", "::")


def beyond_host(cfg: NodeConfig) -> list[tuple[str, str]]:
    """(dotted key, address) for each ZeroMQ address of ``cfg`` that is neither loopback nor ipc."""
    found: list[tuple[str, str]] = []

    def note(key: str, endpoint: str) -> None:
        if endpoint and not _local(endpoint):
            found.append((key, endpoint))

    for i, role in enumerate(cfg.roles):
        note(f"roles[{i}].bind", role.bind)
        if role.host:  # unset for a wildcard bind, which is noted already
            note(f"roles[{i}].host", f"tcp://{role.host}:0")
        note(f"roles[{i}].publish", getattr(role.options, "publish", ""))
    note("cluster.controller", cfg.cluster.controller)
    for j, endpoint in enumerate(cfg.cluster.balancers or ()):
        note(f"cluster.balancers[{j}]", endpoint)
    return found


def check_exposure(cfg: NodeConfig) -> None:
    """ConfigError (key ``security``) for a node that reaches beyond its host with neither CURVE
    on nor ``insecure = true``."""
    security = cfg.security
    if security.curve or security.insecure:
        return
    found = beyond_host(cfg)
    if not found:
        return
    key, address = found[0]
    shown = address.removesuffix(":0").removeprefix("tcp://") if key.endswith(".host") else address
    raise ConfigError(
        str(cfg.source),
        "security",
        f'{key} = "{shown}" is reachable from other hosts, and CURVE is off: make keys with '
        "`dsi keys create --out DIR` and add the [security] section it prints, or write "
        "`insecure = true` in [security] to run unauthenticated and unencrypted on a trusted network",
    )


def _local(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint stays on this host (loopback or ipc)."""
    if endpoint.startswith("ipc://"):
        return True
    host = endpoint.removeprefix("tcp://").rpartition(":")[0]
    if host in _WILDCARDS:
        return False
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: another host's, as far as this file says
