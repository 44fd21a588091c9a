"""The cores a peer benchmark gives each system: ``--cores`` of ``dsi bench peers-served``.

Every system measured side by side runs on the same set of CPUs: the bench starts its top
process pinned there (``os.sched_setaffinity`` in the child before it runs), so every process it
starts (dsi's roles, vLLM's engine core and workers) inherits the set, and each system gets as
many compute threads as the set has cores. The spelling is that of
:mod:`dsi.vllm.cores` (``"0-3,8"``: CPU ids; ``"@0-1"``: positions among the CPUs this process may
run on), or ``"all"``: every CPU this process may run on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from dsi.vllm.cores import CoresUnavailable, check_spelling, resolve_cores


def cores_of(spec: str, allowed: Iterable[int] | None = None) -> list[int]:
    """The sorted CPU ids ``spec`` names among ``allowed`` (default: this process's affinity).
    ValueError for a bad spelling; CoresUnavailable for CPUs the process may not run on."""
    allowed = sorted(set(allowed if allowed is not None else os.sched_getaffinity(0)))
    if spec == "all":
        return allowed
    if "|" in spec or spec in ("auto", "nobind") or check_spelling(spec) is not None:
        raise ValueError(
            f'--cores: expected "all", CPU ids such as "0-1" or positions such as "@0", got {spec!r}'
        )
    try:
        spelled = resolve_cores(spec, allowed)
    except CoresUnavailable as exc:
        raise CoresUnavailable(f"--cores {spec!r}: {str(exc).split(': ', 1)[1]}") from None
    assert spelled is not None
    return sorted({i for part in spelled.split(",") for i in _span(part)})


def first_cores(threads: int) -> range:
    """Cores 0 .. threads - 1 (as many as the machine has): where ``dsi bench peers`` runs each
    system with ``threads`` compute threads."""
    return range(min(threads, os.cpu_count() or 1))


def spell(cpus: Iterable[int]) -> str:
    """CPU ids as ``VLLM_CPU_OMP_THREADS_BIND`` takes them: ``"0,1,2"`` (one thread per id)."""
    return ",".join(str(c) for c in sorted(set(cpus)))


def pinned(cpus: Iterable[int]) -> Callable[[], None]:
    """A ``preexec_fn`` that pins the child (and so all it starts) to ``cpus``."""
    chosen = set(cpus)

    def pin() -> None:
        os.sched_setaffinity(0, chosen)

    return pin


def _span(part: str) -> range:
    a, _, b = part.partition("-")
    return range(int(a), int(b or a) + 1)


__all__ = ["CoresUnavailable", "cores_of", "first_cores", "pinned", "spell"]
