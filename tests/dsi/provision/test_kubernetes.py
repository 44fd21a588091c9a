"""KubernetesProvisioner against FakeKube (tests/dsi/provision/kube_fake.py): the exact API calls,
in order, for starts, stops, conflicts, server errors and refusals. Not a real cluster."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from dsi.provision import (
    KubeApi,
    KubeAuth,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubernetesProvisioner,
    KubeUnavailable,
    OrdinalOrder,
    StartFailed,
)
from dsi.provision.kube_api import RetryPolicy
from tests.dsi.provision.kube_fake import FakeKube

DECODE = "/apis/apps/v1/namespaces/dsi/statefulsets/dsi-decode/scale"
PREFILL = "/apis/apps/v1/namespaces/dsi/statefulsets/dsi-prefill/scale"
PODS = "/api/v1/namespaces/dsi/pods"
LIST = f"{PODS}?labelSelector=app.kubernetes.io/name%3Ddsi"
pytestmark = pytest.mark.timeout(30)
FAST = RetryPolicy(attempts=3, initial_s=0.01, timeout_s=2.0)


def scale_body(name: str, version: int, replicas: int) -> dict:
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": name, "namespace": "dsi", "resourceVersion": str(version)},
        "spec": {"replicas": replicas},
    }


@contextlib.asynccontextmanager
async def kube(fake: FakeKube, **kwargs) -> AsyncIterator[KubernetesProvisioner]:
    await fake.start()
    api = KubeApi(KubeAuth(fake.url, token="t0ken"), FAST)
    options = {"ready_timeout_s": 2.0, "stop_timeout_s": 2.0, "poll_interval_s": 0.01, **kwargs}
    prov = KubernetesProvisioner(api, **options)
    try:
        yield prov
    finally:
        await prov.close()
        await fake.stop()


def calls(fake: FakeKube) -> list[tuple[str, str]]:
    """The calls but the refresher's pod lists."""
    return [c for c in fake.seen() if c[1] != LIST]


async def test_start_scales_up_by_one_and_waits_until_the_pod_is_ready():
    fake = FakeKube(replicas={"dsi-decode": 0}, ready_after=2)
    async with kube(fake) as prov:
        inst = await prov.start("decode-0")
        assert fake.seen() == [
            ("GET", DECODE),
            ("PUT", DECODE),
            ("GET", f"{PODS}/dsi-decode-0"),
            ("GET", f"{PODS}/dsi-decode-0"),
            ("GET", f"{PODS}/dsi-decode-0"),
        ]
        assert fake.calls[1].body == scale_body("dsi-decode", 1, 1)
        assert set(fake.tokens) == {"Bearer t0ken"}
        assert (inst.role_id, inst.state, inst.pid) == ("decode-0", "ready", None)
        assert prov.list() == [inst]


async def test_start_of_a_replica_the_statefulset_runs_only_waits_for_it():
    fake = FakeKube(replicas={"dsi-decode": 2})
    async with kube(fake) as prov:
        assert (await prov.start("decode-1")).state == "ready"
        assert fake.seen() == [("GET", DECODE), ("GET", f"{PODS}/dsi-decode-1")]


async def test_start_past_the_next_ordinal_is_refused_and_changes_nothing():
    fake = FakeKube(replicas={"dsi-decode": 1})
    async with kube(fake) as prov:
        with pytest.raises(OrdinalOrder, match="the next one it can start is decode-1"):
            await prov.start("decode-3")
        assert fake.seen() == [("GET", DECODE)]
        assert prov.list() == [] and fake.replicas == {"dsi-decode": 1}
        with pytest.raises(ValueError, match="not a role id a StatefulSet can run"):
            await prov.start("decode-03")


async def test_a_conflict_reads_the_scale_again_and_writes_the_new_version():
    fake = FakeKube(replicas={"dsi-decode": 0}, ready_after=0)
    fake.fail("PUT", DECODE, 409)
    async with kube(fake) as prov:
        await prov.start("decode-0")
        assert fake.seen() == [
            ("GET", DECODE),
            ("PUT", DECODE),
            ("GET", DECODE),
            ("PUT", DECODE),
            ("GET", f"{PODS}/dsi-decode-0"),
        ]
        assert fake.calls[3].body == scale_body("dsi-decode", 1, 1)
        assert fake.replicas == {"dsi-decode": 1}


