"""MachineFingerprint: what decides the bits an engine instance computes on this machine.

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
import hashlib
import os
import platform
import re
from pathlib import Path
from typing import Any

import msgspec

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
_FAMILIES = ("avx512", "amx")  # flags shown grouped by ``isa_summary``: avx512{f,bw,...}
DIGEST_CHARS = 12


class MachineFingerprint(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One process's compute environment; build it with ``of`` so that ``digest`` matches.

    ``isa``: the features of ``ISA_FLAGS`` this CPU has, in that order. ``mkl`` / ``onednn``:
    versions as torch reports them, "" when torch has none (oneDNN built but switched off:
    ``"<version> (disabled)"``). ``native``: kernel name -> whether its C library is built.
    ``env``: the variables of ``ISA_ENV`` that are set. ``digest``: ``DIGEST_CHARS`` hex chars
    of a sha256 over every field but ``digest`` and ``cpu_model``.
    """

    digest: str
    arch: str
    isa: tuple[str, ...]
    cpu_capability: str
    torch: str
    mkl: str
    onednn: str
    threads: int
    native: dict[str, bool]
    env: dict[str, str]
    cpu_model: str = ""

    @classmethod
    def of(cls, **fields: Any) -> MachineFingerprint:
        """The fingerprint of `fields` (every field but ``digest``), with its digest."""
        probe = cls(digest="", **fields)
        return msgspec.structs.replace(probe, digest=_digest(probe))

    def deciding(self) -> dict[str, Any]:
        """The fields that decide the bits (every field but ``digest`` and ``cpu_model``)."""
        fields = msgspec.structs.asdict(self)
        del fields["digest"], fields["cpu_model"]
        return fields

    def differences(self, other: MachineFingerprint) -> list[str]:
        """Names of the deciding fields in which `other` differs from this one."""
        mine, theirs = self.deciding(), other.deciding()
        return [name for name in mine if mine[name] != theirs[name]]

    def isa_summary(self) -> str:
        """The ISA features in short, e.g. ``avx2 fma avx512{f,bw,vl,vnni} amx{tile,bf16}``."""
        words: list[str] = []
        groups: dict[str, list[str]] = {}
        for flag in self.isa:
            family = next((f for f in _FAMILIES if flag.startswith(f)), None)
            if family is None:
                words.append(flag)
                continue
            if family not in groups:
                groups[family] = []
                words.append(family)
            groups[family].append(flag[len(family) :].lstrip("_"))
        return " ".join(f"{w}{{{','.join(groups[w])}}}" if w in groups else w for w in words) or "-"

    def short(self) -> str:
        """The first 8 digest chars and the ISA summary, e.g. ``3fa9c2d1 avx2 fma``."""
        return f"{self.digest[:8]} {self.isa_summary()}"


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


def _digest(fp: MachineFingerprint) -> str:
    encoded = msgspec.json.encode(fp.deciding(), order="sorted")
    return hashlib.sha256(encoded).hexdigest()[:DIGEST_CHARS]


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
