"""Strict TOML configuration: typed, frozen dataclasses; every bad key or value is a ConfigError."""

from dsi.config.addresses import AddressError, RoleAddresses, addresses_of
from dsi.config.errors import ConfigError
from dsi.config.node import NodeConfig, load_config, parse_config
from dsi.config.overrides import with_drain_timeout, with_http_port, with_logging, with_role_subset
from dsi.config.provisioner import KubernetesOptions, ProvisionerConfig
from dsi.config.role_options import (
    BalancerOptions,
    ControllerOptions,
    EncoderOptions,
    EngineOptions,
    EntrypointOptions,
    KvstoreOptions,
    RoleOptions,
)
from dsi.config.roles import RoleConfig, RoleKind
from dsi.config.sections import (
    ClusterConfig,
    DataPlaneConfig,
    KvcacheConfig,
    LoggingConfig,
    ModelConfig,
    SecurityConfig,
)

__all__ = [
    "AddressError",
    "BalancerOptions",
    "ClusterConfig",
    "ConfigError",
    "ControllerOptions",
    "DataPlaneConfig",
    "EncoderOptions",
    "EngineOptions",
    "EntrypointOptions",
    "KubernetesOptions",
    "KvcacheConfig",
    "KvstoreOptions",
    "LoggingConfig",
    "ModelConfig",
    "NodeConfig",
    "ProvisionerConfig",
    "RoleAddresses",
    "RoleConfig",
    "RoleKind",
    "RoleOptions",
    "SecurityConfig",
    "addresses_of",
    "load_config",
    "parse_config",
    "with_drain_timeout",
    "with_http_port",
    "with_logging",
    "with_role_subset",
]
