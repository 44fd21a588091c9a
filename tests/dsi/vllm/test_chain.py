"""Which hash chain vLLM instances use, and which one the entrypoint predicts hits on."""

from __future__ import annotations

from dsi.kvcache.hashchain import HashChain
from dsi.messages.control import InstanceInfo, Load
from dsi.vllm.chain import majority_chain, vllm_chain
from tests.fingerprints import fingerprint

DSI = HashChain(5, "tiny", block_size=128)
VLLM_A = fingerprint(engine="vllm 0.32 SmolLM2 float32 avx512")
VLLM_B = fingerprint(engine="vllm 0.32 SmolLM2 float32 avx2", isa=("avx2", "fma"))


def _info(i: int, role: str = "decode", fp=None, state: str = "serving") -> InstanceInfo:
    return InstanceInfo(f"{role}-{i}", role, "h", 1, "tcp://x", state, Load(), 0.0, 0.0, fingerprint=fp)


def test_vllm_chains_differ_by_fingerprint_and_never_equal_dsis():
    a = vllm_chain(5, "SmolLM2", VLLM_A, 128)
    assert a == vllm_chain(5, "SmolLM2", VLLM_A, 128)
    assert a.hashes(range(256)) != vllm_chain(5, "SmolLM2", VLLM_B, 128).hashes(range(256))
    assert a.hashes(range(256)) != HashChain(5, "SmolLM2", block_size=128).hashes(range(256))


def test_the_entrypoint_hashes_on_the_chain_most_serving_engines_use():
    vllm = [_info(0, fp=VLLM_A), _info(1, "prefill", VLLM_A), _info(2, fp=VLLM_B)]
    assert majority_chain(DSI, vllm, 5, "SmolLM2", 128) == vllm_chain(5, "SmolLM2", VLLM_A, 128)
    dsi_engines = [_info(3, fp=fingerprint()), _info(4), _info(5, "prefill")]
    assert majority_chain(DSI, vllm + dsi_engines, 5, "SmolLM2", 128) == DSI  # 3 dsi, 2 + 1 vLLM


def test_only_serving_engine_instances_vote():
    others = [
        _info(0, "kvstore", VLLM_A),
        _info(1, fp=VLLM_A, state="draining"),
        _info(2, fp=VLLM_A, state="dead"),
    ]
    assert majority_chain(DSI, others, 5, "SmolLM2", 128) == DSI
    assert majority_chain(DSI, [], 5, "SmolLM2", 128) == DSI
