import asyncio

import pytest

from dsi.actor import Actor, LocalRef, handles
from dsi.errors import ActorStopped, AskTimeout, HandlerError, Overloaded, UnknownMessage
from dsi.messages.base import Ack, Message


class Add(Message):
    a: int
    b: int


class Sum(Message):
    value: int


class Wait(Message):
    seconds: float


class Ticks(Message):
    n: int


class Unhandled(Message):
    pass


class Calculator(Actor):
    inbox_limit = 4

    def __init__(self) -> None:
        super().__init__("calc")
        self.events: list[str] = []
        self.failed: list[str] = []

    async def on_start(self) -> None:
        self.events.append("start")

    async def on_stop(self) -> None:
        self.events.append("stop")

    async def on_failure(self, exc, msg) -> None:
        self.failed.append(type(msg).__name__)

    @handles
    async def add(self, msg: Add) -> Sum:
        if msg.a < 0:
            raise ValueError("negative")
        return Sum(msg.a + msg.b)

    @handles
    async def wait(self, msg: Wait) -> None:
        await asyncio.sleep(msg.seconds)

    @handles
    async def ticks(self, msg: Ticks):
        for i in range(msg.n):
            await asyncio.sleep(0)
            yield Sum(i)


@pytest.fixture
async def calc():
    actor = Calculator()
    await actor.start()
    yield actor, LocalRef(actor)
    await actor.stop()


async def test_ask_stream_and_lifecycle(calc):
    actor, ref = calc
    assert await ref.ask(Add(2, 3)) == Sum(5)
    assert [s.value async for s in ref.stream(Ticks(4))] == [0, 1, 2, 3]
    assert await ref.ask(Wait(0)) == Ack()
    await actor.stop()
    assert actor.events == ["start", "stop"]
    with pytest.raises(ActorStopped):
        await ref.ask(Add(1, 1))


async def test_handler_failure_keeps_serving(calc):
    actor, ref = calc
    with pytest.raises(HandlerError, match="ValueError: negative"):
        await ref.ask(Add(-1, 0))
    assert actor.failed == ["Add"]
    with pytest.raises(UnknownMessage):
        await ref.ask(Unhandled())
    assert await ref.ask(Add(1, 1)) == Sum(2)


async def test_full_inbox_answers_overloaded(calc):
    _actor, ref = calc
    blocker = asyncio.ensure_future(ref.ask(Wait(0.3)))
    await asyncio.sleep(0.01)  # the loop is now inside the blocking handler
    queued = [asyncio.ensure_future(ref.ask(Add(i, 0))) for i in range(4)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await ref.ask(Add(9, 9))
    assert [r.value for r in await asyncio.gather(*queued)] == [0, 1, 2, 3]
    await blocker


async def test_stop_answers_queued_messages(calc):
    actor, ref = calc
    blocker = asyncio.ensure_future(ref.ask(Wait(5)))
    await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(ref.ask(Add(1, 2)))
    await asyncio.sleep(0)
    await actor.stop()
    for fut in (blocker, queued):
        with pytest.raises(ActorStopped):
            await fut


async def test_local_ask_timeout(calc):
    _, ref = calc
    with pytest.raises(AskTimeout):
        await ref.ask(Wait(1), timeout=0.05)


def test_handler_needs_an_annotated_message():
    class Bad(Actor):
        @handles
        async def nothing(self, msg):
            return None

    with pytest.raises(TypeError, match="annotated"):
        Bad("bad")


async def test_call_style_must_match_the_handler(calc):
    _, ref = calc
    with pytest.raises(UnknownMessage, match="call it with stream"):
        await ref.ask(Ticks(2))
    with pytest.raises(UnknownMessage, match="call it with ask"):
        [s async for s in ref.stream(Add(1, 2))]


class Fast(Actor):
    def __init__(self) -> None:
        super().__init__("fast")
        self.order: list[int] = []

    @handles
    def add(self, msg: Add) -> Sum:  # a plain function: handled inline when the actor is idle
        self.order.append(msg.a)
        if msg.a < 0:
            raise ValueError("negative")
        return Sum(msg.a + msg.b)

    @handles
    async def wait(self, msg: Wait) -> None:
        await asyncio.sleep(msg.seconds)


async def test_sync_handlers_inline_when_idle_and_in_order_when_busy():
    actor = Fast()
    await actor.start()
    ref = LocalRef(actor)
    assert await ref.ask(Add(1, 2)) == Sum(3)
    busy = asyncio.ensure_future(ref.ask(Wait(0.05)))
    await asyncio.sleep(0.01)
    later = [asyncio.ensure_future(ref.ask(Add(i, 0))) for i in (10, 11)]
    await asyncio.sleep(0)
    assert actor.order == [1]  # queued behind the running async handler, not run inline
    await busy
    assert [r.value for r in await asyncio.gather(*later)] == [10, 11] and actor.order == [1, 10, 11]
    with pytest.raises(HandlerError, match="negative"):
        await ref.ask(Add(-1, 0))
    await actor.stop()
