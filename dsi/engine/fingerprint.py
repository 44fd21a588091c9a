"""machine_fingerprint: what decides the bits an engine instance computes on this machine
(a :class:`dsi.messages.fingerprint.MachineFingerprint`, carried by its heartbeats).

Engines compute batch-invariantly, so a token's logits are the same bits whatever shares its
step. Exact failover (a re-run reproduces the delivered tokens) and exact prefix hits with a
pulled SWA state also need the *instances* to compute alike: the same kernels, picked by the
same libraries for the same CPU features, over the same number of threads. Two instances whose
``digest`` differs may give different bits for the same work.

Deciding fields (all in ``digest``): the CPU architecture and the ISA features from a fixed list
(``ISA_FLAGS``, as ``/proc/cpuinfo`` names them), ATen's CPU capability, the torch, MKL and
oneDNN versions torch reports, torch's intra-op thread count, which of dsi's C kernels
(``dsi.kernels.native``) are built, and the environment variables that cap MKL's or oneDNN's
instruction set. ``cpu_model`` is informational only.

``machine_fingerprint()`` collects it once per process (and once again if the thread count
changes); an engine role collects it after it has set its thread count, off the event loop (the
first call may build the C kernels).
"""

from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path

from dsi.messages.fingerprint import MachineFingerprint

# Features that change which kernels MKL, oneDNN, ATen and ``gcc -march=native`` use.
X86_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
)  # fmt: skip
ARM_FLAGS = ("asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "sme")
ISA_FLAGS = X86_FLAGS + ARM_FLAGS
# Environment variables that cap or pin the code path of MKL or oneDNN.
ISA_ENV = (
    "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
    "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
)  # fmt: skip


def machine_fingerprint() -> MachineFingerprint:
    """This process's fingerprint at torch's current thread count (collected once per count)."""
    import torch

    return _collect(torch.get_num_threads())


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, features of ``ISA_FLAGS`` in that order) from ``/proc/cpuinfo`` text.

    Features are those every CPU lists (x86 ``flags``, aarch64 ``Features``); the model is the
    first ``model name`` (aarch64: ``Hardware`` or ``CPU part``), "" when there is none.
    """
    model, common = "", None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            continue
        if key in ("flags", "Features"):
            words = set(value.split())
            common = words if common is None else common & words
        elif key in ("model name", "Hardware", "CPU part") and not model:
            model = value.strip()
    found = common or set()
    return model, tuple(flag for flag in ISA_FLAGS if flag in found)


def torch_libraries(config: str) -> tuple[str, str]:
    """(MKL version, oneDNN version) from ``torch.__config__.show()``; "" for one not listed.

    ``Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 ...`` gives
    ``2024.2-Product Build 20240605``; ``Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa710...)``
    gives ``3.12.0``.
    """
    mkl = re.search(r"Math Kernel Library Version (.+?)(?: for |$)", config, re.MULTILINE)
    onednn = re.search(r"(?:MKL-DNN|oneDNN) v(\S+)", config)
    return (mkl.group(1).strip() if mkl else "", onednn.group(1) if onednn else "")


@functools.cache
def _collect(threads: int) -> MachineFingerprint:
    import torch

    from dsi.kernels import native

    try:
        model, isa = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: no features known, only the architecture
        model, isa = platform.processor(), ()
    mkl, onednn = torch_libraries(torch.__config__.show())
    if onednn and not torch.backends.mkldnn.enabled:
        onednn += " (disabled)"
    return MachineFingerprint.of(
        arch=platform.machine(),
        isa=isa,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch=str(torch.__version__),
        mkl=mkl if torch.backends.mkl.is_available() else "",
        onednn=onednn if torch.backends.mkldnn.is_available() else "",
        threads=threads,
        native={name: native.library(name) is not None for name in native.names()},
        env={key: os.environ[key] for key in ISA_ENV if key in os.environ},
        cpu_model=model,
    )
