"""Merging the /metrics texts of an entrypoint's HTTP workers: counters and histograms summed,
in-flight requests summed, cluster views kept once."""

from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.metrics_merge import merge_metrics


def _worker(requests: int, ttft: list[float], in_flight: int, peak: int, transitions: int) -> str:
    m = Metrics()
    for _ in range(requests):
        m.request_done("chat", 200)
    m.request_done("messages", 429)
    for t in ttft:
        m.ttft.observe(t)
    m.in_flight, m.sse_buffer_peak_bytes = in_flight, peak
    m.sources.append(
        lambda: [
            "# TYPE dsi_instance_transitions_total counter",
            f'dsi_instance_transitions_total{{role="decode",from="ready",to="serving"}} {transitions}',
            "# TYPE dsi_kv_replica_blocks gauge",
            "dsi_kv_replica_blocks 10",
            "# TYPE dsi_kv_replica_synced gauge",
            f"dsi_kv_replica_synced {int(transitions > 1)}",
        ]
    )
    return m.render()


def _values(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_every_workers_requests_are_counted_once():
    a = _worker(3, [0.003, 0.2], in_flight=2, peak=100, transitions=2)
    b = _worker(4, [0.004], in_flight=1, peak=700, transitions=1)
    merged = _values(merge_metrics([a, b], workers=2))
    assert merged['dsi_requests_total{protocol="chat",status="200"}'] == "7"
    assert merged['dsi_requests_total{protocol="messages",status="429"}'] == "2"
    assert merged["dsi_requests_in_flight"] == "3"  # per worker: summed
    assert merged["dsi_sse_buffer_peak_bytes"] == "700"  # a peak: the largest
    # the histogram's buckets, sum and count are all summed
    assert merged['dsi_ttft_seconds_bucket{le="0.005"}'] == "2"
    assert merged['dsi_ttft_seconds_bucket{le="+Inf"}'] == "3"
    assert merged["dsi_ttft_seconds_count"] == "3"
    assert abs(float(merged["dsi_ttft_seconds_sum"]) - 0.207) < 1e-6
    # the controller's counter, copied into every worker: the freshest copy, not a sum
    assert merged['dsi_instance_transitions_total{role="decode",from="ready",to="serving"}'] == "2"
    assert merged["dsi_kv_replica_blocks"] == "10"  # a view of the cluster, alike in both
    assert merged["dsi_kv_replica_synced"] == "0"  # synced only when every replica is
    assert merged["dsi_http_workers"] == "2" and merged["dsi_http_workers_answered"] == "2"


def test_the_text_stays_prometheus_text_in_the_first_workers_order():
    a = _worker(1, [0.1], in_flight=0, peak=0, transitions=1)
    merged = merge_metrics([a, a, a], workers=4)
    lines = merged.splitlines()
    assert lines[:4] == [
        "# TYPE dsi_http_workers gauge",
        "dsi_http_workers 4",
        "# TYPE dsi_http_workers_answered gauge",
        "dsi_http_workers_answered 3",  # one of the four did not answer
    ]
    families = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    own = [line.split()[2] for line in a.splitlines() if line.startswith("# TYPE ")]
    assert families[2:] == own  # every family once, as a worker writes them
    assert len([x for x in lines if x.startswith("dsi_ttft_seconds_bucket")]) == 13
    assert _values(merged)["dsi_ttft_seconds_count"] == "3"
