"""Where dsi finds the files it does not make: what it ships, the traces beside it, its working tree.

The one module that knows both layouts dsi runs from::

    from a wheel                                 from a source checkout (editable install)
    site-packages/dsi/paths.py                   <repo>/dsi/paths.py
    site-packages/dsi/configs/*.toml             <repo>/configs/*.toml
    site-packages/dsi/requirements/vllm.lock     <repo>/requirements/vllm.lock
    $DSI_TRACES_DIR                              $DSI_TRACES_DIR, else <repo>/../shared/data/traces

A shipped file (setup.py's PACKAGE_DATA) is read from the package first, then from the checkout.
The Mooncake traces are no part of dsi: a command takes ``--trace PATH``, else the directory
``$DSI_TRACES_DIR`` names, else the checkout's sibling ``shared/data/traces``; from a wheel with
neither it stops with :class:`MissingPath`, which says what to pass. What a command writes goes
under the current directory (``run/...``), never into the package.

dsi's configs give their paths relative to their own directory, as ``../run/...``: the
repository's ``run/``. So :func:`config` hands out a wheel's config as a copy in
``./run/configs/`` whose ``../run/`` is rewritten to ``../``: its model and store directories
land in ``./run/``, where a checkout run from its root puts them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TRACES_ENV = "DSI_TRACES_DIR"
CONVERSATION_TRACE = "mooncake_conversation_trace.jsonl"  # in the traces directory
# where a --trace option's default comes from, for its help
TRACE_DEFAULT = (
    f"{CONVERSATION_TRACE} in ${TRACES_ENV}, else beside a source checkout in ../shared/data/traces"
)
_PACKAGE = Path(__file__).resolve().parent
_RUN_PATH = re.compile(r'"\.\./run/')  # a config's path into the repository's run/


class MissingPath(FileNotFoundError):
    """A file or directory dsi needs is not where it looks; the message says what to pass or set."""


def source_root() -> Path | None:
    """The repository when dsi runs from a source checkout (setup.py and pyproject.toml beside
    dsi/), else None."""
    root = _PACKAGE.parent
    return root if (root / "setup.py").is_file() and (root / "pyproject.toml").is_file() else None


def shipped(relative: str) -> Path:
    """A file dsi ships, named as in the repository (``requirements/vllm.lock``): the installed
    package's copy, else the checkout's; MissingPath when neither has it."""
    for root in (_PACKAGE, source_root()):
        if root is not None and (root / relative).is_file():
            return root / relative
    raise MissingPath(
        f"dsi's {relative} is in neither {_PACKAGE} nor a source checkout: reinstall dsi "
        "(its wheel carries configs/*.toml and requirements/vllm.lock)"
    )


def config(name: str) -> Path:
    """dsi's ``configs/<name>`` as a file whose ``../run/`` paths mean the working tree's
    ``run/`` (see the module docstring): the checkout's own file, or a fresh copy of the
    package's in ``./run/configs/`` (rewritten on every call)."""
    path = shipped(f"configs/{name}")
    if not path.is_relative_to(_PACKAGE):
        return path
    copy = Path.cwd() / "run" / "configs" / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    head = f"# dsi's configs/{name} ({path}), its ../run/ paths read from this run/ directory\n"
    copy.write_text(head + _RUN_PATH.sub('"../', path.read_text()))
    return copy


def traces_dir() -> Path:
    """``$DSI_TRACES_DIR``, else ``shared/data/traces`` beside a source checkout; MissingPath
    (naming ``--trace`` and the variable) when neither is there."""
    named = os.environ.get(TRACES_ENV)
    if named:
        return Path(named)
    root = source_root()
    beside = root.parent / "shared" / "data" / "traces" if root is not None else None
    if beside is not None and beside.is_dir():
        return beside
    where = f"{beside} does not exist" if beside is not None else "dsi runs from a wheel, not a checkout"
    raise MissingPath(
        f"no Mooncake trace: pass --trace PATH, or set {TRACES_ENV} to the directory that holds "
        f"{CONVERSATION_TRACE} ({where})"
    )


def trace(name: str = CONVERSATION_TRACE) -> Path:
    """The Mooncake trace ``name`` in :func:`traces_dir`."""
    return traces_dir() / name
