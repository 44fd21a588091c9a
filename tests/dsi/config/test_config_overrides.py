"""with_http_port, with_role_subset, with_drain_timeout and with_logging: copies with a
command-line override applied."""

from pathlib import Path

import pytest

from dsi.config import (
    ConfigError,
    EntrypointOptions,
    load_config,
    parse_config,
    with_drain_timeout,
    with_http_port,
    with_logging,
    with_role_subset,
)

LOCAL = Path(__file__).resolve().parents[3] / "configs" / "local.toml"


def test_with_http_port_replaces_the_first_entrypoint_port_only() -> None:
    cfg = load_config(LOCAL)
    moved = with_http_port(cfg, 9123)
    options = moved.role("entrypoint-0").options
    assert isinstance(options, EntrypointOptions)
    assert (options.http_host, options.http_port) == ("127.0.0.1", 9123)
    assert cfg.role("entrypoint-0").options.http_port == 8000  # the original is untouched
    assert [r for r in moved.roles if r.id != "entrypoint-0"] == [
        r for r in cfg.roles if r.id != "entrypoint-0"
    ]


@pytest.mark.parametrize("port", [0, 65536, -1, True])
def test_with_http_port_rejects_a_bad_port(port: int) -> None:
    with pytest.raises(ConfigError) as caught:
        with_http_port(load_config(LOCAL), port)
    assert caught.value.key == "roles[1].http"


def test_with_http_port_needs_an_entrypoint(tmp_path: Path) -> None:
    data = {
        "cluster": {"controller": "tcp://127.0.0.1:7100"},
        "roles": [{"kind": "decode", "id": "decode-0", "bind": "tcp://127.0.0.1:7120"}],
    }
    with pytest.raises(ConfigError) as caught:
        with_http_port(parse_config(data, tmp_path / "node.toml"), 8080)
    assert caught.value.key == "roles"


def test_with_role_subset_keeps_file_order() -> None:
    cfg = with_role_subset(load_config(LOCAL), ["decode-0", "controller-0", "prefill-1"])
    assert [role.id for role in cfg.roles] == ["controller-0", "prefill-1", "decode-0"]
    assert cfg.balancer_addresses == ("tcp://127.0.0.1:7140",)  # the file's balancer, though not kept


@pytest.mark.parametrize("ids", [["decode-7"], []])
def test_with_role_subset_rejects_unknown_or_no_ids(ids: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        with_role_subset(load_config(LOCAL), ids)
    assert caught.value.key == "roles"
    assert str(LOCAL) in str(caught.value)


def test_with_drain_timeout_sets_every_entrypoints_drain_only() -> None:
    cfg = load_config(LOCAL)
    quick = with_drain_timeout(cfg, 8)
    assert quick.role("entrypoint-0").options.drain_timeout_s == 8.0
    assert cfg.role("entrypoint-0").options.drain_timeout_s == 30.0
    assert [r for r in quick.roles if r.kind != "entrypoint"] == [
        r for r in cfg.roles if r.kind != "entrypoint"
    ]
    with pytest.raises(ConfigError, match="drain_timeout_s"):
        with_drain_timeout(cfg, -1.0)


def test_with_logging_replaces_what_is_given() -> None:
    cfg = load_config(LOCAL)
    assert with_logging(cfg, "json").logging.format == "json"
    assert with_logging(cfg, None, "debug").logging == type(cfg.logging)(format="text", level="debug")
    assert with_logging(cfg).logging == cfg.logging
