"""MachineFingerprint values for tests: one machine's fields, any of them changed."""

from __future__ import annotations

from typing import Any

from dsi.messages.fingerprint import MachineFingerprint

FIELDS: dict[str, Any] = dict(
    arch="x86_64",
    isa=("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
    cpu_capability="AVX512",
    torch="2.13.0+cpu",
    mkl="2024.2-Product Build 20240605",
    onednn="3.12.0",
    threads=8,
    native={"paged_attention": True, "row_ops": True},
    env={},
    cpu_model="Intel(R) Xeon(R) Gold 6338",
)


def fingerprint(**changes: Any) -> MachineFingerprint:
    """The fingerprint of FIELDS with ``changes`` applied, its digest computed."""
    return MachineFingerprint.of(**{**FIELDS, **changes})
