"""The dashboard's state JSON, its metrics history and its controller cache, without a browser or
a cluster; and its two routes on the gateway's application over a stand-in pool."""

import ast
import asyncio
import fnmatch
import json
import re

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from dsi.errors import AskTimeout
from dsi.messages.balancer import BalancerState, BucketInfo, InstanceView
from dsi.messages.control import (
    GetScale,
    InstanceInfo,
    InstanceTable,
    ListInstances,
    Load,
    ScaleDecision,
    ScaleRole,
    ScaleStatus,
    TransitionCount,
)
from dsi.recipe import ModelVersion, Recipe
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.dashboard.cluster import ClusterSnapshot, ClusterView
from dsi.roles.entrypoint.dashboard.history import MetricsHistory, histogram_quantile
from dsi.roles.entrypoint.dashboard.state import dashboard_state
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from tests.dsi.cli.procs import REPO_ROOT
from tests.roles.entrypoint.fakes import FakePool


def info(iid: str, role: str, state: str = "serving", **load: int) -> InstanceInfo:
    return InstanceInfo(
        iid, role, "127.0.0.1", 100, f"tcp://127.0.0.1:{7000 + len(iid)}", state, Load(**load), 0.4, 1.0e9
    )


TABLE = InstanceTable(
    [
        info("controller-0", "controller"),
        info("decode-0", "decode", running=3, queued=1, kv_tokens=900),
        info("decode-1", "decode", "draining", running=1, kv_tokens=120),
    ],
    controller_id="controller-0",
    transitions=[TransitionCount("decode", "serving", "draining", 1)],
)
SCALE = ScaleStatus(
    enabled=True,
    interval_s=2.0,
    quota_threshold=0.8,
    roles=[ScaleRole("decode", 1, 4, 1, 2, 0, 0, 1, 2, 1, 3, demand=4.0, capacity=2.0)],
    decisions=[ScaleDecision(1.0e9, "decode", 1, 1, 0, 4.0, 2.0, 2, 2, take=1)],
)
BALANCER = BalancerState(
    "balancer-0",
    [BucketInfo(0, 0, 16384, 1.0, ["prefill-0"], 64)],
    ["decode-1"],
    20000,
    [InstanceView("decode-0", "decode", "serving", 0, 3, 900, 0.1)],
    routed={"decode": 7},
    spread={"decode": 1.2},
)


def metrics_with_traffic() -> Metrics:
    m = Metrics()
    for ttft in (0.02, 0.03, 0.2):
        m.ttft.observe(ttft)
    m.itl.observe(0.004)
    m.request_done("chat", 200)
    m.request_done("chat", 503)
    m.error("http_503")
    m.prefix_lookup_tokens, m.prefix_hit_tokens, m.engine_cached_tokens = 1000, 256, 256
    m.generated_tokens, m.in_flight = 40, 2
    return m


def test_the_state_is_dsi_status_json_plus_the_gateways_metrics():
    snapshot = ClusterSnapshot(TABLE, SCALE, age_s=0.5)
    state = dashboard_state(
        snapshot, [BALANCER], metrics_with_traffic(), [{"at": 1.0}], worker="entrypoint-0", now=2.0
    )
    assert json.loads(json.dumps(state)) == state  # plain JSON, as the page gets it
    assert state["controller"] == {"id": "controller-0", "age_s": 0.5, "error": ""}
    by_id = {i["instance_id"]: i for i in state["instances"]}
    assert list(by_id) == ["controller-0", "decode-0", "decode-1"]
    assert by_id["decode-1"]["state"] == "draining" and by_id["decode-0"]["role"] == "decode"
    assert by_id["decode-0"]["load"].items() >= {"running": 3, "queued": 1, "kv_tokens": 900}.items()
    assert all("address" not in i for i in state["instances"])  # the page is as open as /metrics
    assert state["transitions"] == [{"role": "decode", "from": "serving", "to": "draining", "count": 1}]
    [role] = state["autoscale"]["roles"]
    assert role["quota_use"] == 0.5 and state["autoscale"]["decisions"][0]["take"] == 1
    [balancer] = state["balancers"]
    assert balancer["buckets"][0]["engines"] == ["prefill-0"] and balancer["long_band"] == ["decode-1"]
    gateway = state["gateway"]
    assert gateway["requests"] == 2 and gateway["errors"] == 1 and gateway["in_flight"] == 2
    assert gateway["prefix"]["hit_rate"] == 0.256
    ttft = gateway["ttft"]
    assert ttft["count"] == 3 and ttft["mean"] == pytest.approx(0.25 / 3)
    assert 0.025 < ttft["p50"] <= 0.05 and 0.1 < ttft["p95"] <= 0.25  # within the buckets around them
    assert gateway["tbt"]["count"] == 1 and state["history"] == [{"at": 1.0}]


def test_before_the_controller_answers_the_state_is_empty_and_says_why():
    snapshot = ClusterSnapshot(None, None, 0.0, "ask_timeout: no reply")
    state = dashboard_state(snapshot, [], Metrics(), [], worker="w", now=0.0)
    assert state["instances"] == [] and state["autoscale"] is None and state["balancers"] == []
    assert state["controller"]["error"] == "ask_timeout: no reply"
    assert state["gateway"]["ttft"] == {"count": 0, "mean": None, "p50": None, "p95": None}
    assert state["gateway"]["prefix"]["hit_rate"] is None


def test_histogram_quantile_interpolates_inside_the_bucket():
    bounds = (0.1, 0.2, 0.4)
    assert histogram_quantile(bounds, [0, 4, 4, 0], 0.5) == 0.2
    assert histogram_quantile(bounds, [0, 4, 4, 0], 0.25) == pytest.approx(0.15)
    assert histogram_quantile(bounds, [2, 0, 0, 0], 0.5) == pytest.approx(0.05)
    assert histogram_quantile(bounds, [0, 0, 0, 3], 0.5) == 0.4  # above every bound: the last
    assert histogram_quantile(bounds, [0, 0, 0, 0], 0.5) is None


