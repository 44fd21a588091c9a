"""deploy/grafana/dsi.json: the dashboard parses, every query reads the data source variable, and
every metric its queries name is one a live gateway exports (on its /metrics, once it has served
requests), with rate() and increase() only over counters and histograms' series."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.roles.entrypoint.live_gateway import live_gateway

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "dsi.json"
# Every role whose state the gateway's /metrics carries: the balancer's routes and view, the
# kvstore's index replica, the controller's lifecycle moves.
ROLES = ("controller-0", "entrypoint-0", "prefill-0", "decode-0", "kvstore-0", "balancer-0")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

_NAME = r"[A-Za-z_:][A-Za-z0-9_:]*"
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard."""
    return [
        (panel["title"], target["expr"])
        for panel in _panels(_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers once strings, label
    matchers, ranges and grouping clauses are gone, less functions and keywords."""
    bare = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    bare = re.sub(r"\{[^{}]*\}", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    names = set()
    for match in re.finditer(rf"({_NAME})\s*(\()?", bare):
        word, call = match.groups()
        before = bare[match.start() - 1] if match.start() else " "
        if not call and word.lower() not in _KEYWORDS and not (before.isdigit() or before in "$."):
            names.add(word)  # not part of a number (1e3) or a variable ($job)
    return names


def rated_names(expr: str) -> set[str]:
    """The metrics an expression takes rate(), irate() or increase() of."""
    return set(re.findall(rf"\b(?:rate|irate|increase)\(\s*({_NAME})", expr))


def test_metric_names_are_read_from_promql():
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(dsi_ttft_seconds_bucket{job=~"$job", '
        'instance=~"$instance"}[$__rate_interval]))) / on (instance) group_left max(up) or vector(0)'
    )
    assert metric_names(expr) == {"dsi_ttft_seconds_bucket", "up"}
    assert metric_names("sum(rate(dsi_requests_total[5m])) * 1e3 > $threshold") == {"dsi_requests_total"}
    assert rated_names(expr) == {"dsi_ttft_seconds_bucket"}


def test_every_query_reads_the_datasource_variable():
    dashboard = _dashboard()
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel[
            "title"
        ]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            expr = target["expr"]
            assert all(expr.count(a) == expr.count(b) for a, b in ("()", "{}", "[]")), expr


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _families(text: str) -> tuple[dict[str, str], dict[str, float]]:
    """The metric families a /metrics text declares (name -> type), and its samples summed by
    series name (labels dropped)."""
    types: dict[str, str] = {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            name = re.match(_NAME, line).group(0)  # type: ignore[union-attr]
            samples[name] = samples.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return types, samples


def _family(name: str, types: dict[str, str]) -> str | None:
    """The family a series name belongs to: itself, or the histogram whose part it is."""
    if name in types:
        return name
    for part in _HISTOGRAM_PARTS:
        base = name.removesuffix(part)
        if name.endswith(part) and types.get(base) == "histogram":
            return base
    return None


def _problems(text: str) -> list[str]:
    types, samples = _families(text)
    found = []
    for title, expr in _expressions():
        for name in sorted(metric_names(expr)):
            family = _family(name, types)
            if family is None:
                found.append(f"{title}: {name} is not on /metrics")
            elif types[family] == "histogram" and name == family:
                found.append(f"{title}: {name} is a histogram; query its _bucket, _sum or _count")
        for name in sorted(rated_names(expr)):
            family = _family(name, types)
            if family is not None and types[family] not in ("counter", "histogram"):
                found.append(f"{title}: rate/increase of {name}, a {types[family]}")
    if samples.get("dsi_ttft_seconds_count", 0) < 1:
        found.append("no request has been served yet")
    return found


@pytest.mark.slow
@pytest.mark.concurrent
def test_every_metric_of_the_dashboard_is_on_a_live_gateways_metrics(tmp_path):
    with live_gateway(tmp_path, ROLES) as base:
        chat = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert _post(f"{base}/v1/chat/completions", {**chat, "stream": True})[0] == 200
        assert _post(f"{base}/v1/chat/completions", chat)[0] == 200
        assert _post(f"{base}/v1/chat/completions", {**chat, "model": "nope"})[0] == 404  # an error
        deadline = time.monotonic() + 30  # the balancer's view arrives once a second
        while True:
            problems = _problems(_get(f"{base}/metrics")[1].decode())
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert problems == []