async def test_server_errors_are_retried_then_given_up():
    fake = FakeKube(replicas={"dsi-decode": 0, "dsi-prefill": 0}, ready_after=0)
    fake.fail("GET", DECODE, 500, 503)
    fake.fail("GET", PREFILL, 500, 502, 504)
    async with kube(fake) as prov:
        assert (await prov.start("decode-0")).state == "ready"
        assert calls(fake)[:4] == [("GET", DECODE)] * 3 + [("PUT", DECODE)]
        with pytest.raises(KubeUnavailable, match=r"504 injected 504 \(gave up after 3 attempts\)"):
            await prov.start("prefill-0")
        assert calls(fake)[5:] == [("GET", PREFILL)] * 3
        assert [inst.role_id for inst in prov.list()] == ["decode-0"]


async def test_forbidden_and_not_found_are_typed_and_not_retried():
    fake = FakeKube(replicas={"dsi-decode": 0})
    fake.fail("GET", DECODE, 403)
    async with kube(fake) as prov:
        with pytest.raises(KubeForbidden, match=f"GET {DECODE}: 403 injected 403") as err:
            await prov.start("decode-0")
        assert err.value.status == 403
        with pytest.raises(KubeNotFound, match="no StatefulSet dsi-prefill in namespace dsi"):
            await prov.start("prefill-0")
        assert fake.seen() == [("GET", DECODE), ("GET", PREFILL)]


async def test_no_answer_is_unavailable_after_the_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before it is called
    api = KubeApi(KubeAuth(f"http://127.0.0.1:{port}"), FAST)
    try:
        with pytest.raises(KubeUnavailable, match=r"no answer from .* \(gave up after 3 attempts\)") as err:
            await api.request("GET", DECODE)
        assert err.value.status == 0
    finally:
        await api.close()


async def test_stop_takes_only_the_highest_ordinal_and_waits_until_its_pod_is_gone():
    fake = FakeKube(replicas={"dsi-decode": 0}, ready_after=0, gone_after=2)
    seen = []
    async with kube(fake, on_change=seen.append) as prov:
        await prov.start("decode-0")
        await prov.start("decode-1")
        del fake.calls[:]
        with pytest.raises(OrdinalOrder, match="stop decode-1 before decode-0"):
            await prov.stop("decode-0")
        assert calls(fake) == [("GET", DECODE)]
        await prov.stop("decode-1")
        assert calls(fake)[1:] == [
            ("GET", DECODE),
            ("PUT", DECODE),
            ("GET", f"{PODS}/dsi-decode-1"),
            ("GET", f"{PODS}/dsi-decode-1"),
            ("GET", f"{PODS}/dsi-decode-1"),
        ]
        put = next(c for c in fake.calls if c.method == "PUT")
        assert put.body == scale_body("dsi-decode", 3, 1)
        assert [(i.role_id, i.state) for i in prov.list()] == [("decode-0", "ready"), ("decode-1", "stopped")]
        assert [i.state for i in seen if i.role_id == "decode-1"] == [
            "starting",
            "ready",
            "stopping",
            "stopped",
        ]


async def test_a_pod_not_ready_in_time_or_crash_looping_fails_the_start():
    fake = FakeKube(replicas={"dsi-decode": 0, "dsi-prefill": 0}, ready_after=10**6)
    async with kube(fake, ready_timeout_s=0.05) as prov:
        with pytest.raises(StartFailed, match=r"dsi-decode-0 was not Ready within 0\.05s"):
            await prov.start("decode-0")
        fake.new_pod_waiting = "CrashLoopBackOff"
        with pytest.raises(StartFailed, match="dsi-prefill-0 cannot start: CrashLoopBackOff: back-off 10s"):
            await prov.start("prefill-0")
        assert [(i.role_id, i.state) for i in prov.list()] == [
            ("decode-0", "failed"),
            ("prefill-0", "failed"),
        ]
        assert fake.replicas == {"dsi-decode": 1, "dsi-prefill": 1}  # until stop()


