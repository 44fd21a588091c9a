"""dsi's SamplingParams as vLLM's, and vLLM's per-token logprobs as dsi's.

The gateway has already resolved the client's protocol into dsi's one sampling type; this maps it
field by field. vLLM reports the sampled token's logprob with every requested top entry; dsi
wants the sampled token's logprob when ``logprobs`` is set and the top ``top_logprobs`` pairs,
most likely first. Stop strings never reach an engine (the gateway matches them on text), and the
output is not detokenized here (the gateway detokenizes incrementally).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest


def vllm_sampling(params: SamplingParams, kv_transfer_params: Mapping[str, Any] | None = None) -> Any:
    """``vllm.SamplingParams`` (DELTA outputs, no detokenization) for ``params``; InvalidRequest for
    what vLLM is not asked to do by dsi (structured output is the gateway's grammar, dsi's own
    engine's job)."""
    from vllm import SamplingParams as VllmSampling
    from vllm.sampling_params import RequestOutputKind

    if params.structured is not None:
        raise InvalidRequest("structured output is not served by vLLM-backed instances of dsi")
    wants = params.logprobs or params.top_logprobs > 0
    extra = {"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None
    return VllmSampling(
        n=1,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        min_p=params.min_p,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        logprobs=params.top_logprobs if wants else None,
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.DELTA,
        extra_args=extra,
    )


def split_logprobs(
    token_ids: list[int], positions: Iterable[Mapping[int, Any] | None] | None, params: SamplingParams
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """(logprob of each sampled token, top pairs of each position) as ``TokenChunk`` carries them:
    empty lists for what the request did not ask for."""
    if positions is None or not (params.logprobs or params.top_logprobs):
        return [], []
    sampled: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    for token, position in zip(token_ids, positions, strict=False):
        entries = position or {}
        chosen = entries.get(token)
        sampled.append(float(chosen.logprob) if chosen is not None else float("-inf"))
        if params.top_logprobs:
            ranked = sorted(entries.items(), key=lambda item: (item[1].rank or 1 << 30, -item[1].logprob))
            tops.append([(int(t), float(lp.logprob)) for t, lp in ranked[: params.top_logprobs]])
    return (sampled if params.logprobs else []), tops
