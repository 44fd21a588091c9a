"""How role ids, StatefulSets and pods name each other, and what a pod's status says of its instance.

    role id "decode-3"  <-->  StatefulSet "{prefix}decode"  replica ordinal 3  <-->  pod "{prefix}decode-3"

Pure functions over names and the pod JSON of the Kubernetes API; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, get_args

from dsi.config import RoleKind
from dsi.provision.base import InstanceState

# Every pod of the manifests (deploy/kubernetes/) carries these labels.
NAME_LABEL = "app.kubernetes.io/name"
KIND_LABEL = "app.kubernetes.io/component"
APP_NAME = "dsi"

_ROLE_ID = re.compile(r"(?P<kind>[a-z]+)-(?P<ordinal>0|[1-9][0-9]*)")
_KINDS = frozenset(get_args(RoleKind))
# Container states that no wait mends: the first start has failed.
_HOPELESS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
    }
)


@dataclass(slots=True, frozen=True)
class Replica:
    """One instance as a StatefulSet replica: `statefulset` runs it as pod `pod`."""

    role_id: str
    kind: str
    ordinal: int
    statefulset: str

    @property
    def pod(self) -> str:
        return f"{self.statefulset}-{self.ordinal}"


def replica_of(role_id: str, prefix: str) -> Replica:
    """The replica that runs `role_id` ("KIND-N"); ValueError for any other shape or kind."""
    m = _ROLE_ID.fullmatch(role_id)
    if m is None or m["kind"] not in _KINDS:
        raise ValueError(
            f"{role_id!r} is not a role id a StatefulSet can run: expected KIND-N with KIND one of "
            f"{', '.join(sorted(_KINDS))} and N its replica ordinal"
        )
    return Replica(role_id, m["kind"], int(m["ordinal"]), statefulset_name(prefix, m["kind"]))


def statefulset_name(prefix: str, kind: str) -> str:
    return f"{prefix}{kind}"


@dataclass(slots=True, frozen=True)
class PodView:
    """What a pod's status says: the instance's state, container restarts and last exit status,
    and why the start cannot succeed (None while it still can)."""

    state: InstanceState
    restarts: int = 0
    last_exit: int | None = None
    hopeless: str | None = None


def pod_view(pod: dict[str, Any]) -> PodView:
    """The PodView of one pod object (``GET /api/v1/namespaces/NS/pods/NAME``)."""
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    restarts = sum(int(c.get("restartCount", 0)) for c in containers)
    last_exit = next(
        (
            c["lastState"]["terminated"].get("exitCode")
            for c in containers
            if (c.get("lastState") or {}).get("terminated")
        ),
        None,
    )
    waiting = [(c.get("state") or {}).get("waiting") or {} for c in containers]
    hopeless = next(
        (
            f"{w['reason']}: {w.get('message', '')}".rstrip(": ")
            for w in waiting
            if w.get("reason") in _HOPELESS
        ),
        None,
    )
    if status.get("phase") == "Failed":
        hopeless = f"pod failed: {status.get('reason') or status.get('message') or 'no reason given'}"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        state: InstanceState = "stopping"
    elif ready:
        state = "ready"
    elif any(w.get("reason") == "CrashLoopBackOff" for w in waiting):
        state = "backoff"
    else:
        state = "starting"
    return PodView(state, restarts, last_exit, hopeless)
