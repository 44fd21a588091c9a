import asyncio

import zmq.asyncio

from dsi.messages.kvstore import IndexDelta
from dsi.transport.pubsub import Publisher, Subscriber


async def test_sequence_numbers_per_topic_and_prefix_filter():
    ctx = zmq.asyncio.Context()
    pub = Publisher("tcp://127.0.0.1:*", ctx)
    sub = Subscriber(pub.address, ctx, types=[IndexDelta], topics=["index."])
    # PUB drops messages until the subscription has reached it: warm up first.
    for _ in range(500):
        pub.publish("index.warmup", IndexDelta(0))
        try:
            await asyncio.wait_for(sub.recv(), 0.02)
            break
        except TimeoutError:
            continue
    await asyncio.sleep(0.05)
    pub.publish("index.a", IndexDelta(1, added=[b"x" * 16]))
    pub.publish("other", IndexDelta(99))
    pub.publish("index.b", IndexDelta(1))
    pub.publish("index.a", IndexDelta(2, removed=[b"y" * 16]))
    pub.publish("index.a", IndexDelta(3))
    got = []
    while len(got) < 4:
        item = await asyncio.wait_for(sub.recv(), 5)
        if item.topic != "index.warmup":
            got.append(item)
    assert [(p.topic, p.seq) for p in got] == [("index.a", 1), ("index.b", 1), ("index.a", 2), ("index.a", 3)]
    assert got[0].msg.added == [b"x" * 16]
    assert got[2].msg.removed == [b"y" * 16]
    sub.close()
    pub.close()
    ctx.term()
