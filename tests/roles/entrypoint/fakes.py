"""A stand-in for DecodePool: answers every request with a few tokens, no engine."""

import asyncio

from dsi.messages.gateway import Generate, TokenChunk
from dsi.roles.entrypoint.backends import NoInstance


class FakePool:
    def __init__(self, tokens=(1000, 2000, 3000), delay_s: float = 0.0, ready: bool = True) -> None:
        self.tokens = list(tokens)
        self.delay_s = delay_s
        self._ready = ready
        self.requests: list[Generate] = []
        self.cancelled = 0

    @property
    def ready(self) -> list[str]:
        return ["fake-0"] if self._ready else []

    @property
    def prefill_ready(self) -> list[str]:
        return []

    def pick(self, exclude=frozenset()):
        if not self._ready:
            raise NoInstance("no ready decode instance")
        return "fake-0"

    async def generate(self, msg: Generate):
        self.pick()
        self.requests.append(msg)
        n = min(msg.sampling.max_tokens, len(self.tokens))
        try:
            for i in range(n):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                last = i == n - 1
                yield TokenChunk(msg.request_id, [self.tokens[i]], "length" if last else "", len(msg.token_ids))
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    async def close(self) -> None:
        pass
