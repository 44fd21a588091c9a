"""Copies of a NodeConfig with a command-line override applied (``dsi serve --port``, role subsets,
``dsi-role --drain-timeout`` and ``--log-format`` / ``--log-level``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from dsi.config.addresses import AddressError
from dsi.config.errors import ConfigError
from dsi.config.node import NodeConfig
from dsi.config.role_options import EntrypointOptions
from dsi.config.sections import LoggingConfig


def with_http_port(cfg: NodeConfig, port: int) -> NodeConfig:
    """`cfg` with the HTTP port of its first entrypoint role replaced by `port` (1..65535)."""
    for i, role in enumerate(cfg.roles):
        if isinstance(role.options, EntrypointOptions):
            if type(port) is not int or not 1 <= port <= 65535:
                raise ConfigError(
                    str(cfg.source), f"roles[{i}].http", f"port must be in 1..65535, got {port!r}"
                )
            moved = replace(role, options=replace(role.options, http_port=port))
            return replace(cfg, roles=(*cfg.roles[:i], moved, *cfg.roles[i + 1 :]))
    raise ConfigError(str(cfg.source), "roles", "no entrypoint role whose HTTP port could be set")


def with_drain_timeout(cfg: NodeConfig, seconds: float) -> NodeConfig:
    """`cfg` with every entrypoint role's ``drain_timeout_s`` replaced by `seconds` (0..3600)."""
    if not 0.0 <= seconds <= 3600.0:
        raise ConfigError(str(cfg.source), "roles.drain_timeout_s", f"must be in 0..3600, got {seconds!r}")
    roles = tuple(
        replace(role, options=replace(role.options, drain_timeout_s=float(seconds)))
        if isinstance(role.options, EntrypointOptions)
        else role
        for role in cfg.roles
    )
    return replace(cfg, roles=roles)


def with_logging(cfg: NodeConfig, fmt: str | None = None, level: str | None = None) -> NodeConfig:
    """`cfg` with ``[logging] format`` and ``level`` replaced where given, so that the processes
    a role starts (an entrypoint's HTTP workers) log as it does."""
    logging = LoggingConfig(format=fmt or cfg.logging.format, level=level or cfg.logging.level)  # type: ignore[arg-type]
    return replace(cfg, logging=logging)


def with_role_subset(cfg: NodeConfig, ids: Iterable[str]) -> NodeConfig:
    """`cfg` keeping only the roles named in `ids` (in file order); each id must exist. The
    balancer addresses are still those of the whole file."""
    wanted = set(ids)
    if not wanted:
        raise ConfigError(str(cfg.source), "roles", "an empty role subset runs nothing")
    for role_id in sorted(wanted):
        cfg.role(role_id)  # raises ConfigError naming the unknown id
    # The balancers stay known: the roles kept report to (or ask) those of the whole file.
    try:
        cluster = replace(cfg.cluster, balancers=cfg.balancer_addresses)
    except AddressError as err:
        raise ConfigError(str(cfg.source), "roles", str(err)) from None
    return replace(cfg, cluster=cluster, roles=tuple(role for role in cfg.roles if role.id in wanted))
