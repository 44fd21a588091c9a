"""LocalBlocks: vLLM's KV events translated into dsi's page hashes."""

from __future__ import annotations

import msgspec

from dsi.kvcache.hashchain import HashChain, unpack
from dsi.vllm.events import LocalBlocks

BS = 4
CHAIN = HashChain(7, "m", "vllm-abc", block_size=BS)
PROMPT = list(range(100, 100 + 5 * BS))  # five full blocks


def _stored(hashes, parent, tokens, extra_keys=None) -> dict:
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
             "token_ids": tokens, "block_size": BS, "lora_id": None, "medium": "GPU"}  # fmt: skip
    if extra_keys is not None:
        event["extra_keys"] = extra_keys
    return event


def _frames(seq: int, *events: dict) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([1.5, list(events), None])]


def test_blocks_stored_in_two_steps_are_held_under_dsis_chain():
    local = LocalBlocks(CHAIN)
    local.receive(_frames(0, _stored([11, 12], None, PROMPT[: 2 * BS])))
    local.receive(_frames(1, _stored([13], 12, PROMPT[2 * BS : 3 * BS])))
    dsi = unpack(CHAIN.hashes(PROMPT))
    assert local.held(dsi) == 3 and len(local) == 3
    assert local.held(unpack(CHAIN.hashes(PROMPT, cache_salt="tenant"))) == 0


def test_a_removed_block_cuts_the_held_prefix_there():
    local = LocalBlocks(CHAIN)
    local.receive(_frames(0, _stored([11, 12, 13], None, PROMPT[: 3 * BS])))
    local.receive(_frames(1, {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}))
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 1
    local.receive(_frames(2, {"type": "AllBlocksCleared"}))
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 0 and len(local) == 0


def test_a_salted_first_block_roots_the_chain_at_the_salt():
    local = LocalBlocks(CHAIN)
    local.receive(_frames(0, _stored([21, 22], None, PROMPT[: 2 * BS], [("tenant",), None])))
    assert local.held(unpack(CHAIN.hashes(PROMPT, cache_salt="tenant"))) == 2
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 0


def test_blocks_of_an_unknown_parent_or_with_image_keys_are_left_out():
    local = LocalBlocks(CHAIN)
    local.receive(_frames(0, _stored([31], 99, PROMPT[BS : 2 * BS])))  # parent never stored
    local.receive(_frames(1, _stored([32, 33], None, PROMPT[: 2 * BS], [None, ("img-1", 0)])))
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 1  # the block before the image keys
    assert len(local) == 1


def test_lost_batches_are_counted_and_bad_messages_dropped():
    local = LocalBlocks(CHAIN)
    local.receive(_frames(0, _stored([11], None, PROMPT[:BS])))
    local.receive(_frames(4, _stored([12], 11, PROMPT[BS : 2 * BS])))
    assert local.gaps == 3 and local.seq == 4
    local.receive([b"", b"\x00" * 8, b"\xc1not msgpack"])
    local.receive([b"only one frame"])
    local.receive(_frames(5, "not a map", {"type": "BlockStored", "block_hashes": [1], "block_size": 3}))
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 2


def test_one_dsi_page_under_two_vllm_blocks_stays_held_until_both_go():
    local = LocalBlocks(CHAIN)
    local.receive(_frames(0, _stored([11], None, PROMPT[:BS]), _stored([41], None, PROMPT[:BS])))
    local.receive(_frames(1, {"type": "BlockRemoved", "block_hashes": [11]}))
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 1
    local.receive(_frames(2, {"type": "BlockRemoved", "block_hashes": [41]}))
    assert local.held(unpack(CHAIN.hashes(PROMPT))) == 0
