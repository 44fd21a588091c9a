"""Provisioners start, replace and stop role instances. ``local`` runs them as processes on this
host (``dsi serve``); ``kubernetes`` scales one StatefulSet per role kind (deploy/kubernetes/).
``ScaleFollower`` starts and stops a provisioner's instances for the controller's autoscaling
targets (``reconcile`` decides which). ``make_provisioner`` builds the one a node config's [provisioner] section names."""

from dsi.provision.backoff import RestartBackoff, RestartPolicy
from dsi.provision.base import InstanceState, ProvisionedInstance, Provisioner, StartFailed
from dsi.provision.factory import make_provisioner
from dsi.provision.follow import ScaleFollower
from dsi.provision.kube_api import (
    KubeApi,
    KubeAuth,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeUnavailable,
)
from dsi.provision.kubernetes import KubernetesProvisioner, OrdinalOrder, StopTimedOut
from dsi.provision.local import LocalProvisioner
from dsi.provision.reconcile import Actions, reconcile

__all__ = [
    "Actions",
    "InstanceState",
    "KubeApi",
    "KubeAuth",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeNotFound",
    "KubeUnavailable",
    "KubernetesProvisioner",
    "LocalProvisioner",
    "OrdinalOrder",
    "ProvisionedInstance",
    "Provisioner",
    "RestartBackoff",
    "RestartPolicy",
    "ScaleFollower",
    "StartFailed",
    "StopTimedOut",
    "make_provisioner",
    "reconcile",
]
