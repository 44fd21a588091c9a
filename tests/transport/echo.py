"""A small actor used by the transport tests (and by the rpc benchmark's peer process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dsi.actor import Actor, handles
from dsi.errors import InvalidRequest
from dsi.messages.base import Message
from dsi.messages.blob import Blob


class Echo(Message):
    text: str
    data: Blob | None = None


class Count(Message):
    n: int
    delay_s: float = 0.0


class Number(Message):
    i: int


class Boom(Message):
    kind: str = "crash"


class Sleep(Message):
    seconds: float


class Note(Message):
    text: str


class Notes(Message):
    """Ask for the texts of the Notes received so far (answered with one Note, joined by "|")."""


ECHO_TYPES = (Echo, Count, Number, Boom, Sleep, Note, Notes)


class EchoActor(Actor):
    def __init__(self, name: str = "echo") -> None:
        super().__init__(name)
        self.notes: list[str] = []

    @handles
    async def echo(self, msg: Echo) -> Echo:
        return msg

    @handles
    async def count(self, msg: Count) -> AsyncIterator[Number]:
        for i in range(msg.n):
            if msg.delay_s:
                await asyncio.sleep(msg.delay_s)
            yield Number(i)

    @handles
    async def boom(self, msg: Boom) -> None:
        if msg.kind == "invalid":
            raise InvalidRequest("you asked for it")
        raise RuntimeError("handler crashed")

    @handles(concurrent=True)
    async def sleep(self, msg: Sleep) -> Note:
        await asyncio.sleep(msg.seconds)
        return Note("slept")

    @handles
    async def note(self, msg: Note) -> None:
        self.notes.append(msg.text)

    @handles
    async def notes_so_far(self, msg: Notes) -> Note:
        return Note("|".join(self.notes))