def test_a_history_point_covers_its_interval_only():
    m, history = Metrics(), MetricsHistory(keep=2)
    m.ttft.observe(5.0)  # before the first sample: in no point
    assert history.sample(100.0, m) is None
    m.ttft.observe(0.02)
    m.ttft.observe(0.02)
    m.generated_tokens += 30
    m.request_done("chat", 200)
    m.prefix_lookup_tokens, m.prefix_hit_tokens = 200, 50
    point = history.sample(102.0, m)
    assert point is not None and point["at"] == 102.0
    assert point["ttft_mean"] == pytest.approx(0.02) and 0.01 < point["ttft_p95"] <= 0.025
    assert point["tbt_p50"] is None and point["tbt_mean"] is None  # no token between tokens
    assert point["hit_rate"] == 0.25 and point["tokens_per_s"] == 15.0 and point["requests_per_s"] == 0.5
    quiet = history.sample(104.0, m)
    assert quiet["ttft_p50"] is None and quiet["hit_rate"] is None and quiet["tokens_per_s"] == 0.0
    history.sample(106.0, m)
    assert [p["at"] for p in history.points] == [104.0, 106.0]  # keep=2: the oldest dropped


class FakeController:
    """Answers ListInstances and GetScale after ``delay_s``; counts the asks; fails while ``down``."""

    def __init__(self, scale: ScaleStatus = SCALE, delay_s: float = 0.0) -> None:
        self.asked: list[str] = []
        self.down = False
        self.scale, self.delay_s = scale, delay_s

    async def ask(self, msg):
        self.asked.append(type(msg).__name__)
        await asyncio.sleep(self.delay_s)
        if self.down:
            raise AskTimeout("tcp://controller: no reply to ListInstances in 2.0s")
        if isinstance(msg, ListInstances):
            return TABLE
        assert isinstance(msg, GetScale)
        return self.scale


async def test_the_cluster_view_asks_the_controller_at_most_once_per_ttl():
    now = [10.0]
    controller = FakeController(delay_s=0.01)
    view = ClusterView(controller.ask, ttl_s=1.0, clock=lambda: now[0])
    first = await asyncio.gather(*(view.snapshot() for _ in range(5)))  # five pages at once: one ask
    assert controller.asked == ["ListInstances", "GetScale"]
    assert all(s.table is TABLE and s.scale is SCALE and s.error == "" for s in first)
    now[0] += 0.5
    assert (await view.snapshot()).age_s == 0.5 and len(controller.asked) == 2  # fresh: not asked
    now[0] += 0.6
    controller.down = True
    stale = await view.snapshot()  # the controller away: the last table, and why it is old
    assert len(controller.asked) == 4 and stale.table is TABLE and stale.age_s == pytest.approx(1.1)
    assert stale.error.startswith("timeout: ")
    now[0] += 1.0
    controller.down = False
    assert (await view.snapshot()).error == ""


async def test_autoscaling_off_gives_no_autoscaler_part():
    view = ClusterView(FakeController(scale=ScaleStatus(enabled=False)).ask)
    assert (await view.snapshot()).scale is None


class DashboardPool(FakePool):
    """The fake pool with the parts the dashboard reads: the controller door and the router."""

    def __init__(self) -> None:
        super().__init__()
        self.decode = self  # DecodePool.decode is the InstancePool the controller is asked on
        self.controller = FakeController()
        self.router = type("Router", (), {"state": BALANCER})()

    async def ask_controller(self, msg, timeout: float = 2.0):
        return await self.controller.ask(msg)


async def test_the_page_and_its_state_are_served_without_an_api_key(tmp_path):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[[keys]]\nkey = "sk-1"\nname = "a"\n')
    pool = DashboardPool()
    recipe = Recipe({"dsi-tiny": ModelVersion.V4})
    gateway = Gateway(pool, ApiKeys.load(keys_file), Metrics(), Preparer(recipe, 16_384))
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20, worker="entrypoint-0"), host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession() as http:
            async with http.get(server.make_url("/dashboard")) as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
                page = await resp.text()
            async with http.get(server.make_url("/dashboard/state.json")) as resp:
                assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
                state = await resp.json()
            async with http.post(server.make_url("/dashboard")) as resp:
                assert resp.status == 405
            async with http.post(server.make_url("/v1/chat/completions"), json={}) as resp:
                assert resp.status == 401  # the API itself still needs a key
    finally:
        await server.close()
    assert [i["instance_id"] for i in state["instances"]] == ["controller-0", "decode-0", "decode-1"]
    assert state["worker"] == "entrypoint-0" and state["balancers"][0]["balancer_id"] == "balancer-0"
    # One file, nothing from elsewhere: the only URL in it is the SVG namespace.
    assert re.findall(r"https?://[^\s\"'`]+", page) == ["http://www.w3.org/2000/svg"]
    assert "dashboard/state.json" in page


def test_every_file_of_the_page_ships_as_package_data():
    """A wheel carries a package's non-Python files only where setup.py's PACKAGE_DATA names them."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    [value] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["PACKAGE_DATA"]
    ]
    patterns = ast.literal_eval(value)["dsi.roles.entrypoint.dashboard"]
    files = [f for f in (REPO_ROOT / "roles" / "entrypoint" / "dashboard").iterdir() if f.suffix != ".py"]
    assert "index.html" in [f.name for f in files]
    assert all(any(fnmatch.fnmatch(f.name, p) for p in patterns) for f in files if f.is_file())
