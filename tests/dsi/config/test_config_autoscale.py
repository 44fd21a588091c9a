"""[autoscale]: the shipped live config, an absent section, and errors that name file and key."""

from pathlib import Path

import pytest

from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.config import ConfigError, load_config, parse_config
from dsi.config.autoscale import AutoscaleRole, check_declared

REPO = Path(__file__).resolve().parents[3]
BASE = {
    "cluster": {"controller": "tcp://127.0.0.1:7100"},
    "roles": [{"kind": "controller", "id": "controller-0", "bind": "tcp://127.0.0.1:7100"}],
}


def with_autoscale(section: dict) -> dict:
    return {**BASE, "autoscale": section}


def test_the_shipped_live_config_scales_decode_only():
    cfg = load_config(REPO / "configs" / "autoscale.toml")
    assert cfg.autoscale is not None and cfg.autoscale.prefill is None
    assert cfg.autoscale.decode == AutoscaleRole(
        min_instances=1, max_instances=5, max_change=1, margin=0.0, ready_pool=1, capacity=2.0
    )
    assert cfg.autoscale.decode.initial == 2
    assert cfg.autoscale.policy() == AutoscalerConfig(
        prefill=RoleBounds(min_instances=0, max_instances=1),
        decode=RoleBounds(min_instances=1, max_instances=5, max_change=1, margin=0.0, ready_pool=1),
        interval_s=5.0,
    )
    check_declared(cfg.autoscale, {"decode": len(cfg.roles_of("decode"))}, "autoscale.toml")


def test_without_the_section_nothing_is_scaled():
    assert load_config(REPO / "configs" / "local.toml").autoscale is None
    assert parse_config(with_autoscale({}), "x.toml").autoscale.scaled() == {}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("section", "key", "reason"),
    [
        ({"intervall_s": 1.0}, "autoscale.intervall_s", "unknown key; allowed keys: decode, drain_timeout_s"),
        (
            {"decode": {"max_instances": 2, "capacity": 1.0, "pool": 1}},
            "autoscale.decode.pool",
            "unknown key",
        ),
        ({"decode": {"max_instances": 2}}, "autoscale.decode.capacity", "missing required key"),
        (
            {"decode": {"min_instances": 3, "max_instances": 2, "capacity": 1.0}},
            "autoscale.decode.max_instances",
            "must be >= min_instances (3), got 2",
        ),
        (
            {"decode": {"max_instances": 2, "ready_pool": 3, "capacity": 1.0}},
            "autoscale.decode.ready_pool",
            "must be <= max_instances (2), got 3",
        ),
        (
            {"decode": {"max_instances": 2, "capacity": 0}},
            "autoscale.decode.capacity",
            "must be > 0.0, got 0.0",
        ),
        ({"quota_threshold": 1.5}, "autoscale.quota_threshold", "must be <= 1.0, got 1.5"),
    ],
)
def test_bad_values_name_the_file_and_key(section, key, reason):
    with pytest.raises(ConfigError) as err:
        parse_config(with_autoscale(section), "node.toml")
    assert (err.value.file, err.value.key) == ("node.toml", key)
    assert reason in err.value.reason


def test_a_role_may_not_scale_past_the_instances_the_config_declares():
    cfg = parse_config(with_autoscale({"decode": {"max_instances": 3, "capacity": 1.0}}), "node.toml")
    assert cfg.autoscale is not None
    with pytest.raises(
        ConfigError,
        match=r"node.toml: autoscale.decode.max_instances: 3 decode instances may run, "
        r"but the config declares 2 \[\[roles\]\] of kind 'decode'",
    ):
        check_declared(cfg.autoscale, {"decode": 2}, "node.toml")
