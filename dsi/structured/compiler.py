"""GrammarCompiler: StructuredSpec -> per-request TokenConstraint, with a cache of compiled grammars.

Compiling is llguidance matcher construction (about 1 ms for a typical schema, more for large
ones); a request's constraint is a deep copy of the cached, never-advanced matcher (about 5 us).
The cache is keyed by the spec without ``after_think`` (which wraps, but does not change, the
grammar) and keeps the ``capacity`` most recently used grammars. Safe to call from several
threads: the engine compiles on admission and rebuilds on its worker.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterable

import msgspec

from dsi.structured.constraint import AfterThink, GuidanceConstraint, TokenConstraint
from dsi.structured.grammar import grammar_text
from dsi.structured.spec import SpecError, StructuredSpec
from dsi.structured.vocab import guidance_tokenizer

_MAX_ERROR = 400  # characters of a grammar engine message kept in an error


class GrammarCompiler:
    def __init__(self, tokenizer=None, capacity: int = 256) -> None:  # llguidance.LLTokenizer
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._tokenizer = tokenizer
        self.capacity = capacity
        self._cache: OrderedDict[StructuredSpec, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def check(self, spec: StructuredSpec) -> None:
        """Compile (or find in the cache); raises SpecError with the reason."""
        self._template(spec)

    def constraint(self, spec: StructuredSpec) -> TokenConstraint:
        """A fresh constraint at the start of the output."""
        template = self._template(spec)
        with self._lock:
            inner = GuidanceConstraint(template.deep_copy())
        return AfterThink(inner) if spec.after_think else inner

    def replay(self, spec: StructuredSpec, tokens: Iterable[int]) -> TokenConstraint:
        """A constraint that has accepted ``tokens`` (an output so far); SpecError if it does not fit."""
        constraint = self.constraint(spec)
        for i, token in enumerate(tokens):
            if not constraint.accept(token):
                raise SpecError(
                    f"output token {i} (id {token}) does not fit the structured output constraint"
                )
        return constraint

    # ---- internals -----------------------------------------------------------------------------
    def _template(self, spec: StructuredSpec):
        key = msgspec.structs.replace(spec, after_think=False) if spec.after_think else spec
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return template
        template = self._compile(key)
        with self._lock:
            self.misses += 1
            self._cache[key] = template
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return template

    def _compile(self, spec: StructuredSpec):
        import llguidance

        try:
            grammar = grammar_text(spec)
        except (ValueError, TypeError, KeyError) as exc:
            raise _spec_error(spec, str(exc)) from None
        matcher = llguidance.LLMatcher(self._tokenizer or guidance_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise _spec_error(spec, matcher.get_error())
        return matcher


def _spec_error(spec: StructuredSpec, message: str) -> SpecError:
    message = " ".join(message.split())
    if len(message) > _MAX_ERROR:
        message = message[:_MAX_ERROR] + "..."
    return SpecError(f"{spec.kind}: cannot compile the constraint: {message}")


@functools.lru_cache(maxsize=1)
def default_compiler() -> GrammarCompiler:
    """The process-wide compiler over the V4 vocabulary (its cache is shared by every engine)."""
    return GrammarCompiler()
