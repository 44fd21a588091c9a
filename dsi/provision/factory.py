"""make_provisioner: the provisioner a node config's [provisioner] section names."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from dsi.config import NodeConfig
from dsi.provision.base import ProvisionedInstance, Provisioner
from dsi.provision.kubernetes import KubernetesProvisioner
from dsi.provision.local import LocalProvisioner
from dsi.provision.python import role_python


def make_provisioner(
    cfg: NodeConfig,
    *,
    command: Callable[[str], Sequence[str]] | None = None,
    on_change: Callable[[ProvisionedInstance], None] | None = None,
) -> Provisioner:
    """``local``: one ``dsi-role --config <cfg's file> --role ID`` process per instance (or
    `command(role_id)`); ``kubernetes``: the StatefulSets of [provisioner.kubernetes]."""
    section = cfg.provisioner
    if section.kind == "kubernetes":
        assert section.kubernetes is not None  # the reader fills it for this kind
        return KubernetesProvisioner.from_options(section.kubernetes, on_change=on_change)
    return LocalProvisioner(command or _role_command(cfg), on_change=on_change)


def _role_command(cfg: NodeConfig) -> Callable[[str], list[str]]:
    config = os.path.abspath(cfg.source)

    def command(role_id: str) -> list[str]:
        # -P: not the working directory on sys.path (see dsi.cli.serve.role_command)
        return [role_python(cfg, role_id), "-P", "-m", "dsi.cli.role", "--config", config, "--role", role_id]

    return command
