"""Secure by default: a node that reaches other hosts loads only with CURVE keys or an explicit
``insecure = true``; one-host (loopback) configs, the shipped ones included, load unchanged."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dsi.config import ConfigError, load_config, parse_config
from dsi.config.exposure import beyond_host
from dsi.transport.keyset import create_key_set

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted([*REPO.glob("configs/*.toml"), *REPO.glob("configs/examples/*.toml")])
LOOPBACK_CONFIGS = ("local.toml", "autoscale.toml", "smollm2.toml", "vllm.toml")


def node(roles: list[dict], **cluster: object) -> dict:
    return {"cluster": {"controller": "tcp://127.0.0.1:7100", **cluster}, "roles": roles}


def prefill(bind: str, **extra: object) -> dict:
    return {"kind": "prefill", "id": "prefill-0", "bind": bind, **extra}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    if path.name in LOOPBACK_CONFIGS and path.parent.name == "configs":
        assert beyond_host(cfg) == [] and not cfg.security.insecure  # make serve: as it was
    else:
        assert cfg.security.insecure  # the multi-host examples say so, and say why


def test_loopback_ipc_and_localhost_stay_on_this_host(tmp_path):
    roles = [
        prefill("tcp://127.0.0.1:7110"),
        {"kind": "decode", "id": "d0", "bind": "tcp://[::1]:7120"},
        {"kind": "decode", "id": "d1", "bind": "ipc:///tmp/dsi-d1.sock"},
        {"kind": "decode", "id": "d2", "bind": "tcp://localhost:7122"},
        {"kind": "kvstore", "id": "k", "bind": "tcp://127.0.0.1:7130", "publish": "tcp://127.0.0.2:7131"},
    ]
    cfg = parse_config(node(roles, balancers=["tcp://127.0.0.1:7150"]), tmp_path / "node.toml")
    assert beyond_host(cfg) == []


# (case, the node, the dotted key the error names)
BEYOND = [
    ("bind-on-an-interface", node([prefill("tcp://10.0.0.5:7110")]), "roles[0].bind"),
    ("wildcard-bind", node([prefill("tcp://0.0.0.0:7110", host="127.0.0.1")]), "roles[0].bind"),
    ("advertised-name", node([prefill("tcp://127.0.0.1:7110", host="prefill-0.internal")]), "roles[0].host"),
    ("controller-elsewhere", node([prefill("tcp://127.0.0.1:7110")], controller="tcp://10.0.0.1:7100"), None),
    (
        "balancer-elsewhere",
        node([prefill("tcp://127.0.0.1:7110")], balancers=["tcp://10.0.0.3:7150"]),
        "cluster.balancers[0]",
    ),
    (
        "kvstore-publishes-elsewhere",
        node(
            [{"kind": "kvstore", "id": "k", "bind": "tcp://127.0.0.1:7130", "publish": "tcp://0.0.0.0:7131"}]
        ),
        "roles[0].publish",
    ),
]


@pytest.mark.parametrize(("case", "data", "key"), BEYOND, ids=[c[0] for c in BEYOND])
def test_a_node_beyond_its_host_without_keys_is_refused(tmp_path, case, data, key):
    with pytest.raises(ConfigError) as err:
        parse_config(data, tmp_path / "node.toml")
    assert err.value.key == "security" and err.value.file == str(tmp_path / "node.toml")
    assert "dsi keys create --out DIR" in err.value.reason and "insecure = true" in err.value.reason
    assert (key or "cluster.controller") in err.value.reason
    # insecure = true lets it load, as written
    cfg = parse_config({**data, "security": {"insecure": True}}, tmp_path / "node.toml")
    assert cfg.security.insecure and beyond_host(cfg)


def test_keys_from_dsi_keys_create_let_it_load(tmp_path):
    keyset = create_key_set(tmp_path / "keys", ["cluster"])
    security = tomllib.loads(keyset.snippet())["security"]
    cfg = parse_config(
        {**node([prefill("tcp://10.0.0.5:7110")]), "security": security}, tmp_path / "node.toml"
    )
    assert cfg.security.curve and not cfg.security.insecure


def test_insecure_and_curve_together_are_refused(tmp_path):
    keyset = create_key_set(tmp_path / "keys", ["cluster"])
    security = {**tomllib.loads(keyset.snippet())["security"], "insecure": True}
    with pytest.raises(ConfigError) as err:
        parse_config(
            {**node([prefill("tcp://127.0.0.1:7110")]), "security": security}, tmp_path / "node.toml"
        )
    assert err.value.key == "security.insecure" and "contradict" in err.value.reason
