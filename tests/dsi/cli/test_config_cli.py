"""``dsi config docs`` prints the config reference, and docs/configuration.md is its output."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_docs_configuration_md_is_what_dsi_config_docs_prints():
    done = subprocess.run(
        [sys.executable, "-m", "dsi.cli.main", "config", "docs"], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.startswith(b"# Node configuration reference\n")
    assert done.stdout == (REPO / "docs" / "configuration.md").read_bytes(), (
        "docs/configuration.md differs from `dsi config docs`: run `make docs`"
    )
