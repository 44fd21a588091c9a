"""deploy/kubernetes/: every manifest parses, and the names, labels, ports and permissions agree with
the node config in the ConfigMap and with what KubernetesProvisioner calls. No cluster is involved."""

from __future__ import annotations

import functools
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsi.config import NodeConfig, parse_config, with_role_subset
from dsi.provision.kube_pods import APP_NAME, KIND_LABEL, NAME_LABEL, replica_of, statefulset_name

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
KINDS = ("controller", "entrypoint", "prefill", "decode", "kvstore")


@functools.cache  # read once per run: the files do not change under the tests
def objects() -> tuple[dict[str, Any], ...]:
    found: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return tuple(found)


def named(kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects() if obj["kind"] == kind}


def node_toml() -> str:
    return named("ConfigMap")["dsi-node"]["data"]["node.toml"]


def node_config() -> NodeConfig:
    return parse_config(tomllib.loads(node_toml()), "/etc/dsi/node.toml")


def container(sts: dict[str, Any]) -> dict[str, Any]:
    (only,) = sts["spec"]["template"]["spec"]["containers"]
    return only


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert {
        obj["metadata"].get("namespace", kustomization["namespace"])
        for obj in objects()
        if obj["kind"] != "Namespace"
    } == {kustomization["namespace"]}


def test_one_statefulset_per_role_kind_named_and_labelled_as_the_provisioner_expects():
    cfg = node_config()
    assert cfg.provisioner.kind == "kubernetes" and cfg.provisioner.kubernetes is not None
    opts = cfg.provisioner.kubernetes
    sets = named("StatefulSet")
    assert set(sets) == {statefulset_name(opts.statefulset_prefix, kind) for kind in KINDS}
    services = named("Service")
    for kind in KINDS:
        sts = sets[statefulset_name(opts.statefulset_prefix, kind)]
        assert sts["metadata"]["namespace"] == opts.namespace
        want = {NAME_LABEL: APP_NAME, KIND_LABEL: kind}
        assert sts["spec"]["selector"]["matchLabels"] == want
        assert sts["spec"]["template"]["metadata"]["labels"] == want
        assert sts["spec"]["podManagementPolicy"] == "Parallel"  # a scale-up never waits on another pod
        headless = services[sts["spec"]["serviceName"]]
        assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == want
        # Each replica the StatefulSet may run has its role in the node config, under the same port.
        roles = cfg.roles_of(kind)
        assert 1 <= sts["spec"]["replicas"] <= len(roles)
        for ordinal, role in enumerate(roles):
            assert replica_of(role.id, opts.statefulset_prefix).pod == f"{sts['metadata']['name']}-{ordinal}"
        (port,) = {int(role.bind.rsplit(":", 1)[1]) for role in roles}
        control = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}["control"]
        assert control == port


def test_every_role_reaches_the_controller_by_its_pods_dns_name():
    cfg = node_config()
    sts = named("StatefulSet")["dsi-controller"]
    (controller,) = cfg.roles_of("controller")
    port = controller.bind.rsplit(":", 1)[1]
    dns = f"dsi-controller-0.{sts['spec']['serviceName']}.{sts['metadata']['namespace']}.svc.cluster.local"
    assert cfg.cluster.controller == f"tcp://{dns}:{port}"
    assert named("Service")[sts["spec"]["serviceName"]]["spec"]["publishNotReadyAddresses"] is True


def test_the_gateway_service_reaches_the_entrypoints_http_port():
    gateway = named("Service")["dsi-gateway"]
    (entry,) = node_config().roles_of("entrypoint")
    assert gateway["spec"]["selector"] == {NAME_LABEL: APP_NAME, KIND_LABEL: "entrypoint"}
    sts = named("StatefulSet")["dsi-entrypoint"]
    ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
    assert ports[gateway["spec"]["ports"][0]["targetPort"]] == entry.options.http_port == 8000
    assert container(sts)["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_only_the_controller_has_an_api_token_and_its_role_allows_the_provisioners_calls():
    sets = named("StatefulSet")
    for name, sts in sets.items():
        pod = sts["spec"]["template"]["spec"]
        if name == "dsi-controller":
            account = pod["serviceAccountName"]
        else:
            assert pod["automountServiceAccountToken"] is False
    binding = named("RoleBinding")["dsi-provisioner"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "dsi"}]
    assert account in named("ServiceAccount")
    rules = named("Role")[binding["roleRef"]["name"]]["rules"]
    allowed = {
        (group, res, verb)
        for r in rules
        for group in r["apiGroups"]
        for res in r["resources"]
        for verb in r["verbs"]
    }
    # KubernetesProvisioner: GET and PUT .../statefulsets/NAME/scale, GET pods/NAME and the pod list.
    assert {
        ("apps", "statefulsets/scale", "get"),
        ("apps", "statefulsets/scale", "update"),
        ("", "pods", "get"),
        ("", "pods", "list"),
    } <= allowed


@pytest.mark.parametrize("pod", ["dsi-decode-1", "dsi-controller-0", "dsi-kvstore-0"])
def test_a_pod_command_runs_the_role_of_its_name_bound_to_its_ip(tmp_path, pod):
    """The StatefulSet's shell command itself, with a stand-in dsi-role that shows its arguments."""
    kind = pod.split("-")[1]
    script = container(named("StatefulSet")[f"dsi-{kind}"])["args"][0]
    (tmp_path / "node.toml").write_text(node_toml())
    script = script.replace("/etc/dsi/node.toml", str(tmp_path / "node.toml"))
    script = script.replace("/tmp/node.toml", str(tmp_path / "rendered.toml"))
    stub = tmp_path / "bin" / "dsi-role"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "$@"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:{os.environ['PATH']}", "POD_NAME": pod, "POD_IP": "10.244.1.7"}
    out = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True, timeout=10
    )
    argv = out.stdout.split()
    role_id = pod.removeprefix("dsi-")
    assert argv == ["--config", str(tmp_path / "rendered.toml"), "--role", role_id]
    cfg = parse_config(tomllib.loads((tmp_path / "rendered.toml").read_text()), tmp_path / "rendered.toml")
    (role,) = with_role_subset(cfg, [role_id]).roles
    assert role.bind.startswith("tcp://10.244.1.7:") and role.host == "10.244.1.7"
    others = [r for r in cfg.roles if r.id != role_id]
    assert all("10.244.1.7" not in r.bind for r in others)
    if kind == "kvstore":
        assert role.options.publish == "tcp://10.244.1.7:7131"


def test_the_autoscaled_statefulsets_start_at_the_initial_count_within_the_declared_roles():
    cfg = node_config()
    assert cfg.provisioner.kind == "kubernetes" and cfg.autoscale is not None
    scaled = cfg.autoscale.scaled()
    assert set(scaled) == {"decode"}
    for kind, role in scaled.items():
        assert named("StatefulSet")[statefulset_name("dsi-", kind)]["spec"]["replicas"] == role.initial
        assert len(cfg.roles_of(kind)) >= role.max_instances
