"""The top-level source folders are dsi's subpackages, never top-level packages of their own.

``kernels/``, ``transport/``, ``roles/`` and ``kvcache/`` install as ``dsi.kernels``, ``dsi.transport``,
``dsi.roles`` and ``dsi.kvcache``. Whenever Python runs from the repository root (``python -c``,
``python -m``, pytest's default import mode), the root is first on ``sys.path`` and each folder
would also be found as the top-level package of its bare name, hiding an installed distribution
that owns that name: transformers imports Hugging Face's ``kernels``. Each folder's ``__init__``
therefore starts with :func:`step_aside`: imported under its bare name, it loads the package that
the rest of ``sys.path`` holds in its place, or fails as if the folder were not there::

    python -c 'import kernels'      (cwd = repository root)
      -> kernels/__init__.py runs as "kernels"
      -> step_aside: sys.path without the root -> site-packages/kernels/__init__.py
      -> sys.modules["kernels"] is Hugging Face's package; the import returns it
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

FOLDERS = ("kernels", "transport", "roles", "kvcache")


def step_aside(name: str, init_file: str) -> None:
    """Called first by a folder's ``__init__`` with its ``__name__`` and ``__file__``.

    As ``dsi.<folder>`` it does nothing. As the bare top-level ``<folder>`` it replaces itself in
    ``sys.modules`` with the package of that name found on ``sys.path`` outside the repository,
    or raises ModuleNotFoundError when there is none.
    """
    if "." in name:
        return
    root = Path(init_file).resolve().parent.parent
    path = [entry for entry in sys.path if _resolved(entry) != root]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(
            f"No module named {name!r} (the folder {root / name} is dsi.{name}, not {name!r})", name=name
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except OSError:
        return None
