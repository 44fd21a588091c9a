"""Provisioners start, replace and stop role instances. ``local`` runs them as processes on this
host (``dsi serve``); a kubernetes provisioner is planned. ``ScaleFollower`` starts and stops a
provisioner's instances for the controller's autoscaling targets (``reconcile`` decides which)."""

from dsi.provision.backoff import RestartBackoff, RestartPolicy
from dsi.provision.base import InstanceState, ProvisionedInstance, Provisioner, StartFailed
from dsi.provision.follow import ScaleFollower
from dsi.provision.local import LocalProvisioner
from dsi.provision.reconcile import Actions, reconcile

__all__ = [
    "Actions",
    "InstanceState",
    "LocalProvisioner",
    "ProvisionedInstance",
    "Provisioner",
    "RestartBackoff",
    "RestartPolicy",
    "ScaleFollower",
    "StartFailed",
    "reconcile",
]
