"""dsi.paths: shipped files from the package or the checkout, traces from an option, a variable or
the checkout's sibling; and a wheel installed outside the repository runs ``dsi bench``."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from dsi import paths
from dsi.bench.cli import _BENCHES
from dsi.config import load_config

REPO = Path(__file__).resolve().parents[2]
# What setup.py builds from: its packages' folders (import name -> folder) and the data folders.
FOLDERS = {
    "dsi": "dsi",
    "dsi.transport": "transport",
    "dsi.roles": "roles",
    "dsi.kvcache": "kvcache",
    "dsi.kernels": "kernels",
}
BUILD_FILES = ("setup.py", "pyproject.toml", "README.md")
DATA_FOLDERS = ("configs", "requirements")
# A path computed from where a module sits, or from the repository's layout.
REPO_PATH = re.compile(
    r"parents\[\d+\]|\.parent\.parent|shared/data|/ \"(configs|requirements)\"|Path\(\"configs/"
)
# The only modules that may: dsi.paths, and folders.step_aside (which finds the root to leave it
# off sys.path when a folder is imported under its bare name).
MAY_FIND_THE_REPO = {"dsi/paths.py", "dsi/folders.py"}


@pytest.fixture
def wheel_layout(tmp_path, monkeypatch):
    """dsi.paths as if installed: a package directory with configs/ and no checkout around it;
    the current directory a fresh working directory."""
    package = tmp_path / "site-packages" / "dsi"
    (package / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "local.toml", package / "configs" / "local.toml")
    monkeypatch.setattr(paths, "_PACKAGE", package)
    monkeypatch.delenv(paths.TRACES_ENV, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_every_benchmark_imports():
    for name in _BENCHES:
        importlib.import_module(name)


def test_every_folder_of_modules_is_a_package():
    """find_packages (setup.py) leaves a folder without __init__.py out of the wheel."""
    for folder in FOLDERS.values():
        for init in sorted((REPO / folder).rglob("*.py")):
            assert (init.parent / "__init__.py").is_file(), f"{init.parent} has no __init__.py"


def test_no_module_finds_files_from_the_repository_but_dsi_paths():
    found = []
    for folder in FOLDERS.values():
        for path in sorted((REPO / folder).rglob("*.py")):
            name = str(path.relative_to(REPO))
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if REPO_PATH.search(line) and name not in MAY_FIND_THE_REPO:
                    found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_in_the_checkout_shipped_files_and_configs_are_the_repositorys():
    assert paths.source_root() == REPO
    assert paths.shipped("requirements/vllm.lock") == REPO / "requirements" / "vllm.lock"
    assert paths.config("vllm.toml") == REPO / "configs" / "vllm.toml"  # no copy: ../run is run/


def test_from_a_wheel_a_config_is_a_copy_whose_run_paths_are_the_working_directorys(wheel_layout):
    assert paths.source_root() is None
    copy = paths.config("local.toml")
    assert copy == wheel_layout / "run" / "configs" / "local.toml"
    cfg = load_config(copy)
    assert cfg.model.dir == wheel_layout / "run" / "models" / "tiny"
    assert "../run/" not in copy.read_text().split("\n", 1)[1]
    with pytest.raises(paths.MissingPath, match="reinstall dsi"):
        paths.shipped("requirements/vllm.lock")


def test_traces_come_from_the_variable_else_the_checkout_else_an_error_naming_both(wheel_layout, monkeypatch):
    with pytest.raises(paths.MissingPath, match=rf"--trace PATH.*{paths.TRACES_ENV}"):
        paths.trace()
    monkeypatch.setenv(paths.TRACES_ENV, str(wheel_layout))
    assert paths.trace() == wheel_layout / paths.CONVERSATION_TRACE
    monkeypatch.delenv(paths.TRACES_ENV)
    monkeypatch.setattr(paths, "_PACKAGE", REPO / "dsi")  # the checkout again
    beside = REPO.parent / "shared" / "data" / "traces"
    if beside.is_dir():
        assert paths.traces_dir() == beside
    else:
        with pytest.raises(paths.MissingPath, match=f"{beside} does not exist"):
            paths.traces_dir()


def _build_wheel(tmp_path: Path) -> Path:
    """dsi's wheel, built from a copy of what setup.py reads (the checkout is left as it is)."""
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in (*FOLDERS.values(), *DATA_FOLDERS):
        shutil.copytree(REPO / folder, source / folder, ignore=skip)
    for name in BUILD_FILES:
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w"]
    built = subprocess.run([*pip, str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {built.stderr[-400:]}")
    [wheel] = (tmp_path / "dist").glob("dsi-*.whl")
    return wheel


def test_an_installed_wheel_runs_dsi_bench_outside_the_repository(tmp_path):
    wheel = _build_wheel(tmp_path)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:  # what `pip install --no-deps --target` unpacks
        archive.extractall(site)
    assert (site / "dsi" / "configs" / "vllm.toml").is_file()
    assert (site / "dsi" / "requirements" / "vllm.lock").is_file()
    work = tmp_path / "work"
    work.mkdir()
    # -S: no site-packages .pth files, so the checkout's editable install cannot fill in for
    # what the wheel lacks; the dependencies come from this venv's site-packages.
    deps = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if k != paths.TRACES_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(site), deps])
    check = textwrap.dedent(
        f"""
        import sys
        import dsi
        from dsi import paths
        from dsi.bench.vllm_cluster_config import source_config
        from dsi.cli.main import build_parser, main
        from dsi.config import load_config
        assert dsi.__file__.startswith({str(site)!r}), dsi.__file__
        assert paths.source_root() is None
        assert str(paths.shipped("requirements/vllm.lock")).startswith({str(site)!r})
        build_parser("bench")  # every benchmark registers
        assert main(["bench", "trace-hits", "--limit", "10"]) == 2  # no trace named
        print(load_config(source_config()).model.dir)
        outside = [n for n, m in sys.modules.items() if n.startswith("dsi") and m.__file__ is not None
                   and not m.__file__.startswith({str(site)!r})]
        assert not outside, outside
        """
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", check], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(work / "run" / "models" / "smollm2-135m-instruct")
    assert "--trace PATH" in run.stderr and paths.TRACES_ENV in run.stderr
    assert not (site / "dsi" / "run").exists()  # nothing written into the package
