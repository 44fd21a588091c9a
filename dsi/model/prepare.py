"""Make sure a model directory exists: generate the seeded weights of a built-in shape once.

Several processes of one host may start at the same time (``dsi serve`` starts two decode
instances): an exclusive lock on ``<dir>.lock`` makes one of them write the weights into a
temporary directory and rename it into place; the others wait and then load it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from dsi.model.config import get_config
from dsi.model.vit import VISION_CONFIG, init_vision_weights, save_vision, vision_config_of
from dsi.model.weights import init_weights, save_model


def ensure_model(directory: Path, shape: str) -> Path:
    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    if shape != "tiny":
        raise ValueError(f"{directory} holds no model and the {shape!r} shape is too large to generate here")
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.with_name(directory.name + ".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "config.json").exists():
            cfg = get_config(shape)
            tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
            try:
                save_model(tmp, cfg, init_weights(cfg))
                vision = vision_config_of(shape)
                if vision is not None:
                    save_vision(tmp, vision, init_vision_weights(vision))
                if directory.exists():
                    shutil.rmtree(directory)  # an empty or partial directory left by a crash
                os.replace(tmp, directory)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return directory


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
            tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.vision.", dir=directory.parent))
            try:
                save_vision(tmp, vision, init_vision_weights(vision))
                for name in ("vision.safetensors", VISION_CONFIG):  # the config last: it marks completion
                    os.replace(tmp / name, directory / name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
