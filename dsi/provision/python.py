"""role_python: which interpreter runs a role's process.

Every role runs under this interpreter, except a prefill or decode with ``engine = "vllm"``:
vLLM lives in an environment of its own (its pins conflict with dsi's, see requirements/), with
dsi installed into it. That one is ``[roles.vllm] python`` when set; else this interpreter when
it has vLLM; else ``.venv-vllm`` beside dsi's source tree, when dsi runs from one (``make
venv-vllm`` builds it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from dsi.config import EngineOptions, NodeConfig
from dsi.config.vllm import VllmOptions
from dsi.paths import source_root

_SOURCE_ROOT = source_root()
VLLM_VENV = _SOURCE_ROOT / ".venv-vllm" if _SOURCE_ROOT is not None else None  # None from a wheel


class NoVllm(ValueError):
    """No interpreter with vLLM for a role that needs one."""


def vllm_python(options: VllmOptions) -> Path:
    """The interpreter for a vLLM role; NoVllm when there is none."""
    if options.python is not None:
        if not options.python.exists():
            raise NoVllm(f"[roles.vllm] python: {options.python} does not exist")
        return options.python
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    if VLLM_VENV is not None and (VLLM_VENV / "bin" / "python").exists():
        return VLLM_VENV / "bin" / "python"
    build = f"run `make venv-vllm` (it builds {VLLM_VENV}) or " if VLLM_VENV is not None else ""
    raise NoVllm(f"no Python with vLLM: {build}set [roles.vllm] python")


def role_python(cfg: NodeConfig, role_id: str) -> str:
    """The interpreter of role ``role_id``'s process (see the module docstring)."""
    role = next((r for r in cfg.roles if r.id == role_id), None)
    options = role.options if role is not None else None
    if isinstance(options, EngineOptions) and options.engine == "vllm":
        return str(vllm_python(options.vllm))
    return sys.executable
