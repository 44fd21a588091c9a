"""Hit policy: which prefix hit a prefill takes, given what the store and the SWA state owners hold.

Two kinds of hit exist (see :mod:`dsi.model.reference`):

- exact: the pages of ``[0, H)`` plus the producer SWA state at H, pulled from the host that made
  it. Nothing is replayed (R = H) and the output is the hit-free one. H is at most
  ``exact_hit_limit``, so an exact hit may be shorter than what the store holds.
- bounded replay: the pages only; the producer layers recompute ``[R, H)`` to rebuild the SWA
  rings, ``R = max(0, min(H - window, consumer_start))``. Cheaper than a miss when R > 0, and its
  output is not the hit-free one (DeepSeek's bounded replay).

Policies, per cluster (``[kvcache] hit_policy``) and per request (``metadata.hit_policy``):

- ``bounded`` (default): the exact hit when its state can be pulled, else bounded replay over
  every page the store holds.
- ``exact``: only hits whose output is the hit-free one: the exact hit, else none. A bounded
  hit with R = 0 would qualify too, but R is where computing starts: it computes every prompt
  position, as a miss does, so it saves nothing and is not taken (a miss also keeps the
  request's pages and SWA state shareable).

A re-run of a request (its decode died after tokens reached the client) must produce those
tokens again, so it takes the hit the first run took, not what the store holds now
(:func:`pinned_hit`): no hit again; an exact hit again when its pages and state are still
there, else none (the output of both is the hit-free one); a bounded hit of H only with the
same H pages, since no other hit has its output.

A family without SWA rings (full attention in every layer: Llama) keeps its whole cache in the
pages, so every hit is exact with nothing to pull or replay: both policies take every stored
page (``rings=False`` below), and the hit's output is the hit-free one.

Worked example (tiny and flash shapes: block 128, window 128, keep 140), a 900-token prompt whose
first 6 blocks (768 tokens) the store holds: ``exact_boundary`` = min(768, 760 // 128 * 128) = 640.

    state at 640 held   bounded -> exact 640        exact -> exact 640
    not held            bounded -> replay 768 (R = 640, 128 replayed)   exact -> none
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from dsi.model.hits import exact_hit_limit, max_hit

HitPolicy = Literal["bounded", "exact"]
HIT_POLICIES: tuple[str, ...] = get_args(HitPolicy)
DEFAULT_HIT_POLICY: HitPolicy = "bounded"


class HitChoice(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """The hit a prefill takes: ``tokens`` = H (0 = none); ``exact``: load the pulled SWA state.

    It also travels: the hit a request's run took comes back to the gateway in its first
    ``TokenChunk``, and a re-run of the request is pinned to it (``Generate.pin_hit``)."""

    tokens: int = 0
    exact: bool = False


NO_HIT = HitChoice()


def fetch_limit(
    policy: HitPolicy, prompt_len: int, keep: int | None, block_size: int, rings: bool = True
) -> int:
    """Tokens of leading pages worth fetching from the store (a multiple of block_size).
    ``rings``: the model has SWA rings (False: every hit is exact, see the module docstring)."""
    return (
        max_hit(prompt_len, block_size)
        if policy == "bounded" or not rings
        else exact_hit_limit(prompt_len, keep, block_size)
    )


def exact_boundary(stored: int, prompt_len: int, keep: int | None, block_size: int) -> int:
    """Where an exact hit ends when the store holds the first ``stored`` tokens (0 = none possible):
    the SWA state to pull is the one at this boundary."""
    return min(stored, exact_hit_limit(prompt_len, keep, block_size))


def choose_hit(
    policy: HitPolicy,
    stored: int,
    prompt_len: int,
    keep: int | None,
    block_size: int,
    state_held: bool,
    rings: bool = True,
) -> HitChoice:
    """The hit to take. ``stored``: leading tokens whose pages were fetched (a multiple of
    block_size, at most ``max_hit``); ``state_held``: the SWA state at :func:`exact_boundary`
    was pulled; ``rings``: the model has SWA rings (False: every stored page, exact)."""
    if not rings:
        hit = min(stored, max_hit(prompt_len, block_size))
        return HitChoice(hit, exact=True) if hit > 0 else NO_HIT
    boundary = exact_boundary(stored, prompt_len, keep, block_size)
    if state_held and boundary > 0:
        return HitChoice(boundary, exact=True)
    if policy == "bounded" and stored > 0:
        return HitChoice(stored)
    return NO_HIT


def predicted_hit(
    policy: HitPolicy, stored: int, prompt_len: int, keep: int | None, block_size: int, rings: bool = True
) -> int:
    """The hit the gateway reports before routing, from the store's index alone. It cannot see
    which SWA states are held: ``bounded`` predicts every stored token, ``exact`` the exact
    boundary (an evicted state makes the real hit 0); without rings, every stored token."""
    if policy == "bounded" or not rings:
        return stored
    return exact_boundary(stored, prompt_len, keep, block_size)


def pinned_hit(pin: HitChoice, stored: int, state_held: bool) -> HitChoice | None:
    """The hit a re-run pinned to ``pin`` takes, or None when no hit with the pinned output is
    possible (a bounded hit whose pages are gone). ``stored``: leading tokens whose pages were
    fetched (at most ``pin.tokens``); ``state_held``: the SWA state at ``pin.tokens`` was pulled.

        pin            pages + state there    pages only       pages gone
        none           none                   none             none
        exact H        exact H                none             none      (both hit-free)
        bounded H      bounded H              bounded H        None      (nothing else is its output)
    """
    if pin.tokens == 0:
        return NO_HIT
    if pin.exact:
        return pin if stored >= pin.tokens and state_held else NO_HIT
    return pin if stored >= pin.tokens else None
