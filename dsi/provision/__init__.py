"""Provisioners start, replace and stop role instances. ``local`` runs them as processes on this
host (``dsi serve``); ``kubernetes`` scales one StatefulSet per role kind (deploy/kubernetes/).
``make_provisioner`` builds the one a node config's [provisioner] section names."""

from dsi.provision.backoff import RestartBackoff, RestartPolicy
from dsi.provision.base import InstanceState, ProvisionedInstance, Provisioner, StartFailed
from dsi.provision.factory import make_provisioner
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

__all__ = [
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
    "StartFailed",
    "StopTimedOut",
    "make_provisioner",
]
