"""The mask benchmark runs and its fixed answers are valid under their grammars (it checks every
token against the mask as it walks); the figures themselves are not asserted."""

import json

from dsi.structured import bench_mask


def test_bench_mask_reports_every_grammar(capsys):
    bench_mask.main(["--repeats", "1"])
    result = json.loads(capsys.readouterr().out)
    lg = result["llguidance"]
    for grammar in ("json_schema", "json_object", "regex", "tool_call"):
        assert lg[grammar]["warm"]["mask_us_median"] > 0 and lg[grammar]["compile_ms"] > 0
    assert "error" in result["xgrammar"] or result["xgrammar"]["regex"]["warm"]["mask_us_p99"] > 0
    assert result["apply_mask_us"] > 0
