"""The hash chain of a vLLM instance's pages, and which chain an entrypoint predicts hits on.

A vLLM instance's KV bytes depend on its machine (the CPU build packs pages per instruction set),
vLLM version, model, dtype and layout: its fingerprint (``MachineFingerprint.engine`` non-empty,
see dsi.vllm.layout) names all of them, and its pages are hashed on a chain versioned by the
fingerprint's digest, so instances that could not load each other's pages never share one. The
entrypoint hashes a prompt before routing, on one chain: the one most serving engine instances
use (dsi's own engines use the model's chain, unversioned).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from dsi.kvcache.hashchain import HashChain
from dsi.messages.control import InstanceInfo
from dsi.messages.fingerprint import MachineFingerprint

ENGINE_ROLES = ("prefill", "decode")


def vllm_chain(root_seed: int, model: str, fingerprint: MachineFingerprint, block_size: int) -> HashChain:
    """The chain of the pages of vLLM instances with this fingerprint."""
    return HashChain(root_seed, model, f"vllm-{fingerprint.digest}", block_size=block_size)


def majority_chain(
    default: HashChain, instances: Iterable[InstanceInfo], root_seed: int, model: str, block_size: int
) -> HashChain:
    """The chain of most serving engine instances: ``default`` (dsi's engines) or a vLLM
    fingerprint's (ties go to ``default``, then to the smaller digest)."""
    votes: Counter[str] = Counter()
    prints: dict[str, MachineFingerprint] = {}
    for info in instances:
        if info.role not in ENGINE_ROLES or info.state != "serving":
            continue
        fp = info.fingerprint
        if fp is not None and fp.engine:
            votes[fp.digest] += 1
            prints[fp.digest] = fp
        else:
            votes[""] += 1
    if not votes:
        return default
    best = min(votes, key=lambda d: (-votes[d], d))  # "" (dsi's) sorts first among equals
    return default if best == "" else vllm_chain(root_seed, model, prints[best], block_size)
