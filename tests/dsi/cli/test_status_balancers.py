"""dsi status's balancer section: the bucket table and its JSON."""

from dsi.cli.status_balancers import balancers_json, format_buckets
from dsi.messages.balancer import BalancerState, BucketInfo, InstanceView

STATE = BalancerState(
    "balancer-0",
    [BucketInfo(0, 0, 512, 0.25, ["prefill-0"], 120), BucketInfo(1, 512, 0, 0.75, ["prefill-1"], 3_000)],
    long_band=["decode-1"],
    long_threshold=9_000,
    instances=[InstanceView("prefill-0", "prefill", "serving", 120, 1, 0, 0.2)],
    routed={"prefill": 7},
    spread={"prefill": 1.92, "decode": 1.0},
)


def test_one_row_per_bucket_then_the_bands_and_spread():
    lines = format_buckets([STATE]).splitlines()
    assert lines[0].split() == ["BALANCER", "BUCKET", "TOKENS", "SHARE", "QUEUED", "PREFILL"]
    assert lines[1].split() == ["balancer-0", "0", "0-512", "0.25", "120", "prefill-0"]
    assert lines[2].split() == ["balancer-0", "1", "512-", "0.75", "3000", "prefill-1"]
    assert lines[3] == (
        "balancer-0  decode long band from 9000 KV tokens: decode-1; "
        "load spread (max/mean) decode 1 prefill 1.92"
    )


def test_json_is_plain_objects():
    [data] = balancers_json([STATE])
    assert data["buckets"][1] == {
        "bucket": 1,
        "min_tokens": 512,
        "max_tokens": 0,
        "share": 0.75,
        "engines": ["prefill-1"],
        "queued_tokens": 3_000,
    }
    assert data["instances"][0]["instance_id"] == "prefill-0" and data["routed"] == {"prefill": 7}
