"""KubernetesProvisioner: role instances as StatefulSet replicas, one StatefulSet per role kind.

    start("decode-3") --> GET  .../statefulsets/dsi-decode/scale     replicas 3
                      --> PUT  .../statefulsets/dsi-decode/scale     replicas 4 (resourceVersion kept:
                                                                     409 = changed meanwhile, read again)
                      --> GET  /api/v1/namespaces/NS/pods/dsi-decode-3   every poll_interval_s,
                                                                     until its Ready condition is True
    stop("decode-3")  --> GET scale (replicas 4) --> PUT replicas 3 --> GET pod until 404

A StatefulSet adds and removes replicas at the top: `start` takes the next ordinal (or one the
StatefulSet runs already, whose readiness it then waits for) and `stop` the highest; any other
ordinal is an `OrdinalOrder` error and nothing is changed. Kubernetes itself restarts a crashed
container (the backoff state here); a start fails (`StartFailed`) when the pod is not Ready within
`ready_timeout_s` or its container cannot run at all (CrashLoopBackOff, a bad image); the
StatefulSet keeps the replica until `stop`.

`list()` is a cached view (no I/O): the calls above update it, and a refresher task reads the
pods every `poll_interval_s` while an instance is up. `pid` is always None (pods, not processes).
A stop during a start's wait for readiness ends that wait. `close()` keeps the Provisioner
contract: it scales away every instance this provisioner knows, so a process that closes it on
its way out takes those pods with it.

A controller that restarts must neither start the cluster again nor take it down: `adopt()` reads
the dsi pods that exist and lists them as its own (so a later start of one only waits for it), and
`detach()` ends the refresher and the client and leaves every StatefulSet as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from dsi.config import KubernetesOptions
from dsi.provision.base import InstanceState, ProvisionedInstance, StartFailed
from dsi.provision.kube_api import KubeApi, KubeAuth, KubeConflict, KubeError, KubeNotFound
from dsi.provision.kube_pods import APP_NAME, NAME_LABEL, PodView, Replica, pod_view, replica_of

log = logging.getLogger(__name__)

_CONFLICT_ATTEMPTS = 5  # reads and writes of one scale before a 409 is given up


class OrdinalOrder(ValueError):
    """A start or stop that a StatefulSet cannot do: it adds and removes only the top ordinal."""


class StopTimedOut(Exception):
    """A pod still existed `stop_timeout_s` after its replica was scaled away."""


@dataclass(slots=True)
class _Slot:
    replica: Replica
    state: InstanceState = "stopped"
    restarts: int = 0
    last_exit: int | None = None
    busy: bool = False  # a start or stop owns the state; the refresher leaves it alone

    def snapshot(self) -> ProvisionedInstance:
        return ProvisionedInstance(self.replica.role_id, self.state, None, self.restarts, self.last_exit)


class KubernetesProvisioner:
    """Scales the StatefulSets `{prefix}{kind}` of `namespace` through `api`.

    ready_timeout_s: seconds a started pod gets to become Ready.
    stop_timeout_s: seconds a scaled-away pod gets to disappear.
    poll_interval_s: seconds between two reads of a pod, and between two refreshes of list().
    on_change: called with the instance after every transition.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str = "dsi",
        prefix: str = "dsi-",
        ready_timeout_s: float = 600.0,
        stop_timeout_s: float = 120.0,
        poll_interval_s: float = 2.0,
        on_change: Callable[[ProvisionedInstance], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(ready_timeout_s, stop_timeout_s, poll_interval_s) <= 0:
            raise ValueError("ready_timeout_s, stop_timeout_s and poll_interval_s must be > 0")
        self.api = api
        self.namespace = namespace
        self.prefix = prefix
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._poll_s = poll_interval_s
        self._on_change = on_change
        self._clock = clock
        self._slots: dict[str, _Slot] = {}  # in start order
        self._locks: dict[str, asyncio.Lock] = {}  # one per StatefulSet: scale changes in turn
        self._scaling: set[str] = set()  # role ids whose start is changing a scale now
        self._refresher: asyncio.Task | None = None

    @classmethod
    def from_options(
        cls, opts: KubernetesOptions, on_change: Callable[[ProvisionedInstance], None] | None = None
    ) -> KubernetesProvisioner:
        """A provisioner as [provisioner.kubernetes] describes it (the service account by default)."""
        auth = KubeAuth.in_cluster(opts.api_url, opts.token_file, opts.ca_file)
        return cls(
            KubeApi(auth),
            namespace=opts.namespace,
            prefix=opts.statefulset_prefix,
            ready_timeout_s=opts.ready_timeout_s,
            stop_timeout_s=opts.stop_timeout_s,
            poll_interval_s=opts.poll_interval_s,
            on_change=on_change,
        )

    async def start(self, role_id: str) -> ProvisionedInstance:
        replica = replica_of(role_id, self.prefix)
        old = self._slots.get(role_id)
        if role_id in self._scaling or (old is not None and old.state not in ("stopped", "failed")):
            state = "starting" if role_id in self._scaling else old.state if old else "?"
            raise ValueError(f"{role_id} is already provisioned ({state})")
        slot = _Slot(replica, busy=True)
        self._scaling.add(role_id)
        try:
            async with self._lock(replica.statefulset):
                await self._scale(replica, up=True)  # raises before anything changed
        finally:
            self._scaling.discard(role_id)
        self._slots.pop(role_id, None)
        self._slots[role_id] = slot
        self._move(slot, "starting", f"{replica.statefulset} includes ordinal {replica.ordinal}")
        try:
            await self._wait_ready(slot)
        except (StartFailed, KubeError) as exc:
            self._move(slot, "failed", str(exc))
            raise
        finally:
            slot.busy = False
        self._ensure_refresher()
        return slot.snapshot()

    async def stop(self, role_id: str) -> None:
        slot = self._slots.get(role_id)
        if slot is None:
            raise ValueError(f"{role_id} is not provisioned here")
        if slot.state == "stopped":
            return
        slot.busy = True
        try:
            async with self._lock(slot.replica.statefulset):
                await self._scale(slot.replica, up=False)
            self._move(slot, "stopping", "scaled away")
            await self._wait_gone(slot)
            self._move(slot, "stopped", "")
        finally:
            slot.busy = False

    def list(self) -> list[ProvisionedInstance]:
        return [slot.snapshot() for slot in self._slots.values()]

    async def close(self) -> None:
        """Stop every instance in reverse start order (highest ordinals first), then the client.
        An instance that cannot be stopped is logged and the rest are still stopped; the first
        such error is raised at the end."""
        errors: list[Exception] = []
        try:
            for role_id in reversed(list(self._slots)):
                try:
                    await self.stop(role_id)
                except (KubeError, OrdinalOrder, StopTimedOut) as exc:
                    log.error("%s: cannot stop it: %s", role_id, exc)
                    errors.append(exc)
        finally:
            await self.detach()
        if errors:
            raise errors[0]

    async def detach(self) -> None:
        """Stop watching and close the client; scale nothing (the pods keep running)."""
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None
        await self.api.close()

    async def adopt(self) -> list[str]:
        """List the dsi pods of the namespace that exist now as instances of this provisioner (one
        being deleted is left out); returns their role ids. KubeError when the pods cannot be read."""
        query = urlencode({"labelSelector": f"{NAME_LABEL}={APP_NAME}"})
        answer = await self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?{query}")
        adopted: list[str] = []
        for item in answer.get("items", []):
            name = item["metadata"]["name"]
            view = pod_view(item)
            if not name.startswith(self.prefix) or view.state == "stopping":
                continue
            role_id = name[len(self.prefix) :]
            try:
                replica = replica_of(role_id, self.prefix)
            except ValueError:
                continue  # a dsi pod that no StatefulSet of this prefix runs
            if role_id in self._slots or role_id in self._scaling:
                continue
            slot = self._slots[role_id] = _Slot(replica)
            self._update(slot, view)
            adopted.append(role_id)
        if adopted:
            log.info("adopted the running pods of %s", ", ".join(adopted))
            self._ensure_refresher()
        return adopted

    async def refresh(self) -> None:
        """Read every dsi pod of the namespace once and update the instances no call is changing."""
        query = urlencode({"labelSelector": f"{NAME_LABEL}={APP_NAME}"})
        answer = await self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?{query}")
        pods = {item["metadata"]["name"]: item for item in answer.get("items", [])}
        for slot in list(self._slots.values()):
            if slot.busy or slot.state in ("stopping", "stopped", "failed"):
                continue
            pod = pods.get(slot.replica.pod)
            # A pod that is missing is being recreated by its StatefulSet.
            view = pod_view(pod) if pod is not None else PodView("starting", slot.restarts, slot.last_exit)
            self._update(slot, view)

    # ---- internals ---------------------------------------------------------------------------
    def _scale_path(self, replica: Replica) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets/{replica.statefulset}/scale"

    async def _scale(self, replica: Replica, *, up: bool) -> None:
        """Make the StatefulSet include (`up`) or exclude `replica`; a 409 reads it again."""
        path = self._scale_path(replica)
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                scale = await self.api.request("GET", path)
            except KubeNotFound as exc:
                raise KubeNotFound(
                    exc.status, f"no StatefulSet {replica.statefulset} in namespace {self.namespace}: {exc}"
                ) from None
            replicas = int((scale.get("spec") or {}).get("replicas", 0))
            target = _target(replica, replicas, up)
            if target is None:
                return
            body = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {
                    "name": replica.statefulset,
                    "namespace": self.namespace,
                    "resourceVersion": scale["metadata"]["resourceVersion"],
                },
                "spec": {"replicas": target},
            }
            try:
                await self.api.request("PUT", path, body)
            except KubeConflict as exc:
                log.info(
                    "%s changed while it was being scaled (%s); reading it again", replica.statefulset, exc
                )
                continue
            log.info("%s: replicas %d -> %d", replica.statefulset, replicas, target)
            return
        raise KubeConflict(
            409, f"{replica.statefulset} changed {_CONFLICT_ATTEMPTS} times while it was being scaled"
        )

    async def _wait_ready(self, slot: _Slot) -> None:
        pod, deadline = slot.replica.pod, self._clock() + self._ready_timeout_s
        while slot.state == "starting":  # else stop() has taken over
            with contextlib.suppress(KubeNotFound):  # not created yet
                view = pod_view(
                    await self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{pod}")
                )
                if view.hopeless is not None:
                    self._update(slot, view)
                    raise StartFailed(f"{pod} cannot start: {view.hopeless}")
                if view.state == "ready":
                    self._update(slot, view)
                    return
            if self._clock() >= deadline:
                raise StartFailed(f"{pod} was not Ready within {self._ready_timeout_s:g}s")
            await asyncio.sleep(self._poll_s)

    async def _wait_gone(self, slot: _Slot) -> None:
        pod, deadline = slot.replica.pod, self._clock() + self._stop_timeout_s
        while True:
            try:
                await self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{pod}")
            except KubeNotFound:
                return
            if self._clock() >= deadline:
                raise StopTimedOut(f"{pod} still exists {self._stop_timeout_s:g}s after its scale-down")
            await asyncio.sleep(self._poll_s)

    def _update(self, slot: _Slot, view: PodView) -> None:
        slot.restarts, slot.last_exit = view.restarts, view.last_exit
        if view.state != slot.state:
            self._move(slot, view.state, f"pod {slot.replica.pod}, {view.restarts} container restarts")

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(
                self._refresh_forever(), name="k8s.refresh"
            )

    async def _refresh_forever(self) -> None:
        while any(slot.state not in ("stopped", "failed") for slot in self._slots.values()):
            await asyncio.sleep(self._poll_s)
            try:
                await self.refresh()
            except KubeError as exc:
                log.warning("cannot refresh the instance list: %s", exc)

    def _lock(self, statefulset: str) -> asyncio.Lock:
        return self._locks.setdefault(statefulset, asyncio.Lock())

    def _move(self, slot: _Slot, state: InstanceState, why: str) -> None:
        before, slot.state = slot.state, state
        level = (
            logging.ERROR if state == "failed" else logging.WARNING if state == "backoff" else logging.INFO
        )
        log.log(level, "%s: %s -> %s%s", slot.replica.role_id, before, state, f" ({why})" if why else "")
        if self._on_change is not None:
            self._on_change(slot.snapshot())


def _target(replica: Replica, replicas: int, up: bool) -> int | None:
    """The replica count that includes (`up`) or excludes `replica`, None when it already does.
    OrdinalOrder when only a change of other ordinals could get there."""
    sts, kind, n = replica.statefulset, replica.kind, replica.ordinal
    if up:
        if n < replicas:
            return None
        if n > replicas:
            raise OrdinalOrder(
                f"{replica.role_id}: {sts} has {replicas} replicas, so the next one it can start is "
                f"{kind}-{replicas} (a StatefulSet adds ordinals in order)"
            )
        return replicas + 1
    if n >= replicas:
        return None
    if n != replicas - 1:
        raise OrdinalOrder(
            f"{replica.role_id}: {sts} has {replicas} replicas and removes the highest ordinal first; "
            f"stop {kind}-{replicas - 1} before {replica.role_id}"
        )
    return replicas - 1
