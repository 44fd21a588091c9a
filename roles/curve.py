"""CURVE keys from a node's [security] section (None when curve is off)."""

from __future__ import annotations

from pathlib import Path

from dsi.config import SecurityConfig
from dsi.transport.security import CurveKeys


def server_keys(security: SecurityConfig) -> CurveKeys | None:
    """Keys for a process that binds roles and also calls other roles."""
    if not security.curve:
        return None
    return CurveKeys.load(
        _path(security.server_public_key, "server_public_key"),
        _path(security.client_secret_key, "client_secret_key"),
        server_secret_key=_path(security.server_secret_key, "server_secret_key"),
        authorized_keys_dir=_path(security.authorized_keys_dir, "authorized_keys_dir"),
    )


def client_keys(security: SecurityConfig) -> CurveKeys | None:
    """Keys for a process that only calls (``dsi status``)."""
    if not security.curve:
        return None
    return CurveKeys.load(
        _path(security.server_public_key, "server_public_key"),
        _path(security.client_secret_key, "client_secret_key"),
    )


def _path(value: Path | None, key: str) -> Path:
    # The config reader already requires these keys when curve = true.
    if value is None:
        raise ValueError(f"security.{key} is required when curve = true")
    return value
