"""[provisioner]: local by default; kubernetes options in [provisioner.kubernetes], checked by key."""

from pathlib import Path

import pytest

from dsi.config import ConfigError, KubernetesOptions, load_config

BASE = """\
[cluster]
controller = "tcp://127.0.0.1:7100"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "tcp://127.0.0.1:7100"
"""


def write(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(BASE + extra)
    return path


def test_local_is_the_default(tmp_path):
    cfg = load_config(write(tmp_path, ""))
    assert (cfg.provisioner.kind, cfg.provisioner.kubernetes) == ("local", None)


def test_kubernetes_without_a_table_takes_the_in_cluster_defaults(tmp_path):
    cfg = load_config(write(tmp_path, '[provisioner]\nkind = "kubernetes"\n'))
    assert cfg.provisioner.kubernetes == KubernetesOptions()
    assert cfg.provisioner.kubernetes.api_url == "" and cfg.provisioner.kubernetes.namespace == "dsi"


def test_kubernetes_options_are_read(tmp_path):
    cfg = load_config(
        write(
            tmp_path,
            """
[provisioner]
kind = "kubernetes"
[provisioner.kubernetes]
namespace = "serving"
statefulset_prefix = "v4-"
api_url = "https://10.0.0.1:6443/"
token_file = "secrets/token"
ready_timeout_s = 30
""",
        )
    )
    opts = cfg.provisioner.kubernetes
    assert opts is not None
    assert (opts.namespace, opts.statefulset_prefix, opts.api_url) == (
        "serving",
        "v4-",
        "https://10.0.0.1:6443",
    )
    assert opts.token_file == tmp_path / "secrets" / "token"
    assert (opts.ca_file, opts.ready_timeout_s) == (None, 30.0)


@pytest.mark.parametrize(
    ("extra", "key", "reason"),
    [
        ('[provisioner]\nkind = "nomad"\n', "provisioner.kind", "must be one of 'local', 'kubernetes'"),
        ('[provisioner]\nkind = "kubernetes"\nnamespace = "dsi"\n', "provisioner.namespace", "unknown key"),
        (
            '[provisioner.kubernetes]\nnamespace = "dsi"\n',
            "provisioner.kubernetes",
            'only allowed with kind = "kubernetes"',
        ),
        (
            '[provisioner]\nkind = "kubernetes"\n[provisioner.kubernetes]\nnamepsace = "dsi"\n',
            "provisioner.kubernetes.namepsace",
            "unknown key",
        ),
        (
            '[provisioner]\nkind = "kubernetes"\n[provisioner.kubernetes]\nnamespace = "DSI"\n',
            "provisioner.kubernetes.namespace",
            "lowercase letters",
        ),
        (
            '[provisioner]\nkind = "kubernetes"\n[provisioner.kubernetes]\napi_url = "10.0.0.1:6443"\n',
            "provisioner.kubernetes.api_url",
            "http:// or https://",
        ),
        (
            '[provisioner]\nkind = "kubernetes"\n[provisioner.kubernetes]\napi_url = "https://k/api"\n',
            "provisioner.kubernetes.api_url",
            "without a path",
        ),
        (
            '[provisioner]\nkind = "kubernetes"\n[provisioner.kubernetes]\npoll_interval_s = 0\n',
            "provisioner.kubernetes.poll_interval_s",
            "must be > 0",
        ),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path, extra, key, reason):
    path = write(tmp_path, extra)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (err.value.file, err.value.key) == (str(path), key)
    assert reason in err.value.reason
