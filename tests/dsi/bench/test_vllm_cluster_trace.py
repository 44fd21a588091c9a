"""dsi bench vllm-cluster's workload: the trace slice, its scaling to words, the fixed batch."""

import json
from pathlib import Path

import pytest

from dsi import paths
from dsi.bench.vllm_cluster_trace import (
    Scaling,
    TraceRow,
    computed_floor,
    describe,
    fixed_batch,
    id_words,
    prompt_text,
    read_trace,
    select,
    vocabulary_words,
    workload,
)

WORDS = tuple(f"w{i:03d}" for i in range(500))


def _rows(*ids: tuple[int, ...], output: int = 100) -> list[TraceRow]:
    return [TraceRow(i * 1000, 512 * len(h), output, h) for i, h in enumerate(ids)]


ROWS = _rows(
    (0, 1, 2),  # 0
    (0, 3),  # 1
    (0, 1, 2, 4),  # 2: shares 3 ids with 0
    (0, 5),  # 3: shares only id 0 with the others: not a reuser
    (0, 3, 6),  # 4: shares 2 ids with 1
    (0, 1, 7),  # 5: shares 2 ids with 0
)


def test_a_reuser_comes_with_the_first_request_that_had_its_prefix_in_trace_order():
    assert select(ROWS, Scaling(requests=4)) == [0, 1, 2, 4]
    assert select(ROWS, Scaling(requests=5)) == [0, 1, 2, 4, 5]


def test_sharing_only_the_first_id_is_no_reuse():
    assert 3 not in select(ROWS, Scaling(requests=6))
    assert select(ROWS, Scaling(requests=6, min_shared_ids=3)) == [0, 2]


def test_a_pair_that_does_not_fit_is_skipped_for_one_that_does():
    # 3 requests: 0 and 2 first; 1 and 4 would make 4; 5 (source 0 taken) fits
    assert select(ROWS, Scaling(requests=3)) == [0, 2, 5]


def test_an_id_gives_the_same_words_every_time_and_ids_differ():
    assert id_words(7, 64, WORDS) == id_words(7, 64, WORDS)
    assert id_words(7, 64, WORDS) != id_words(8, 64, WORDS)
    assert set(id_words(7, 64, WORDS)) <= set(WORDS)


def test_prompts_share_exactly_their_shared_ids_words():
    scaling = Scaling(tokens_per_id=16)
    a = prompt_text((0, 1, 2), scaling, WORDS).split()
    b = prompt_text((0, 1, 9), scaling, WORDS).split()
    assert len(a) == len(b) == 48
    assert a[:32] == b[:32] and a[32:] != b[32:]


def test_workload_caps_prompts_and_outputs_and_counts_shared_ids():
    rows = _rows((0, 1, 2, 3, 4), (0, 1, 2, 3, 4, 5), output=50)
    scaling = Scaling(requests=2, tokens_per_id=8, max_prompt_tokens=32, max_output_tokens=24)
    first, second = workload(rows, scaling, WORDS)
    assert first.hash_ids == second.hash_ids == (0, 1, 2, 3)  # 32 words = 4 ids of 8
    assert len(first.text.split()) == 32 and first.text == second.text
    assert (first.shared_ids, second.shared_ids) == (0, 4)
    assert first.max_tokens == 24
    info = describe([first, second], rows, scaling, Path("t.jsonl"))
    assert info["prompts_capped"] == 2 and info["shared_word_fraction"] == 0.5
    assert info["scale"].startswith("1/64") and info["output_tokens"] == 48


def test_scaling_refuses_a_cap_below_one_id():
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        Scaling(tokens_per_id=64, max_prompt_tokens=32)
    with pytest.raises(ValueError, match="requests"):
        Scaling(requests=0)


def test_vocabulary_words_are_the_space_prefixed_lower_case_tokens(tmp_path):
    vocab = {"Ġcat": 1, "Ġdog": 2, "cat": 3, "ĠDog": 4, "Ġab": 5, "Ġelephantine": 6, "Ġhouse": 7}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    assert vocabulary_words(path) == ("cat", "dog", "house")


def test_fixed_batches_share_nothing():
    one = fixed_batch(4, 32, 16, WORDS, salt=0)
    two = fixed_batch(4, 32, 16, WORDS, salt=1)
    texts = [r.text for r in one + two]
    assert len(set(texts)) == 8 and all(len(t.split()) == 32 for t in texts)
    assert {r.max_tokens for r in one} == {16}


def test_the_shipped_trace_reads_and_yields_a_slice():
    try:
        trace = paths.trace()
    except paths.MissingPath as exc:
        pytest.skip(str(exc))
    rows = read_trace(trace, limit=400)
    assert len(rows) == 400 and rows[0].hash_ids[0] == 0
    requests = workload(rows, Scaling(requests=8), WORDS)
    assert len(requests) == 8
    assert [r.trace_index for r in requests] == sorted(r.trace_index for r in requests)
    assert any(r.shared_ids >= 2 for r in requests)


def test_the_floor_computes_what_no_block_cache_can_skip():
    rows = _rows((0, 1, 2, 3), (0, 1, 2, 3, 4), (0, 1, 2, 3, 4))
    scaling = Scaling(requests=3, tokens_per_id=64)
    requests = workload(rows, scaling, WORDS)  # 256, 320 and 320 words; then 4 and 5 ids shared
    # 30 template tokens: 286 computed; 350 - 256 (30 + 256 -> 2 blocks); 350 - 256 (the last
    # token is computed: 349 -> 2 blocks)
    assert computed_floor(requests, scaling, 30, 128) == round((286 + 94 + 94) / 3, 1)
    assert computed_floor([], scaling, 30, 128) == 0.0
