"""Packaging rules from ARCHITECTURE.md that a test run from the repo root would not notice."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["dsi", "transport", "roles", "kvcache", "kernels", "tests", "benchmarks"]
_BAD = re.compile(r"^\s*(from|import)\s+(transport|roles|kvcache|kernels)(\.|\s|$)", re.M)


def test_imports_always_go_through_dsi():
    offenders = []
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            for match in _BAD.finditer(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}: {match.group(0).strip()}")
    assert not offenders, "import as dsi.<package>:\n" + "\n".join(offenders)


def test_subpackages_import_from_outside_the_repo(tmp_path):
    code = (
        "import dsi.transport.wire, dsi.roles, dsi.kvcache.block_pool, dsi.kernels, dsi.engine.engine;"
        "import dsi, pathlib; print(pathlib.Path(dsi.transport.wire.__file__).parent.name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "transport"
