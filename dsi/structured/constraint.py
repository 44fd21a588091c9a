"""TokenConstraint: the per-request, stateful view of a grammar that the sampler drives.

Each step, for one request::

    fill_mask(bitmask)   bitmask [ceil(V/32)] int32: which ids may come next (layout in mask.py)
    accept(token)        advance by the chosen id; False if the grammar rejects it
    is_done()            nothing but EOS may follow: the output is complete

A constraint belongs to one request and is driven from one thread, in step order.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from dsi.structured.vocab import THINK_END_ID
from dsi.tokenizer import EOS_ID


@runtime_checkable
class TokenConstraint(Protocol):
    def fill_mask(self, bitmask: torch.Tensor) -> None: ...

    def accept(self, token: int) -> bool: ...

    def is_done(self) -> bool: ...

    def rollback(self, n: int) -> None: ...


class GuidanceConstraint:
    """An llguidance matcher. EOS is allowed in the mask whenever the output may end here."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher) -> None:  # llguidance.LLMatcher, owned by this constraint
        self._matcher = matcher

    def fill_mask(self, bitmask: torch.Tensor) -> None:
        if (
            bitmask.dtype != torch.int32
            or bitmask.dim() != 1
            or not bitmask.is_contiguous()
            or bitmask.is_cuda
        ):
            raise ValueError("bitmask must be a contiguous 1-D int32 CPU tensor")
        self._matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

    def accept(self, token: int) -> bool:
        return self._matcher.consume_token(token)

    def is_done(self) -> bool:
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def rollback(self, n: int) -> None:
        if n and not self._matcher.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: {self._matcher.get_error()}")

    @property
    def error(self) -> str:
        return self._matcher.get_error()


class AfterThink:
    """Leaves the reasoning section free: no mask until ``</think>`` (id 128822) is accepted,
    then ``inner`` applies to everything after it."""

    __slots__ = ("_free", "_inner", "_inner_count", "_open")

    def __init__(self, inner: TokenConstraint) -> None:
        self._inner = inner
        self._open = False
        self._free = 0  # tokens accepted before the constraint started (``</think>`` included)
        self._inner_count = 0

    @property
    def started(self) -> bool:
        return self._open

    def fill_mask(self, bitmask: torch.Tensor) -> None:
        if self._open:
            self._inner.fill_mask(bitmask)
        else:
            bitmask.fill_(-1)

    def accept(self, token: int) -> bool:
        if not self._open:
            self._free += 1
            self._open = token == THINK_END_ID
            return True
        ok = self._inner.accept(token)
        self._inner_count += ok
        return ok

    def is_done(self) -> bool:
        return self._open and self._inner.is_done()

    def rollback(self, n: int) -> None:
        inner = min(n, self._inner_count)
        self._inner.rollback(inner)
        self._inner_count -= inner
        if n > inner:  # back over </think>: the reasoning section is open again
            self._open = False
            self._free -= n - inner


class Rejecting:
    """A constraint that could not be rebuilt: only EOS passes the mask and every token is
    rejected, so the request ends with "error" at its next token instead of running on."""

    __slots__ = ()

    def fill_mask(self, bitmask: torch.Tensor) -> None:
        bitmask.zero_()
        bitmask[EOS_ID // 32] = 1 << (EOS_ID % 32)

    def accept(self, token: int) -> bool:
        return False

    def is_done(self) -> bool:
        return False

    def rollback(self, n: int) -> None:
        pass
