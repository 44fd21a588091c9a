"""The cores a CPU build of vLLM binds its OpenMP threads to: ``[roles.vllm] cpu_threads``.

Forms (one per tensor-parallel rank, separated by ``|``, as vLLM's ``VLLM_CPU_OMP_THREADS_BIND``):

- ``"auto"``: vLLM's own choice (one NUMA node per rank; dsi sets nothing);
- ``"nobind"``: no binding; OpenMP uses every core the process may run on;
- ``"0-3,8"``: these CPU ids, as the kernel numbers them;
- ``"@0-1"``: positions in the sorted list of CPUs this process may run on
  (``os.sched_getaffinity``): ``"@0"`` is the first allowed CPU whatever its id. A config that
  splits the cores between several vLLM roles this way runs unchanged in a container whose
  cpuset is ``4-7``, where ``"0"`` would name a CPU the container cannot use.

``check_spelling`` is the config-time check; ``resolve_cores`` turns a spec into the value of
``VLLM_CPU_OMP_THREADS_BIND`` on this host, or says which CPUs the spec names that the process
may not run on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


class CoresUnavailable(ValueError):
    """A ``cpu_threads`` spec that names CPUs this process may not run on."""


def check_spelling(value: Any, _seen: Any = None) -> str | None:
    """None when ``value`` is a cpu_threads spec, else why not (a config check)."""
    if value in ("auto", "nobind"):
        return None
    for rank in str(value).split("|"):
        if not _LIST.match(rank.removeprefix("@")) or any(a > b for a, b in _ranges(rank)):
            return (
                f'expected "auto", "nobind", CPU ids such as "0-3,8" or positions among the allowed '
                f'CPUs such as "@0-1" (ranks separated by "|"), got {value!r}'
            )
    return None


def resolve_cores(spec: str, allowed: Iterable[int]) -> str | None:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` value for ``spec`` on a process allowed to run on
    ``allowed`` CPU ids (None for "auto": vLLM decides). CoresUnavailable when an id is not
    allowed or a position is past the allowed list."""
    if spec == "auto":
        return None
    if spec == "nobind":
        return spec
    cpus = sorted(set(allowed))
    ranks = []
    for rank in spec.split("|"):
        wanted = [i for a, b in _ranges(rank) for i in range(a, b + 1)]
        if rank.startswith("@"):
            past = [p for p in wanted if p >= len(cpus)]
            if past:
                raise CoresUnavailable(
                    f"cpu_threads {spec!r}: position {past[0]} is past the {len(cpus)} CPUs "
                    f"this process may run on ({_spell(cpus)})"
                )
            wanted = [cpus[p] for p in wanted]
        else:
            missing = sorted(set(wanted) - set(cpus))
            if missing:
                raise CoresUnavailable(
                    f"cpu_threads {spec!r}: CPU {_spell(missing)} is not among the CPUs this "
                    f'process may run on ({_spell(cpus)}); positions such as "@0" name the allowed ones'
                )
        ranks.append(_spell(wanted))
    return "|".join(ranks)


def _ranges(rank: str) -> list[tuple[int, int]]:
    out = []
    for part in rank.removeprefix("@").split(","):
        a, _, b = part.partition("-")
        out.append((int(a), int(b or a)))
    return out


def _spell(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (kept in the given order)."""
    parts: list[str] = []
    start = prev = None
    for i in ids:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
