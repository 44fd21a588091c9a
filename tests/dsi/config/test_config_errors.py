"""Bad configs: each is a ConfigError that names the file and the exact dotted key."""

from pathlib import Path

import pytest

from dsi.config import ConfigError, load_config

BASE = """\
[cluster]
controller = "tcp://127.0.0.1:7100"
heartbeat_interval_s = 1.0

[[roles]]
kind = "controller"
id = "controller-0"
bind = "tcp://127.0.0.1:7100"

[[roles]]
kind = "entrypoint"
id = "entrypoint-0"
bind = "tcp://127.0.0.1:7101"
http = "127.0.0.1:8000"

[[roles]]
kind = "prefill"
id = "prefill-0"
bind = "tcp://127.0.0.1:7110"
"""

BALANCER = '\n[[roles]]\nkind = "balancer"\nid = "balancer-0"\nbind = "tcp://127.0.0.1:7150"\n'
SECURITY_PATHS = """
server_secret_key = "secrets/server.key_secret"
server_public_key = "secrets/server.key"
client_secret_key = "secrets/client.key_secret"
authorized_keys_dir = "secrets/authorized"
"""


def edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


PREFILL_ID = 'id = "prefill-0"'
PREFILL_BIND = 'bind = "tcp://127.0.0.1:7110"'
INTERVAL = "heartbeat_interval_s = 1.0"
ENTRY_HTTP = 'http = "127.0.0.1:8000"'

