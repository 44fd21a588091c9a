"""``dsi bench engine`` on a tiny budget: every figure is there, the invariance cost from its pairs."""

from dsi.bench import engine


def test_the_engine_bench_reports_each_figure_and_the_invariance_cost_of_its_pairs():
    out = engine.run(steps=2, repeats=1, batches=(1, 2), invariance_pairs=3)
    for b in (1, 2):
        assert out[f"decode_tok_s_b{b}_sync"] > 0 and out[f"decode_tok_s_b{b}_async"] > 0
    assert out["batch_invariant_pairs"] == 3 and len(out["batch_invariant_cost_per_pair"]) == 3
    on, off = out["decode_tok_s_b2_invariant"], out["decode_tok_s_b2_variant"]
    assert abs(out["batch_invariant_cost"] - off / on) < 0.01  # the medians' ratio
    assert all(r > 0 for r in out["batch_invariant_cost_per_pair"])
    assert out["prefill_tok_s"] > 0
