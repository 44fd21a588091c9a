"""The balancer actor in this process: routes from pushed reports, honours exclude, refuses bad
queries with typed errors and keeps serving, shows its buckets."""

import pytest

from dsi.actor import LocalRef
from dsi.balance import NoInstance
from dsi.config import BalancerOptions
from dsi.errors import InvalidRequest
from dsi.messages.balancer import (
    BalancerStatus,
    LoadReport,
    Route,
    RoutedRequest,
    RouteQuery,
    RouteTable,
    TableQuery,
)
from dsi.model.config import get_config
from dsi.roles.balancer import BalancerActor
from tests.roles.balancer.helpers import FakeClock, decode, prefill, table

EDGES = (512, 2_048, 8_192)


@pytest.fixture
async def balancer():
    clock = FakeClock()
    actor = BalancerActor(
        "balancer-0", BalancerOptions(bucket_edges=EDGES, rebalance_s=1.0), get_config("tiny"), clock=clock
    )
    await actor.start()
    actor.listed(
        table(
            **{"prefill-0": "serving", "prefill-1": "serving", "decode-0": "serving", "decode-1": "serving"}
        )
    )
    ref = LocalRef(actor)
    for i in range(2):
        ref.tell(prefill(f"prefill-{i}"))
        ref.tell(decode(f"decode-{i}"))
    yield actor, ref, clock
    await actor.stop()


async def test_short_and_long_prompts_get_engines_of_their_own_buckets(balancer):
    _actor, ref, clock = balancer
    first = await ref.ask(RouteQuery("prefill", uncached_tokens=100))
    assert first == Route("prefill-0", "tcp://127.0.0.1:7000", bucket=0)
    long = await ref.ask(RouteQuery("prefill", uncached_tokens=3_000))
    assert long.bucket == 2
    clock.now += 1.0  # the plan's next check: buckets 0 and 2 are loaded, one engine each
    routes = [await ref.ask(RouteQuery("prefill", uncached_tokens=u)) for u in (3_000, 100, 3_000, 100)]
    by_bucket = {(r.bucket, r.instance_id) for r in routes}
    assert len(by_bucket) == 2 and {b for b, _ in by_bucket} == {0, 2}
    long_engine = {i for b, i in by_bucket if b == 2}
    state = await ref.ask(BalancerStatus())
    assert [b.engines for b in state.buckets][2] == sorted(long_engine)
    assert [(b.min_tokens, b.max_tokens) for b in state.buckets] == [
        (0, 512),
        (512, 2_048),
        (2_048, 8_192),
        (8_192, 0),
    ]
    assert state.routed == {"prefill": 6} and state.spread["prefill"] >= 1.0


async def test_exclude_is_honoured_without_reshuffling_the_buckets(balancer):
    actor, ref, clock = balancer
    for u in (100, 3_000):
        await ref.ask(RouteQuery("prefill", uncached_tokens=u))
    clock.now += 1.0
    short = (await ref.ask(RouteQuery("prefill", uncached_tokens=100))).instance_id
    plan = actor.policies.prefill.plan
    retry = await ref.ask(RouteQuery("prefill", uncached_tokens=100, exclude=[short]))
    assert retry.instance_id != short and actor.policies.prefill.plan is plan
    with pytest.raises(NoInstance):
        await ref.ask(RouteQuery("prefill", uncached_tokens=100, exclude=["prefill-0", "prefill-1"]))
    d = await ref.ask(RouteQuery("decode", kv_tokens=500))
    assert (
        await ref.ask(RouteQuery("decode", kv_tokens=500, exclude=[d.instance_id]))
    ).instance_id != d.instance_id


async def test_routes_follow_the_pushed_load_and_pending_requests(balancer):
    _actor, ref, _clock = balancer
    ref.tell(decode("decode-0", running=10, kv=40_000))
    assert (await ref.ask(RouteQuery("decode", kv_tokens=1_000))).instance_id == "decode-1"
    # decode-1 reports 39,500 KV tokens before it accepted the request routed to it (accepted=0):
    # with that pending 1,000 it would hold 41,500 after the next (0.415 of capacity) against
    # decode-0's 41,000 (0.41); without it 40,500 would have won
    ref.tell(decode("decode-1", running=0, kv=39_500))
    assert (await ref.ask(RouteQuery("decode", kv_tokens=1_000))).instance_id == "decode-0"


async def test_drained_dead_and_silent_instances_get_nothing(balancer):
    actor, ref, clock = balancer
    actor.listed(
        table(**{"prefill-0": "draining", "prefill-1": "serving", "decode-0": "dead", "decode-1": "serving"})
    )
    for _ in range(3):
        assert (await ref.ask(RouteQuery("prefill", uncached_tokens=100))).instance_id == "prefill-1"
        assert (await ref.ask(RouteQuery("decode", kv_tokens=100))).instance_id == "decode-1"
    clock.now += 3.5  # no report for longer than report_timeout_s
    with pytest.raises(NoInstance):
        await ref.ask(RouteQuery("decode", kv_tokens=100))


async def test_bad_queries_are_typed_errors_and_the_balancer_keeps_routing(balancer):
    _actor, ref, _clock = balancer
    with pytest.raises(InvalidRequest, match="not 'encoder'"):
        await ref.ask(RouteQuery("encoder"))
    with pytest.raises(InvalidRequest, match=">= 0"):
        await ref.ask(RouteQuery("decode", kv_tokens=-1))
    with pytest.raises(InvalidRequest, match="prefill or decode"):
        await ref.ask(LoadReport("kvstore-0", "kvstore", 1.0))
    with pytest.raises(InvalidRequest, match="negative: kv_tokens"):
        await ref.ask(decode("decode-0", kv=-5))  # kept out: it would break every later route
    assert (await ref.ask(RouteQuery("decode", kv_tokens=10))).instance_id in ("decode-0", "decode-1")


async def test_status_shows_the_load_spread_per_role(balancer):
    _actor, ref, _clock = balancer
    ref.tell(prefill("prefill-1", queued=3_000))  # queued 0 and 3,000: max / mean = 2
    ref.tell(decode("decode-0", running=32, kv=10_000))  # scores 0.5 and 0: max / mean = 2
    state = await ref.ask(BalancerStatus())
    assert state.spread == {"prefill": 2.0, "decode": 2.0}
    assert [(v.instance_id, v.state, v.queued_tokens) for v in state.instances][2:] == [
        ("prefill-0", "serving", 0),
        ("prefill-1", "serving", 3_000),
    ]


async def test_a_route_table_lists_the_serving_instances_and_says_how_long_it_took_to_make(balancer):
    _actor, ref, _clock = balancer
    routed = [RoutedRequest("prefill", "prefill-0", 100), RoutedRequest("decode", "decode-1", 100)]
    made = await ref.ask(TableQuery(routed, upto=2))
    assert isinstance(made, RouteTable) and made.acked == 2
    assert [e.instance_id for e in made.prefills] == ["prefill-0", "prefill-1"]
    assert [(e.instance_id, e.running) for e in made.decodes] == [("decode-0", 0), ("decode-1", 1)]
    assert 0 < made.build_s < 60  # seconds, on the balancer's own clock
