"""Packaging rules from ARCHITECTURE.md that a test run from the repo root would not notice."""

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsi.folders import FOLDERS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["dsi", *FOLDERS, "tests", "benchmarks"]
_BAD = re.compile(rf"^\s*(from|import)\s+({'|'.join(FOLDERS)})(\.|\s|$)", re.M)


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


_IMPORT_ALL = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    module, _, attr = name.partition(".") if name.startswith("transformers.") else (name, "", "")
    try:
        got = importlib.import_module(module)
        out[name] = "class" if attr and isinstance(getattr(got, attr), type) else got.__file__ or "namespace"
    except Exception as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


def _import_all(names: list[str], cwd: Path, processes: int = 2) -> dict[str, str]:
    """Imports each top-level name in ``python -c`` run from ``cwd`` (so cwd is first on sys.path),
    the names shared out among ``processes`` such processes run at once."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONSAFEPATH": ""}

    def run(part: list[str]) -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_ALL, *part],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    parts = [names[i::processes] for i in range(processes)]
    with ThreadPoolExecutor(processes) as pool:
        return {name: where for found in pool.map(run, parts) for name, where in found.items()}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _venv_top_levels() -> dict[str, set[str]]:
    """Top-level import name -> names of the distributions in this venv's site-packages that
    provide it (other tests may add folders such as Debian's dist-packages to sys.path)."""
    paths = sysconfig.get_paths()
    owners: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions(path=sorted({paths["purelib"], paths["platlib"]})):
        declared = (dist.read_text("top_level.txt") or "").split()
        inferred = {
            f.parts[0].removesuffix(".py") for f in dist.files or () if len(f.parts) > 1 or f.suffix == ".py"
        }
        for name in declared or inferred:
            owners.setdefault(name, set()).add(_normal(dist.metadata["Name"]))
    return owners


def _locked_import_names() -> list[str]:
    """Top-level import names of the distributions pinned in requirements/dev.lock."""
    locked = {
        _normal(line.split("==")[0])
        for line in (ROOT / "requirements" / "dev.lock").read_text().splitlines()
        if re.match(r"^[A-Za-z0-9]", line)
    }
    return sorted(
        name
        for name, dists in _venv_top_levels().items()
        if name.isidentifier() and not name.startswith("_") and dists & locked
    )


def test_bare_folder_names_never_import_the_repository_folders():
    """From the root, ``import kernels`` gets the installed distribution or nothing, never the folder."""
    owners = _venv_top_levels()
    for name, where in _import_all(list(FOLDERS), ROOT).items():
        if name in owners:
            assert Path(where).parent.parent != ROOT, (name, where)
            assert Path(where).is_relative_to(sys.prefix), (name, where)
        else:
            assert where == "ModuleNotFoundError", (name, where)


def test_every_locked_library_imports_from_the_repository_root_as_from_elsewhere():
    """``python -c`` from the root (the root first on sys.path) imports each library of the lock,
    transformers' Gemma 3 and Llama classes and Hugging Face's kernels included, from where
    the rest of sys.path holds it."""
    assert "kernels" in importlib.metadata.packages_distributions(), (
        "the lock installs Hugging Face's kernels"
    )
    names = _locked_import_names()
    assert {"transformers", "kernels", "torch", "zmq"} <= set(names)
    found = _import_all([*names, "transformers.Gemma3ForCausalLM", "transformers.LlamaForCausalLM"], ROOT)
    for name in names:
        spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if _outside(p)])
        assert spec is not None and found[name] == (spec.origin or "namespace"), (name, found[name])
    assert found["transformers.Gemma3ForCausalLM"] == found["transformers.LlamaForCausalLM"] == "class"


def _outside(entry: str) -> bool:
    """Whether a sys.path entry is not the repository root."""
    return Path(entry or ".").resolve() != ROOT


def test_this_test_process_sees_the_installed_kernels():
    kernels = importlib.import_module("kernels")  # pytest runs from the repository root

    assert Path(kernels.__file__).resolve().parent.parent != ROOT
    assert "CUDAProperties" in dir(kernels)
