"""C kernels of this package, compiled once per machine into a cached shared library.

``library("paged_attention")`` compiles ``kernels/paged_attention.c`` (with the headers of its
folder, such as ``simd16.h``, on the include path) with the system C compiler
(``$CC``, else ``cc``) for the CPU it runs on (``-O3 -march=native``) and loads it with ctypes::

    <cache>/paged_attention-<sha256 of source, headers, flags, compiler, CPU flags>.so

``<cache>`` is ``$DSI_KERNEL_CACHE``, else ``~/.cache/dsi/kernels``. A library is written under a
temporary name and renamed into place, so processes that start together (a cluster's roles) may
build it at once. No compiler, or a failed build: ``library`` returns None and ``why_not`` says
why; callers then use their torch reference, whose results differ in bits from the C kernel's (a
warning says so, once per process and kernel). ``names()`` lists the kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

FLAGS = (
    "-O3",
    "-march=native",
    "-std=c11",
    "-ffp-contract=fast",
    "-fno-math-errno",
    "-fPIC",
    "-shared",
    "-pthread",
)
_HERE = Path(__file__).parent

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("DSI_KERNEL_CACHE") or Path.home() / ".cache" / "dsi" / "kernels")


def _cpu_signature() -> str:
    """The CPU's model and feature flags (what ``-march=native`` compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return platform.machine() + "\n".join(sorted(set(lines)))


def names() -> tuple[str, ...]:
    """The C kernels of this package: the names of ``kernels/*.c``, sorted."""
    return tuple(sorted(source.stem for source in _HERE.glob("*.c")))


@functools.cache
def _build(name: str) -> tuple[ctypes.CDLL | None, str]:
    lib, why = _compile(name)
    if lib is None:
        log.warning(
            "C kernel %s unavailable (%s): its callers use their torch reference, whose results "
            "differ in bits from instances that run the C kernel",
            name,
            why,
        )
    return lib, why


def _compile(name: str) -> tuple[ctypes.CDLL | None, str]:
    source = _HERE / f"{name}.c"
    compiler = os.environ.get("CC", "cc")
    digest = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(_HERE.glob("*.h"))]  # what a source may include
    for part in (
        source.read_bytes(),
        *headers,
        " ".join(FLAGS).encode(),
        compiler.encode(),
        _cpu_signature().encode(),
    ):
        digest.update(part)
    target = cache_dir() / f"{name}-{digest.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
            os.close(fd)
            done = subprocess.run(
                [compiler, *FLAGS, f"-I{_HERE}", "-o", tmp, str(source), "-lm"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode:
                os.unlink(tmp)
                return None, f"{compiler} failed on {source.name}: {done.stderr.strip()[-300:]}"
            os.replace(tmp, target)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"cannot build {source.name}: {exc}"
    try:
        return ctypes.CDLL(str(target)), ""
    except OSError as exc:
        return None, f"cannot load {target}: {exc}"


def library(name: str) -> ctypes.CDLL | None:
    """The loaded library of ``kernels/<name>.c``, built on first use; None if it cannot be."""
    if os.environ.get("DSI_NATIVE_KERNELS", "1") == "0":
        return None
    return _build(name)[0]


def why_not(name: str) -> str:
    """Why ``library(name)`` is None ("" when it is not)."""
    if os.environ.get("DSI_NATIVE_KERNELS", "1") == "0":
        return "DSI_NATIVE_KERNELS=0"
    return _build(name)[1]


def output(out, rows: int, width: int):
    """The result tensor of a kernel that writes ``rows`` rows of ``width`` fp32 values: ``out``
    when given (fp32 [rows, width] with contiguous rows, such as a row range of a larger result;
    ValueError otherwise), else a new one."""
    import torch

    if out is None:
        return torch.empty(rows, width)
    if (
        out.shape != (rows, width)
        or out.dtype != torch.float32
        or out.stride(1) != 1
        or out.stride(0) != width
    ):
        raise ValueError(f"out must be fp32 [{rows}, {width}] with contiguous rows")
    return out
