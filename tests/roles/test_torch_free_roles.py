"""Roles that never compute (controller, gateway, kvstore, balancer) and the CLI's config
reading stay torch-free: importing torch costs a process about a second of CPU, which every
start and replacement of such a role, and every ``dsi status`` or ``dsi drain``, would pay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from dsi.config import load_config
from dsi.roles.kinds import make_actor

node = load_config(sys.argv[1])
for role in node.roles:
    if role.kind in sys.argv[2].split(","):
        make_actor(role, node)
print(sorted(name for name in ("torch", "triton", "transformers") if name in sys.modules))
"""


def probe(tmp_path, kinds: str, device: str | None = None, timeout: float = 120) -> str:
    """The heavy modules PROBE finds loaded after building the roles of ``kinds`` (comma-separated)
    from configs/local.toml, with ``[engine] device`` set when given."""
    text = (REPO / "configs" / "local.toml").read_text().replace('"../run/', f'"{tmp_path}/run/')
    if device is not None:
        text = text.replace("[engine]\n", f'[engine]\ndevice = "{device}"\n', 1)
        assert f'device = "{device}"' in text
    config = tmp_path / "node.toml"
    config.write_text(text)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(config), kinds],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
def test_roles_without_an_engine_read_their_config_and_build_without_torch(tmp_path, device):
    assert probe(tmp_path, "controller,entrypoint,kvstore,balancer", device, timeout=60) == "[]"


def test_the_probe_sees_torch_where_an_engine_role_is_built(tmp_path):
    """The same probe on a prefill does report torch: the check above can fail."""
    assert "torch" in probe(tmp_path, "prefill")
