"""ConfigError, and Where: the place in a config file that a value came from."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class ConfigError(Exception):
    """A config that cannot be used. `str(err)` is ``"{file}: {key}: {reason}"``.

    `key` is the dotted TOML key, such as ``roles[2].bind`` or ``cluster.heartbeat_interval_s``;
    ``<toml>`` for a syntax error and ``<file>`` for a file that cannot be read.
    """

    def __init__(self, file: str, key: str, reason: str) -> None:
        # All three in args, so that the error pickles and crosses process boundaries intact.
        super().__init__(file, key, reason)
        self.file = file
        self.key = key
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.reason}"


@dataclass(slots=True, frozen=True)
class Where:
    """A dotted key in one file, and the directory that relative paths in that file start from."""

    file: str
    base: Path
    key: str = ""

    def at(self, name: str) -> Where:
        part = name if _BARE_KEY.fullmatch(name) else json.dumps(name)
        return Where(self.file, self.base, f"{self.key}.{part}" if self.key else part)

    def item(self, index: int) -> Where:
        return Where(self.file, self.base, f"{self.key}[{index}]")

    def error(self, reason: str) -> ConfigError:
        return ConfigError(self.file, self.key or "<root>", reason)

    def resolve(self, path: Path) -> Path:
        """`path` made absolute against the config file's directory, with `..` folded away."""
        return Path(os.path.normpath(self.base / path))
