"""make_provisioner: the [provisioner] section of a node config picks and sets up the provisioner."""

from pathlib import Path

import pytest

from dsi.config import load_config
from dsi.provision import KubeNotFound, KubernetesProvisioner, LocalProvisioner, make_provisioner
from tests.dsi.provision.kube_fake import FakeKube

BASE = """\
[cluster]
controller = "tcp://127.0.0.1:7100"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "tcp://127.0.0.1:7100"
"""

pytestmark = pytest.mark.timeout(30)


def test_local_is_the_default(tmp_path: Path):
    (tmp_path / "node.toml").write_text(BASE)
    prov = make_provisioner(load_config(tmp_path / "node.toml"))
    assert isinstance(prov, LocalProvisioner) and prov.list() == []


async def test_kubernetes_reaches_the_configured_api_with_the_token_file(tmp_path: Path):
    fake = await FakeKube(replicas={"v4-decode": 0}, ready_after=0).start()
    (tmp_path / "token").write_text("from-file\n")
    (tmp_path / "node.toml").write_text(
        BASE
        + f"""
[provisioner]
kind = "kubernetes"
[provisioner.kubernetes]
namespace = "serving"
statefulset_prefix = "v4-"
api_url = "{fake.url}"
token_file = "token"
poll_interval_s = 0.01
"""
    )
    prov = make_provisioner(load_config(tmp_path / "node.toml"))
    try:
        assert isinstance(prov, KubernetesProvisioner)
        # The fake plays namespace "dsi" only: the 404 names what was asked for.
        with pytest.raises(KubeNotFound, match="no StatefulSet v4-decode in namespace serving"):
            await prov.start("decode-0")
        assert fake.seen() == [("GET", "/apis/apps/v1/namespaces/serving/statefulsets/v4-decode/scale")]
        assert fake.tokens == ["Bearer from-file"]
    finally:
        await prov.close()
        await fake.stop()
