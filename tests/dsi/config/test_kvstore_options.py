"""[[roles]] kind = "kvstore": TTLs per traffic class, fsync policy, publisher endpoint, limits."""

from pathlib import Path

import pytest

from dsi.config import ConfigError, KvstoreOptions, parse_config


def kvstore(tmp_path: Path, **keys):
    data = {
        "cluster": {"controller": "tcp://127.0.0.1:7100"},
        "roles": [{"kind": "kvstore", "id": "kv", "bind": "tcp://127.0.0.1:7130", **keys}],
    }
    return parse_config(data, tmp_path / "node.toml").role("kv").options


def test_defaults(tmp_path):
    opts = kvstore(tmp_path)
    assert isinstance(opts, KvstoreOptions)
    assert (opts.ttl_agent_s, opts.ttl_chatbot_s) == (3 * 86400.0, 7 * 86400.0)
    assert (opts.fsync, opts.publish, opts.capacity_blocks) == ("segment", "", 0)
    assert opts.segment_bytes == 1 << 30 and opts.read_workers == 8


def test_values_are_read(tmp_path):
    opts = kvstore(
        tmp_path,
        ttl_agent_s=60.0,
        ttl_chatbot_s=120.0,
        fsync="always",
        publish="tcp://127.0.0.1:7131",
        capacity_blocks=1000,
        compact_below=0.3,
    )
    assert (opts.ttl_agent_s, opts.ttl_chatbot_s, opts.fsync) == (60.0, 120.0, "always")
    assert (opts.publish, opts.capacity_blocks, opts.compact_below) == ("tcp://127.0.0.1:7131", 1000, 0.3)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("fsync", "sometimes", "must be one of"),
        ("ttl_agent_s", 0.0, "must be > 0"),
        ("publish", "localhost:7131", "malformed endpoint"),
        ("compact_below", 1.5, "must be <= 1"),
        ("read_workers", 0, "must be > 0"),
        ("segment_bytes", 10, "must be >= 65536"),
    ],
)
def test_bad_values_name_the_key(tmp_path, key, value, reason):
    with pytest.raises(ConfigError, match=rf"roles\[0\]\.{key}: .*{reason}"):
        kvstore(tmp_path, **{key: value})
