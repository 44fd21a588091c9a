"""deploy/kubernetes/: every manifest parses, and the names, labels, ports and permissions agree with
the node config in the ConfigMap and with what KubernetesProvisioner calls; make-secrets.sh (with a
stand-in kubectl) makes the Secrets whose files the pods mount where the ConfigMap reads them; the
NetworkPolicies admit dsi pods to the ports the roles listen on. No cluster is involved."""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsi.config import NodeConfig, parse_config, with_role_subset
from dsi.provision.kube_pods import APP_NAME, KIND_LABEL, NAME_LABEL, replica_of, statefulset_name
from dsi.roles.curve import client_keys, server_keys
from dsi.roles.entrypoint.auth import ApiKeys

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


def node_config(root: Path) -> NodeConfig:
    """The ConfigMap's node config, its Secret paths read under ``root`` (see ``mounted``)."""
    return parse_config(tomllib.loads(mounted_at(node_toml(), root)), "/etc/dsi/node.toml")


def mounted_at(text: str, root: Path) -> str:
    return text.replace('"/etc/dsi-', f'"{root}/etc/dsi-')


SECRET_MOUNTS = {"dsi-curve-keys": "/etc/dsi-keys", "dsi-api-keys": "/etc/dsi-api-keys"}


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Secret name -> {key: bytes}, as make-secrets.sh has a stand-in kubectl create them."""
    tmp = tmp_path_factory.mktemp("secrets")
    log = tmp / "kubectl.log"
    stub = tmp / "kubectl"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\n')
    stub.chmod(0o755)
    env = {**os.environ, "KUBECTL": str(stub), "DSI": str(Path(sys.executable).parent / "dsi")}
    out = subprocess.run(
        [str(DEPLOY / "make-secrets.sh"), str(tmp / "keys")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    made: dict[str, dict[str, bytes]] = {}
    for line in log.read_text().splitlines():
        words = line.split()
        assert words[:5] == ["-n", "dsi", "create", "secret", "generic"], line
        files = (w.removeprefix("--from-file=").split("=", 1) for w in words[6:])
        made[words[5]] = {key: Path(path).read_bytes() for key, path in files}
    again = subprocess.run(
        [str(DEPLOY / "make-secrets.sh"), str(tmp / "keys")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "exists already" in again.stderr  # never overwrites keys
    return made


@pytest.fixture(scope="module")
def mounted(secrets, tmp_path_factory) -> Path:
    """A root under which each Secret volume of dsi-entrypoint is laid out as kubelet would."""
    root = tmp_path_factory.mktemp("pod")
    for volume, mount in volumes_of(named("StatefulSet")["dsi-entrypoint"]):
        name = volume["secret"]["secretName"]
        for item in volume["secret"]["items"]:
            path = root / mount.lstrip("/") / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(secrets[name][item["key"]])
    return root


def volumes_of(sts: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(secret volume, its mount path) of a StatefulSet's pod."""
    pod = sts["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
    return [(v, mounts[v["name"]]) for v in pod["volumes"] if "secret" in v]


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


def test_one_statefulset_per_role_kind_named_and_labelled_as_the_provisioner_expects(mounted):
    cfg = node_config(mounted)
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


def test_every_role_reaches_the_controller_by_its_pods_dns_name(mounted):
    cfg = node_config(mounted)
    sts = named("StatefulSet")["dsi-controller"]
    (controller,) = cfg.roles_of("controller")
    port = controller.bind.rsplit(":", 1)[1]
    dns = f"dsi-controller-0.{sts['spec']['serviceName']}.{sts['metadata']['namespace']}.svc.cluster.local"
    assert cfg.cluster.controller == f"tcp://{dns}:{port}"
    assert named("Service")[sts["spec"]["serviceName"]]["spec"]["publishNotReadyAddresses"] is True


def test_the_gateway_service_reaches_the_entrypoints_http_port(mounted):
    gateway = named("Service")["dsi-gateway"]
    (entry,) = node_config(mounted).roles_of("entrypoint")
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
def test_a_pod_command_runs_the_role_of_its_name_bound_to_its_ip(tmp_path, mounted, pod):
    """The StatefulSet's shell command itself, with a stand-in dsi-role that shows its arguments."""
    kind = pod.split("-")[1]
    script = container(named("StatefulSet")[f"dsi-{kind}"])["args"][0]
    (tmp_path / "node.toml").write_text(mounted_at(node_toml(), mounted))
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


def test_the_autoscaled_statefulsets_start_at_the_initial_count_within_the_declared_roles(mounted):
    cfg = node_config(mounted)
    assert cfg.provisioner.kind == "kubernetes" and cfg.autoscale is not None
    scaled = cfg.autoscale.scaled()
    assert set(scaled) == {"decode"}
    for kind, role in scaled.items():
        assert named("StatefulSet")[statefulset_name("dsi-", kind)]["spec"]["replicas"] == role.initial
        assert len(cfg.roles_of(kind)) >= role.max_instances


def test_every_pod_mounts_the_curve_secret_where_security_reads_it_and_the_keys_load(secrets, mounted):
    cfg = node_config(mounted)
    sec = cfg.security
    assert sec.curve and not sec.insecure
    for name, sts in named("StatefulSet").items():
        secret_volumes = {v["secret"]["secretName"]: (v, mount) for v, mount in volumes_of(sts)}
        want = {"dsi-curve-keys", "dsi-api-keys"} if name == "dsi-entrypoint" else {"dsi-curve-keys"}
        assert set(secret_volumes) == want, name
        for secret, (volume, mount) in secret_volumes.items():
            assert mount == SECRET_MOUNTS[secret]
            assert volume["secret"]["defaultMode"] == 0o400
            assert {i["key"] for i in volume["secret"]["items"]} == set(secrets[secret]), name
    # The files the ConfigMap names are those the Secret's items put in the pod, and they are a
    # working key set: the server and the client keys load.
    for path in (sec.server_secret_key, sec.server_public_key, sec.client_secret_key):
        assert path is not None and path.is_file() and str(path).startswith(f"{mounted}/etc/dsi-keys/")
    assert sec.authorized_keys_dir is not None and len(list(sec.authorized_keys_dir.glob("*.key"))) == 1
    server, client = server_keys(sec), client_keys(sec)
    assert server is not None and client is not None and server.server_public == client.server_public


def test_the_gateway_reads_its_api_keys_from_the_secret(mounted):
    (entry,) = node_config(mounted).roles_of("entrypoint")
    path = entry.options.api_keys_file
    assert path == mounted / "etc/dsi-api-keys/api-keys.toml"
    keys = ApiKeys.load(path)
    assert not keys.open_access and len(keys.callers) == 1
    (key,) = keys.callers
    assert key.startswith("sk-dsi-") and len(key) == len("sk-dsi-") + 64
    assert keys.authenticate(f"Bearer {key}", None) is not None
    assert keys.authenticate("Bearer sk-dsi-guess", None) is None


def test_network_policies_admit_dsi_pods_to_every_listening_port_and_anyone_to_the_gateway(mounted):
    cfg = node_config(mounted)
    policies = named("NetworkPolicy")
    assert set(policies) == {"dsi-roles", "dsi-gateway"}
    dsi_pods = {NAME_LABEL: APP_NAME}
    roles = policies["dsi-roles"]["spec"]
    assert roles["podSelector"] == {"matchLabels": dsi_pods} and roles["policyTypes"] == ["Ingress"]
    (rule,) = roles["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": dsi_pods}}]
    single = {p["port"] for p in rule["ports"] if "endPort" not in p}
    listening = {int(r.bind.rsplit(":", 1)[1]) for r in cfg.roles}
    listening |= {int(r.options.publish.rsplit(":", 1)[1]) for r in cfg.roles_of("kvstore")}
    assert single == listening
    (data,) = [(p["port"], p["endPort"]) for p in rule["ports"] if "endPort" in p]
    assert data == (32768, 60999)  # Linux's default ephemeral range: where `tcp://HOST:*` binds
    assert all(p["protocol"] == "TCP" for p in rule["ports"])
    # Every container port of a dsi pod is in the policy (the HTTP port in the gateway's).
    gateway = policies["dsi-gateway"]["spec"]
    assert gateway["podSelector"] == {"matchLabels": {**dsi_pods, KIND_LABEL: "entrypoint"}}
    (open_rule,) = gateway["ingress"]
    assert "from" not in open_rule  # from anywhere
    (entry,) = cfg.roles_of("entrypoint")
    assert open_rule["ports"] == [{"protocol": "TCP", "port": entry.options.http_port}]
    for sts in named("StatefulSet").values():
        for port in container(sts)["ports"]:
            assert port["containerPort"] in single | {entry.options.http_port}
