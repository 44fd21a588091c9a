"""Provisioners start, replace and stop role instances. ``local`` runs them as processes on this
host (``dsi serve``); a kubernetes provisioner is planned."""

from dsi.provision.backoff import RestartBackoff, RestartPolicy
from dsi.provision.base import InstanceState, ProvisionedInstance, Provisioner, StartFailed
from dsi.provision.local import LocalProvisioner

__all__ = [
    "InstanceState",
    "LocalProvisioner",
    "ProvisionedInstance",
    "Provisioner",
    "RestartBackoff",
    "RestartPolicy",
    "StartFailed",
]
