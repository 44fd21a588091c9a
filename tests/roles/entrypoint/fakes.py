"""A stand-in for DecodePool: answers every request with a few tokens (or fails after some), no engine."""

import asyncio

from dsi.messages.gateway import Generate, TokenChunk
from dsi.roles.entrypoint.backends import NoInstance


class FakePool:
    """``engine_cached``: the cached tokens the fake engine reports (None: what the request's
    prediction says). With ``sampling.logprobs`` token i gets logprob -(i + 1) / 4 and a top
    list of the token itself and the ids after it, each 1.0 less likely."""

    def __init__(
        self,
        tokens=(1000, 2000, 3000),
        delay_s: float = 0.0,
        ready: bool = True,
        engine_cached: int | None = None,
        fail_after: int | None = None,
        error: Exception | None = None,
    ) -> None:
        self.tokens = list(tokens)
        self.fail_after = fail_after  # raise ``error`` after this many tokens (as a failed recovery)
        self.error = error
        self.delay_s = delay_s
        self._ready = ready
        self.engine_cached = engine_cached
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
            raise NoInstance("no serving decode instance")
        return "fake-0"

    async def generate(self, msg: Generate, placement=None):
        self.pick()
        if placement is not None:
            placement.decode = "fake-0"
        self.requests.append(msg)
        n = min(msg.sampling.max_tokens, len(self.tokens))
        try:
            for i in range(n):
                if i == self.fail_after:
                    raise self.error
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                last = i == n - 1
                cached = msg.cached_tokens if self.engine_cached is None else self.engine_cached
                token, lp = self.tokens[i], -(i + 1) / 4
                logprobs = [lp] if msg.sampling.logprobs else []
                top = [[(token + k, lp - k) for k in range(msg.sampling.top_logprobs)]] if logprobs else []
                yield TokenChunk(
                    msg.request_id,
                    [token],
                    "length" if last else "",
                    len(msg.token_ids),
                    cached,
                    logprobs,
                    top,
                )
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    def metric_lines(self) -> list[str]:
        return ['dsi_instance_transitions_total{role="decode",from="ready",to="serving"} 1']

    async def close(self) -> None:
        pass
