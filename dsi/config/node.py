"""NodeConfig: everything one host needs to start its roles, loaded from one TOML file."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsi.config.addresses import addresses_of
from dsi.config.autoscale import AutoscaleSection
from dsi.config.errors import ConfigError, Where
from dsi.config.exposure import check_exposure
from dsi.config.provisioner import ProvisionerConfig
from dsi.config.reader import read_table
from dsi.config.roles import RoleConfig, RoleKind, read_roles
from dsi.config.sections import (
    ClusterConfig,
    DataPlaneConfig,
    EngineSection,
    KvcacheConfig,
    LoggingConfig,
    ModelConfig,
    SecurityConfig,
)
from dsi.config.spec import spec


@dataclass(slots=True, frozen=True, kw_only=True)
class NodeConfig:
    """The parsed config of one node; `source` is the absolute path of its file."""

    source: Path = field(metadata=spec(internal=True))
    cluster: ClusterConfig
    security: SecurityConfig = field(default_factory=SecurityConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data_plane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    kvcache: KvcacheConfig = field(default_factory=KvcacheConfig)
    engine: EngineSection = field(default_factory=EngineSection)
    provisioner: ProvisionerConfig = field(default_factory=ProvisionerConfig)
    # None without an [autoscale] section: every instance serves, nothing is started or stopped.
    autoscale: AutoscaleSection | None = field(default=None, metadata=spec(fallback=lambda _: None))
    roles: tuple[RoleConfig, ...] = field(metadata=spec(reader=read_roles))

    def role(self, role_id: str) -> RoleConfig:
        """The role with this id; ConfigError (key ``roles``) when there is none."""
        for role in self.roles:
            if role.id == role_id:
                return role
        known = ", ".join(role.id for role in self.roles)
        raise ConfigError(str(self.source), "roles", f"no role with id {role_id!r}; roles: {known}")

    @property
    def balancer_addresses(self) -> tuple[str, ...]:
        """Where the balancers listen: ``[cluster] balancers``, else this file's balancer roles
        as the address rule tells them (dsi.config.addresses: the roles of one file run on one
        host, so a wildcard bind without ``host`` is told as this host's address); AddressError
        when it finds none."""
        if self.cluster.balancers is not None:
            return self.cluster.balancers
        return tuple(addresses_of(role, self).told(role.bind) for role in self.roles_of("balancer"))

    def roles_of(self, kind: RoleKind) -> tuple[RoleConfig, ...]:
        """The roles of one kind, in file order (possibly none)."""
        return tuple(role for role in self.roles if role.kind == kind)


def parse_config(data: Mapping[str, Any], source: str | os.PathLike[str]) -> NodeConfig:
    """A NodeConfig from an already-parsed TOML document; relative paths start at `source`'s directory.
    A node that reaches other hosts without keys is refused (see dsi.config.exposure)."""
    path = Path(os.path.abspath(source))
    where = Where(file=os.fspath(source), base=path.parent)
    cfg = read_table(NodeConfig, data, where, source=path)
    check_exposure(cfg)
    return cfg


def load_config(path: str | os.PathLike[str]) -> NodeConfig:
    """Read and check a node config file; every problem is a ConfigError naming file and key."""
    file = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(file, "<file>", "no such file") from None
    except OSError as err:
        raise ConfigError(file, "<file>", err.strerror or str(err)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(file, "<toml>", str(err)) from None
    return parse_config(data, path)
