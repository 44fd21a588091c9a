"""MachineFingerprint: what decides the bits an engine instance computes, as its heartbeats carry it.

Two instances whose ``digest`` differs may give different bits for the same work, so exact
failover and exact prefix hits with a pulled SWA state cannot hold between them. The fields are
collected by :func:`dsi.engine.fingerprint.machine_fingerprint`, which says what each one means.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

_FAMILIES = ("avx512", "amx")  # flags shown grouped by ``isa_summary``: avx512{f,bw,...}
DIGEST_CHARS = 12


class MachineFingerprint(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One process's compute environment; build it with ``of`` so that ``digest`` matches.

    ``isa``: the features of ``dsi.engine.fingerprint.ISA_FLAGS`` this CPU has, in that order. ``mkl`` / ``onednn``:
    versions as torch reports them, "" when torch has none (oneDNN built but switched off:
    ``"<version> (disabled)"``). ``native``: kernel name -> whether its C library is built.
    ``env``: the variables of ``dsi.engine.fingerprint.ISA_ENV`` that are set. ``engine``: what else
    decides the KV bytes of an engine that is not dsi's own ("" for dsi's): for vLLM its version,
    model, dtype, block size and KV layout (see dsi.vllm.layout), since its KV pages are portable
    only between instances that agree on all of them. ``digest``: ``DIGEST_CHARS`` hex chars of a
    sha256 over every field but ``digest`` and ``cpu_model``.
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
    engine: str = ""

    @classmethod
    def of(cls, **fields: Any) -> MachineFingerprint:
        """The fingerprint of `fields` (every field but ``digest``), with its digest."""
        probe = cls(digest="", **fields)
        return msgspec.structs.replace(probe, digest=_digest(probe))

    def with_engine(self, engine: str) -> MachineFingerprint:
        """This fingerprint with ``engine`` set (and the digest that covers it)."""
        fields = msgspec.structs.asdict(self)
        del fields["digest"]
        return MachineFingerprint.of(**{**fields, "engine": engine})

    def deciding(self) -> dict[str, Any]:
        """The fields that decide the bits (every field but ``digest`` and ``cpu_model``)."""
        fields = msgspec.structs.asdict(self)
        del fields["digest"], fields["cpu_model"]
        if not fields["engine"]:  # dsi's own engine: the digest is the one it had before the field
            del fields["engine"]
        return fields

    def differences(self, other: MachineFingerprint) -> list[str]:
        """Names of the deciding fields in which `other` differs from this one."""
        mine, theirs = msgspec.structs.asdict(self), msgspec.structs.asdict(other)
        return [name for name in mine if name not in ("digest", "cpu_model") and mine[name] != theirs[name]]

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


def _digest(fp: MachineFingerprint) -> str:
    encoded = msgspec.json.encode(fp.deciding(), order="sorted")
    return hashlib.sha256(encoded).hexdigest()[:DIGEST_CHARS]