# (test id, file text, the dotted key the error must name, a fragment of the reason)
CASES = [
    ("unknown-top-level-key", BASE + '\n[clustre]\nname = "x"\n', "clustre", "unknown key"),
    ("unknown-section-key", edit(INTERVAL, "heartbeat = 1.0"), "cluster.heartbeat", "unknown key"),
    (
        "key-of-another-kind",
        edit(PREFILL_BIND, PREFILL_BIND + '\nhttp = "127.0.0.1:8001"'),
        "roles[2].http",
        "unknown key",
    ),
    (
        "string-for-float",
        edit(INTERVAL, 'heartbeat_interval_s = "1"'),
        "cluster.heartbeat_interval_s",
        "expected a number, got a string",
    ),
    (
        "bool-for-int",
        edit(INTERVAL, "root_seed = true"),
        "cluster.root_seed",
        "expected an integer, got a boolean",
    ),
    (
        "zero-interval",
        edit(INTERVAL, "heartbeat_interval_s = 0"),
        "cluster.heartbeat_interval_s",
        "must be > 0",
    ),
    (
        "interval-over-60",
        edit(INTERVAL, "heartbeat_interval_s = 61.0\nheartbeat_timeout_s = 90.0"),
        "cluster.heartbeat_interval_s",
        "<= 60",
    ),
    (
        "timeout-not-above-interval",
        edit(INTERVAL, "heartbeat_interval_s = 10.0"),
        "cluster.heartbeat_timeout_s",
        "must be > heartbeat_interval_s",
    ),
    ("negative-seed", edit(INTERVAL, "root_seed = -1"), "cluster.root_seed", ">= 0"),
    ("nan-lease", BASE + "\n[data_plane]\nlease_timeout_s = nan\n", "data_plane.lease_timeout_s", "finite"),
    (
        "negative-max-running",
        edit(PREFILL_BIND, PREFILL_BIND + "\nmax_running = -1"),
        "roles[2].max_running",
        "must be > 0",
    ),
    (
        "zero-http-workers",
        edit(ENTRY_HTTP, ENTRY_HTTP + "\nhttp_workers = 0"),
        "roles[1].http_workers",
        "must be > 0",
    ),
    (
        "image-fetch-allow-not-a-network",
        edit(ENTRY_HTTP, ENTRY_HTTP + '\nimage_fetch_allow = ["10.0.0.0/33"]'),
        "roles[1].image_fetch_allow",
        "10.0.0.0/8",
    ),
    (
        "image-fetch-allow-not-an-array",
        edit(ENTRY_HTTP, ENTRY_HTTP + '\nimage_fetch_allow = "10.0.0.0/8"'),
        "roles[1].image_fetch_allow",
        "array of CIDR strings",
    ),
    (
        "http-workers-on-a-prefill",
        edit(PREFILL_BIND, PREFILL_BIND + "\nhttp_workers = 2"),
        "roles[2].http_workers",
        "unknown key",
    ),
    ("bad-log-format", BASE + '\n[logging]\nformat = "xml"\n', "logging.format", "'text', 'json'"),
    ("bad-backend", BASE + '\n[data_plane]\nbackend = "udp"\n', "data_plane.backend", "'tcp', 'shm', 'rdma'"),
    (
        "bad-hit-policy",
        BASE + '\n[kvcache]\nhit_policy = "fast"\n',
        "kvcache.hit_policy",
        "'bounded', 'exact'",
    ),
    ("hit-policy-not-a-string", BASE + "\n[kvcache]\nhit_policy = 1\n", "kvcache.hit_policy", "got 1"),
    (
        "unknown-kvcache-key",
        BASE + '\n[kvcache]\npolicy = "exact"\n',
        "kvcache.policy",
        "allowed keys: hit_policy",
    ),
    (
        "bad-scheduling",
        BASE + '\n[engine]\nscheduling = "fast"\n',
        "engine.scheduling",
        "'auto', 'async', 'sync'",
    ),
    (
        "bad-speculative",
        BASE + '\n[engine]\nspeculative = "eagle"\n',
        "engine.speculative",
        "'off', 'fixed', 'dspark'",
    ),
    ("too-many-drafts", BASE + "\n[engine]\nnum_drafts = 6\n", "engine.num_drafts", "6"),
    (
        "invariant-not-a-bool",
        BASE + '\n[engine]\nbatch_invariant = "yes"\n',
        "engine.batch_invariant",
        "expected a boolean",
    ),
    (
        "bad-role-kind",
        edit('kind = "prefill"', 'kind = "router"'),
        "roles[2].kind",
        "'controller', 'entrypoint'",
    ),
    (
        "missing-controller",
        edit('controller = "tcp://127.0.0.1:7100"\n', ""),
        "cluster.controller",
        "missing required key",
    ),
    (
        "missing-cluster",
        edit('[cluster]\ncontroller = "tcp://127.0.0.1:7100"\n' + INTERVAL + "\n", ""),
        "cluster",
        "missing required key",
    ),
    ("missing-roles", BASE.split("[[roles]]")[0], "roles", "missing required key"),
    ("missing-role-id", edit('id = "entrypoint-0"\n', ""), "roles[1].id", "missing required key"),
    ("missing-http", edit('http = "127.0.0.1:8000"\n', ""), "roles[1].http", "missing required key"),
    (
        "bad-bucket-edges",
        BASE + BALANCER + "bucket_edges = [512, 256]\n",
        "roles[3].bucket_edges",
        "increasing positive token counts",
    ),
    ("balancer-policy-gone", BASE + BALANCER + 'policy = "prefill"\n', "roles[3].policy", "unknown key"),
    (
        "bad-balancer-endpoint",
        edit(
            'controller = "tcp://127.0.0.1:7100"\n',
            'controller = "tcp://127.0.0.1:7100"\nbalancers = ["tcp://*:7140"]\n',
        ),
        "cluster.balancers",
        "wildcard",
    ),
    (
        "duplicate-bind",
        edit(PREFILL_BIND, 'bind = "tcp://127.0.0.1:7101"'),
        "roles[2].bind",
        "also roles[1].bind",
    ),
    ("duplicate-id", edit(PREFILL_ID, 'id = "entrypoint-0"'), "roles[2].id", "also roles[1].id"),
    ("bad-id-chars", edit(PREFILL_ID, 'id = "prefill 0"'), "roles[2].id", "must be letters"),
    ("endpoint-without-port", edit(PREFILL_BIND, 'bind = "tcp://127.0.0.1"'), "roles[2].bind", "malformed"),
    (
        "endpoint-port-range",
        edit(PREFILL_BIND, 'bind = "tcp://127.0.0.1:70000"'),
        "roles[2].bind",
        "1..65535",
    ),
    (
        "endpoint-scheme",
        edit(PREFILL_BIND, 'bind = "udp://127.0.0.1:7110"'),
        "roles[2].bind",
        "tcp://HOST:PORT or ipc://PATH",
    ),
    (
        "wildcard-controller",
        edit('controller = "tcp://127.0.0.1:7100"', 'controller = "tcp://*:7100"'),
        "cluster.controller",
        "wildcard",
    ),
    (
        "empty-host",
        edit(PREFILL_BIND, PREFILL_BIND + '\nhost = ""'),
        "roles[2].host",
        "must not be empty",
    ),
    ("malformed-http", edit('http = "127.0.0.1:8000"', 'http = "localhost"'), "roles[1].http", "HOST:PORT"),
    ("http-port-range", edit('http = "127.0.0.1:8000"', 'http = "127.0.0.1:0"'), "roles[1].http", "1..65535"),
    (
        "roles-not-an-array",
        "roles = 3\n" + BASE.split("[[roles]]")[0],
        "roles",
        "expected an array of tables",
    ),
    ("role-not-a-table", "roles = [1]\n" + BASE.split("[[roles]]")[0], "roles[0]", "expected a table"),
    ("section-not-a-table", 'logging = "json"\n' + BASE, "logging", "expected a table"),
    ("empty-path", BASE + '\n[model]\ndir = ""\n', "model.dir", "must not be empty"),
    ("malformed-toml", edit("[cluster]", "[cluster"), "<toml>", "line 1"),
    (
        "curve-without-keys",
        BASE + "\n[security]\ncurve = true\n",
        "security.server_secret_key",
        "required when curve = true",
    ),
    (
        "curve-with-absent-files",
        BASE + "\n[security]\ncurve = true\n" + SECURITY_PATHS,
        "security.server_secret_key",
        "file not found",
    ),
]


@pytest.mark.parametrize(
    ("text", "key", "reason"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    err = caught.value
    assert err.key == key, str(err)
    assert err.file == str(path)
    assert str(err).startswith(f"{path}: {key}: ")
    assert reason in err.reason, str(err)


def test_curve_names_the_one_missing_key_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "authorized").mkdir(parents=True)
    (secrets / "server.key_secret").write_text("certificate\n")
    (secrets / "server.key").write_text("certificate\n")
    path = tmp_path / "node.toml"
    path.write_text(BASE + "\n[security]\ncurve = true\n" + SECURITY_PATHS)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == "security.client_secret_key"
    assert str(secrets / "client.key_secret") in caught.value.reason


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: <file>: no such file"


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert caught.value.key == "<file>"
    assert str(tmp_path) in str(caught.value)


def test_unknown_key_lists_the_keys_allowed_for_the_kind(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(edit(PREFILL_BIND, PREFILL_BIND + "\nstore_dir = 'x'"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == "roles[2].store_dir"
    assert "max_batch_tokens" in caught.value.reason and "bind" in caught.value.reason
