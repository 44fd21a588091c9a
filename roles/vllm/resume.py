"""KV-assisted re-prefill: a re-run continues after the tokens the client already has.

When a decode dies or is drained, the gateway re-runs the request on another decode and checks
the re-run against the tokens already delivered (dsi.roles.entrypoint.recovery). Decoding those
tokens again costs one engine step each; a vLLM decode instead runs them as part of the prompt:

    client has        d0 d1 ... dk-1 dk
    re-run prompt     prompt + d0 .. dk-1       (one prefill; its full pages come from vLLM's
                                                 cache or the kvstore, the rest is computed)
    re-run outputs    x  x+1 ...                the first must equal dk: the stream sent to the
                                                 gateway is d0 .. dk-1, x, x+1, ... so that the
                                                 gateway's check compares x with dk

Only greedy requests without penalties or structured output qualify: for them the continuation
depends on the tokens alone, not on how they were produced (a seeded sample is keyed by the
engine's own stream, penalties count only output tokens). The rest re-run from the prompt.
The delivered tokens were computed by decode steps and are now computed by a prefill, so a
near-tie can still come out differently: the gateway's check then ends the stream with the
protocol's error, never a splice.
"""

from __future__ import annotations

import msgspec

from dsi.messages.gateway import Generate, TokenChunk


def resumable(msg: Generate) -> bool:
    """Whether ``msg`` (a re-run with tokens delivered) can continue after them."""
    s = msg.sampling
    return (
        len(msg.delivered) >= 2
        and s.temperature == 0
        and s.frequency_penalty == 0
        and s.presence_penalty == 0
        and s.structured is None
        and s.max_tokens > len(msg.delivered) - 1
    )


def resumed(msg: Generate) -> Generate:
    """The re-run as a new request: prompt + every delivered token but the last, and the output
    budget left (the last delivered token is produced again, for the check)."""
    echo = msg.delivered[:-1]
    sampling = msgspec.structs.replace(msg.sampling, max_tokens=msg.sampling.max_tokens - len(echo))
    return msgspec.structs.replace(msg, token_ids=[*msg.token_ids, *echo], sampling=sampling, delivered=[])


def echoed(chunk: TokenChunk, echo: list[int]) -> TokenChunk:
    """The resumed run's first chunk with the echoed tokens in front (placeholder logprobs: the
    gateway never sends what the client already has)."""
    return msgspec.structs.replace(
        chunk,
        token_ids=[*echo, *chunk.token_ids],
        logprobs=[0.0] * len(echo) + chunk.logprobs if chunk.logprobs else [],
        top_logprobs=[[] for _ in echo] + chunk.top_logprobs if chunk.top_logprobs else [],
    )
