"""dsi bench hit-agreement: the figures describe its rows."""

from dsi.bench.hit_agreement import run


def test_hit_agreement_figures_follow_the_rows():
    out = run(prompts=3, tokens=4, min_len=100, max_len=400, seed=1)
    rows = out["rows"]
    assert len(rows) == 3 and out["exact_identical"] == 1.0
    for r in rows:
        assert r["hit"] == (r["prompt_tokens"] - 1) // 128 * 128
        assert 0 <= r["agreeing_tokens"] <= 4
        assert (r["replay_start"] == 0) == (
            r["hit"] <= 128 or r["prompt_tokens"] <= 140
        )  # window 128, keep 140
    assert out["bounded_identical"] == round(sum(r["agreeing_tokens"] == 4 for r in rows) / 3, 4)
    assert out["bounded_hits_with_replay"] == sum(r["replay_start"] > 0 for r in rows)