async def test_the_refresher_updates_the_list_from_the_pods():
    fake = FakeKube(replicas={"dsi-decode": 0}, ready_after=0)
    async with kube(fake) as prov:
        await prov.start("decode-0")
        pod = fake.pods["dsi-decode-0"]
        pod.restarts, pod.waiting = 2, "CrashLoopBackOff"
        for _ in range(200):
            if prov.list()[0].state == "backoff":
                break
            await asyncio.sleep(0.01)
        assert prov.list()[0].state == "backoff"
        assert (prov.list()[0].restarts, prov.list()[0].last_exit) == (2, 1)
        assert ("GET", LIST) in fake.seen()


async def test_close_stops_every_instance_in_reverse_start_order():
    fake = FakeKube(replicas={"dsi-decode": 0, "dsi-prefill": 0}, ready_after=0, gone_after=0)
    async with kube(fake) as prov:
        for role_id in ("decode-0", "prefill-0", "decode-1"):
            await prov.start(role_id)
        del fake.calls[:]
    puts = [(c.path, c.body["spec"]["replicas"]) for c in fake.calls if c.method == "PUT"]
    assert puts == [(DECODE, 1), (PREFILL, 0), (DECODE, 0)]
    assert fake.replicas == {"dsi-decode": 0, "dsi-prefill": 0}
    assert {i.state for i in prov.list()} == {"stopped"}


async def test_the_service_account_token_is_read_before_every_call(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("first\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    auth = KubeAuth.in_cluster(token_file=token)
    assert (auth.base_url, auth.token_file) == ("https://10.96.0.1:443", token)
    fake = await FakeKube(replicas={"dsi-decode": 0}).start()
    api = KubeApi(KubeAuth(fake.url, token_file=token), FAST)
    try:
        await api.request("GET", DECODE)
        token.write_text("rotated\n")
        await api.request("GET", DECODE)
        assert fake.tokens == ["Bearer first", "Bearer rotated"]
    finally:
        await api.close()
        await fake.stop()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(KubeError, match="KUBERNETES_SERVICE_HOST/PORT are unset"):
        KubeAuth.in_cluster()


async def test_a_second_start_of_the_same_instance_is_refused():
    fake = FakeKube(replicas={"dsi-decode": 0}, ready_after=3)
    async with kube(fake) as prov:
        first = asyncio.ensure_future(prov.start("decode-0"))
        await asyncio.sleep(0)  # the first start has claimed decode-0
        with pytest.raises(ValueError, match="decode-0 is already provisioned"):
            await prov.start("decode-0")
        assert (await first).state == "ready"
        with pytest.raises(ValueError, match=r"decode-0 is already provisioned \(ready\)"):
            await prov.start("decode-0")
        assert [c for c in fake.seen() if c[0] == "PUT"] == [("PUT", DECODE)]


async def test_a_stop_during_the_wait_for_ready_ends_the_start():
    fake = FakeKube(replicas={"dsi-decode": 0}, ready_after=10**6, gone_after=0)
    async with kube(fake) as prov:
        starting = asyncio.ensure_future(prov.start("decode-0"))
        while ("PUT", DECODE) not in fake.seen():
            await asyncio.sleep(0.01)
        await prov.stop("decode-0")
        inst = await asyncio.wait_for(starting, 1.0)  # not the 2 s ready timeout
        # start's answer is the instance when its wait ended: stopping, or already stopped
        assert inst.state in ("stopping", "stopped")
        assert [(i.role_id, i.state) for i in prov.list()] == [("decode-0", "stopped")]
        assert fake.replicas == {"dsi-decode": 0}


async def test_adopt_lists_the_running_pods_and_detach_scales_nothing():
    fake = await FakeKube(replicas={"dsi-decode": 2, "dsi-prefill": 1}, ready_after=0).start()
    fake.pods["dsi-decode-1"].waiting = "CrashLoopBackOff"
    fake.pods["dsi-prefill-0"].polls_to_gone = 3  # being deleted: not adopted
    try:
        prov = KubernetesProvisioner(KubeApi(KubeAuth(fake.url, token="t0ken"), FAST), poll_interval_s=0.01)
        assert await prov.adopt() == ["decode-0", "decode-1"]
        assert [(i.role_id, i.state) for i in prov.list()] == [("decode-0", "ready"), ("decode-1", "backoff")]
        with pytest.raises(ValueError, match="already provisioned"):
            await prov.start("decode-0")
        await prov.detach()
        assert [c.method for c in fake.calls] == ["GET"] * len(fake.calls)
        assert fake.replicas == {"dsi-decode": 2, "dsi-prefill": 1}
    finally:
        await fake.stop()
