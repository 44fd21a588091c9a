"""SamplingParams: how one request samples, validated when the request is added.

The one sampling type: the recipe resolves a client's settings into it, it travels inside
``Generate`` and ``RequestState`` as it is (a msgspec struct), and the engine reads it."""

from __future__ import annotations

import math

import msgspec

from dsi.errors import InvalidRequest
from dsi.structured.spec import StructuredSpec

EOS_ID = 1  # <｜end▁of▁sentence｜> in the V4 vocabulary
MAX_LOGPROBS = 20
MAX_PENALTY = 2.0


class SamplingParams(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """temperature 0 is greedy. ``seed`` makes sampling reproducible: the draw for position p
    depends only on (seed, p), never on what else is in the batch. ``structured`` constrains the
    output to a JSON schema, a regex or a DSML tool call (a frozen, hashable spec).
    ``cache_salt`` is not about sampling: it namespaces the request's prefix cache (a tenant's
    pages hash under their own chain root, so other tenants never hit them).
    ``frequency_penalty`` / ``presence_penalty`` (OpenAI semantics, in [-2, 2]): before a token
    is chosen, every id t already in the request's output loses
    ``frequency_penalty * count(t) + presence_penalty`` from its logit (prompt ids do not count)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    structured: StructuredSpec | None = None
    cache_salt: str = ""
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def validate(self, vocab_size: int) -> None:
        checks = [
            (
                isinstance(self.max_tokens, int) and self.max_tokens > 0,
                "max_tokens must be a positive integer",
            ),
            (_finite(self.temperature) and self.temperature >= 0, "temperature must be a finite number >= 0"),
            (_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (isinstance(self.top_k, int) and self.top_k >= 0, "top_k must be an integer >= 0"),
            (_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (
                self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
                "seed must be in [0, 2^63)",
            ),
            (
                all(isinstance(t, int) and 0 <= t < vocab_size for t in self.stop_token_ids),
                "stop_token_ids must be token ids in the vocabulary",
            ),
            (
                isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= MAX_LOGPROBS,
                f"top_logprobs must be in 0..{MAX_LOGPROBS}",
            ),
            (
                _finite(self.frequency_penalty) and -MAX_PENALTY <= self.frequency_penalty <= MAX_PENALTY,
                f"frequency_penalty must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]",
            ),
            (
                _finite(self.presence_penalty) and -MAX_PENALTY <= self.presence_penalty <= MAX_PENALTY,
                f"presence_penalty must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)
        if self.structured is not None:
            _check_structured(self.structured, vocab_size)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the output so far changes the logits (a frequency or presence penalty)."""
        return bool(self.frequency_penalty or self.presence_penalty)


def _check_structured(spec: object, vocab_size: int) -> None:
    """Compile the spec (cached), so that a bad schema or regex is an InvalidRequest at admission."""
    from dsi.structured.compiler import default_compiler
    from dsi.structured.spec import SpecError
    from dsi.structured.vocab import VOCAB_SIZE

    if not isinstance(spec, StructuredSpec):
        raise InvalidRequest("structured must be a StructuredSpec")
    if vocab_size != VOCAB_SIZE:
        raise InvalidRequest(
            f"structured output needs the V4 vocabulary ({VOCAB_SIZE} ids); this model has {vocab_size}"
        )
    try:
        default_compiler().check(spec)
    except SpecError as exc:
        raise InvalidRequest(f"structured output: {exc}") from None


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
