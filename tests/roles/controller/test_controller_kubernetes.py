"""The controller with [autoscale] and a kubernetes provisioner, against FakeKube (not a real
cluster): it adopts the running pods, turns a scale target into a StatefulSet scale call, outlives
API errors, and leaves every pod running when it stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dsi.actor import LocalRef
from dsi.cli.main import main
from dsi.config import ClusterConfig, load_config, with_role_subset
from dsi.config.autoscale import AutoscaleRole, AutoscaleSection
from dsi.messages.control import Assignment, GetScale, Heartbeat, ScaleStatus, SetScale
from dsi.provision import KubeApi, KubeAuth, KubernetesProvisioner
from dsi.provision.kube_api import RetryPolicy
from dsi.roles.controller import ControllerActor
from dsi.roles.kinds import make_actor
from tests.dsi.provision.kube_fake import FakeKube

DECODE = "/apis/apps/v1/namespaces/dsi/statefulsets/dsi-decode/scale"
LIST = "/api/v1/namespaces/dsi/pods?labelSelector=app.kubernetes.io/name%3Ddsi"
CLUSTER = ClusterConfig(controller="tcp://127.0.0.1:7100", heartbeat_interval_s=0.02, heartbeat_timeout_s=5.0)
SECTION = AutoscaleSection(interval_s=30.0, decode=AutoscaleRole(max_instances=4, margin=0.0, capacity=2.0))
DECLARED = {"decode": ["decode-0", "decode-1", "decode-2", "decode-3"]}
pytestmark = pytest.mark.timeout(30)


def controller(fake: FakeKube) -> ControllerActor:
    api = KubeApi(KubeAuth(fake.url, token="t0ken"), RetryPolicy(attempts=2, initial_s=0.01, timeout_s=2.0))
    prov = KubernetesProvisioner(api, ready_timeout_s=2.0, stop_timeout_s=2.0, poll_interval_s=0.01)
    return ControllerActor(
        "controller-0", CLUSTER, autoscale=SECTION, clock=lambda: 100.0, provisioner=prov, declared=DECLARED
    )


async def until(check) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    assert check()


def puts(fake: FakeKube) -> list[int]:
    return [c.body["spec"]["replicas"] for c in fake.calls if c.method == "PUT" and c.path == DECODE]


async def test_a_scale_target_becomes_a_statefulset_scale_and_a_restart_keeps_the_pods():
    fake = await FakeKube(replicas={"dsi-decode": 1}, ready_after=1).start()
    fake.fail("GET", LIST, 500, 500)  # the first adoption fails: logged, tried again
    fake.fail("PUT", DECODE, 500, 500)  # the first scale-up fails: logged, tried again
    try:
        actor = controller(fake)
        ref = LocalRef(actor)
        await actor.start()
        try:
            assert actor.follower is not None
            prov = actor.follower.provisioner
            await until(lambda: [i.role_id for i in prov.list()] == ["decode-0"])
            hb = Heartbeat("decode-0", "decode", "127.0.0.1", 42, "tcp://127.0.0.1:7120")
            assert await ref.ask(hb) == Assignment("serving")
            assert puts(fake) == []  # decode-0 was adopted, not started again

            await ref.ask(SetScale("decode", 2))
            actor.scale()
            status = await ref.ask(GetScale())
            assert isinstance(status, ScaleStatus) and status.roles[0].wanted == 2
            await until(lambda: fake.replicas["dsi-decode"] == 2)
            await until(
                lambda: (
                    {(i.role_id, i.state) for i in prov.list()}
                    == {("decode-0", "ready"), ("decode-1", "ready")}
                )
            )
            assert puts(fake) == [2, 2, 2]  # answered 500, 500 (the start failed, next round again), 200
            assert isinstance(await ref.ask(GetScale()), ScaleStatus)  # still serving
        finally:
            await actor.stop()
        assert fake.replicas == {"dsi-decode": 2} and puts(fake) == [2, 2, 2]  # stopping scaled nothing

        again = controller(fake)
        await again.start()
        try:
            assert again.follower is not None
            prov = again.follower.provisioner
            await until(lambda: {i.role_id for i in prov.list()} == {"decode-0", "decode-1"})
            await again.follower.follower.step()  # wanted is 1 again, but a restart stops nothing
            assert puts(fake) == [2, 2, 2] and fake.replicas == {"dsi-decode": 2}
        finally:
            await again.stop()
    finally:
        await fake.stop()


NODE = """\
[cluster]
controller = "tcp://127.0.0.1:7100"

[provisioner]
kind = "kubernetes"
[provisioner.kubernetes]
api_url = "http://127.0.0.1:1"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "tcp://127.0.0.1:7100"

[[roles]]
kind = "decode"
id = "decode-0"
bind = "tcp://127.0.0.1:7120"

[[roles]]
kind = "decode"
id = "decode-1"
bind = "tcp://127.0.0.1:7121"
"""
AUTOSCALE = """
[autoscale]
interval_s = 10.0
[autoscale.decode]
max_instances = 2
capacity = 4.0
"""


def test_the_controller_role_follows_with_the_kubernetes_provisioner_only_with_autoscale(tmp_path: Path):
    (tmp_path / "plain.toml").write_text(NODE)
    (tmp_path / "scaled.toml").write_text(NODE + AUTOSCALE)
    plain = load_config(tmp_path / "plain.toml")
    scaled = with_role_subset(load_config(tmp_path / "scaled.toml"), ["controller-0"])  # as in its pod
    unscaled = make_actor(plain.role("controller-0"), plain)
    assert isinstance(unscaled, ControllerActor) and unscaled.follower is None
    actor = make_actor(scaled.role("controller-0"), scaled)
    assert isinstance(actor, ControllerActor) and actor.follower is not None
    assert actor.follower.follower._declared == {"decode": ["decode-0", "decode-1"]}


def test_dsi_serve_refuses_a_kubernetes_config(tmp_path: Path, capsys):
    (tmp_path / "node.toml").write_text(NODE + AUTOSCALE)
    assert main(["serve", "--config", str(tmp_path / "node.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsi serve: ") and "provisioner.kind: 'kubernetes': dsi serve runs the roles" in err


def test_the_controller_role_refuses_a_scale_past_the_declared_roles(tmp_path: Path):
    (tmp_path / "node.toml").write_text(NODE + AUTOSCALE.replace("max_instances = 2", "max_instances = 3"))
    cfg = load_config(tmp_path / "node.toml")
    with pytest.raises(
        ValueError, match=r"controller-0: .*3 decode instances may run, but the config declares 2"
    ):
        make_actor(cfg.role("controller-0"), cfg)
