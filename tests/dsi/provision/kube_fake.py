"""FakeKube: an aiohttp server on 127.0.0.1 that plays the few Kubernetes API calls a provisioner
makes (StatefulSet scale subresource, pods) and records every call it gets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

NS = "dsi"


@dataclass
class Call:
    method: str
    path: str  # with the query string
    body: Any = None


@dataclass
class FakePod:
    polls_to_ready: int  # GETs of this pod that still answer not Ready
    polls_to_gone: int | None = None  # set once scaled away: GETs that still find it
    restarts: int = 0
    waiting: str | None = None  # a container waiting reason, e.g. CrashLoopBackOff


@dataclass
class FakeKube:
    """`replicas`: the StatefulSets that exist, by name. A new pod answers not Ready for
    `ready_after` GETs, a scaled-away one is found `gone_after` more times."""

    replicas: dict[str, int] = field(default_factory=dict)
    ready_after: int = 1
    gone_after: int = 1
    new_pod_waiting: str | None = None  # the container waiting reason of every new pod
    calls: list[Call] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    # (method, path) -> statuses to answer before the call is played, first one first.
    failures: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    pods: dict[str, FakePod] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeKube:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        for name, n in self.replicas.items():
            self.versions[name] = 1
            for i in range(n):
                self.pods[f"{name}-{i}"] = FakePod(polls_to_ready=0)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def fail(self, method: str, path: str, *statuses: int) -> None:
        self.failures.setdefault((method, path), []).extend(statuses)

    def seen(self) -> list[tuple[str, str]]:
        return [(c.method, c.path) for c in self.calls]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.calls.append(Call(request.method, request.path_qs, body))
        self.tokens.append(request.headers.get("Authorization", ""))
        pending = self.failures.get((request.method, request.path_qs))
        if pending:
            status = pending.pop(0)
            return _status(status, f"injected {status}")
        parts = request.path.strip("/").split("/")
        if parts[:5] == ["apis", "apps", "v1", "namespaces", NS] and parts[5:6] == ["statefulsets"]:
            return self._scale(request.method, parts[6], body)
        if parts[:4] == ["api", "v1", "namespaces", NS] and parts[4:5] == ["pods"]:
            return self._pod(parts[5]) if len(parts) == 6 else self._pod_list()
        return _status(404, f"not played here: {request.method} {request.path}")

    def _scale(self, method: str, name: str, body: Any) -> web.Response:
        if name not in self.replicas:
            return _status(404, f'statefulsets.apps "{name}" not found')
        if method == "PUT":
            if body["metadata"]["resourceVersion"] != str(self.versions[name]):
                return _status(
                    409, "the object has been modified; please apply your changes to the latest version"
                )
            self._resize(name, body["spec"]["replicas"])
        scale = {
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(self.versions[name])},
            "spec": {"replicas": self.replicas[name]},
        }
        return web.json_response(scale)

    def _resize(self, name: str, n: int) -> None:
        for i in range(n, self.replicas[name]):
            self.pods[f"{name}-{i}"].polls_to_gone = self.gone_after
        for i in range(self.replicas[name], n):
            self.pods[f"{name}-{i}"] = FakePod(polls_to_ready=self.ready_after, waiting=self.new_pod_waiting)
        self.replicas[name] = n
        self.versions[name] += 1

    def _pod(self, name: str) -> web.Response:
        pod = self.pods.get(name)
        if pod is None:
            return _status(404, f'pods "{name}" not found')
        if pod.polls_to_gone is not None:
            if pod.polls_to_gone == 0:
                del self.pods[name]
                return _status(404, f'pods "{name}" not found')
            pod.polls_to_gone -= 1
        answer = pod_json(name, pod)
        pod.polls_to_ready = max(0, pod.polls_to_ready - 1)
        return web.json_response(answer)

    def _pod_list(self) -> web.Response:
        return web.json_response({"items": [pod_json(name, pod) for name, pod in self.pods.items()]})


def pod_json(name: str, pod: FakePod) -> dict[str, Any]:
    ready = pod.polls_to_ready == 0 and pod.waiting is None
    state = (
        {"waiting": {"reason": pod.waiting, "message": "back-off 10s"}} if pod.waiting else {"running": {}}
    )
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "dsi"}}
    if pod.polls_to_gone is not None:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "role",
                    "restartCount": pod.restarts,
                    "state": state,
                    "lastState": {"terminated": {"exitCode": 1}} if pod.restarts else {},
                }
            ],
        },
    }


def _status(code: int, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
    return web.Response(status=code, text=json.dumps(body), content_type="application/json")
