"""Speculator: the engine's speculative decoding (``[engine] speculative = "fixed" | "dspark"``).

One step of a speculating request (sync scheduling; see the engine's docstring)::

    step N:   forward [y, d_1 .. d_k]  ->  verify (spec_verify)  ->  emit t_0 .. t_j
              rollback: num_computed = start + j + 1; compressor partial state put back
              propose: draft(hidden at start + j, t_j) -> d'_1 .. d'_K with confidences
    step N+1: lengths chosen (fixed K, or dspark_lengths over the confidences and the step curve)

With async scheduling (the engine schedules step N + 1 while N runs) a request decoding one
token a step verifies, in N + 1, the drafts that N proposes after sampling the token N + 1
takes as input: the worker fills them in. How many is chosen when N + 1 is scheduled, before
they exist, from the confidences of the drafts N - 1 proposed (one step stale). Where a request
continues after a verify slice is known only once the worker has verified it: the step after
gives it one token (no drafts) that the worker places there (the scheduler's floating slice);
the runner's rollback runs on the worker, before that step's forward.

A request's tokens do not depend on its drafts (see spec_verify): the draft's draw at a position
reads the request's own variates there (dsi.engine.noise), so it agrees with the target's
draw as often as the two distributions allow, and verifying only checks that it did. How many
drafts a step verifies (chosen over the whole step by DSpark) changes the tokens per step, never
the tokens. With ``batch_invariant`` the draft's products go through dsi.engine.invariant, so
its drafts and confidences do not depend on the batch either.

Which requests speculate: decoding ones (one token behind), not prefill-only, without
penalties (their logits depend on the output so far; they decode one token per step in the
same batch). Structured output does: each verified position is masked by the grammar advanced
through the drafts before it (``spec_verify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dsi.engine.noise import exponentials
from dsi.engine.request import Request, constraint_at
from dsi.engine.sampler import target_probs
from dsi.engine.spec_policy import dspark_lengths, fixed_lengths
from dsi.engine.spec_verify import Verified, verify
from dsi.engine.step_curve import StepCurve
from dsi.model.draft import draft_step
from dsi.model.ops import Matmul

MODES = ("off", "fixed", "dspark")


@dataclass(slots=True)
class Drafts:
    position: int  # where the first draft sits (the request's num_tokens when proposed)
    tokens: list[int]
    confidence: list[float]


@dataclass(slots=True)
class SpecStats:
    """Counters since the engine started. ``reached[i]``: draft i + 1 was verified with every
    draft before it accepted; ``accepted[i]``: and it was accepted too."""

    steps: int = 0
    verify_slices: int = 0
    reached: list[int] = field(default_factory=lambda: [0] * 8)
    accepted: list[int] = field(default_factory=lambda: [0] * 8)
    lengths: dict[int, int] = field(default_factory=dict)  # drafts verified per request -> count
    emitted: int = 0  # tokens emitted by speculating requests

    def accept_rates(self, k: int) -> list[float | None]:
        return [self.accepted[i] / self.reached[i] if self.reached[i] else None for i in range(k)]


class Speculator:
    def __init__(
        self,
        mode: str,
        num_drafts: int,
        draft: dict[str, torch.Tensor],
        embed: torch.Tensor,
        eps: float,
        max_context: int,
        mm: Matmul = torch.matmul,
    ) -> None:
        """``mm``: the draft's products (:func:`dsi.engine.invariant.mm` on a batch-invariant engine)."""
        if mode not in MODES[1:]:
            raise ValueError(f"speculative must be one of {', '.join(MODES)}, not {mode!r}")
        if not 1 <= num_drafts <= 5:
            raise ValueError("num_drafts must be in 1..5 (the SWA rings keep 6 positions of slack)")
        self.mode = mode
        self.k = num_drafts
        self.w = draft
        self.embed = embed
        self.vocab = draft["draft.vocab"]
        self.out_embed = embed[self.vocab].contiguous()  # [Vd, H] the draft's output projection
        self.eps = eps
        self.mm = mm
        self.max_context = max_context
        self.curve: StepCurve | None = None
        self.stats = SpecStats()
        self._drafts: dict[int, Drafts] = {}
        # Draft steps the next proposal runs. dspark: one more than the longest prefix it chose
        # last step (at least 1), so that when drafts do not pay their cost is one draft step
        # (the confidences of position 1, one step stale), not K.
        self.depth = num_drafts
        # Async scheduling: the lengths of a step are chosen before the drafts they take are
        # proposed, so every proposal drafts K (depth is not cut to the last step's lengths).
        self.pipelined = False

    @staticmethod
    def eligible(req: Request) -> bool:
        return not (req.prefill_only or req.params.penalized)

    def forget(self, req: Request) -> None:
        self._drafts.pop(id(req), None)

    def clear(self) -> None:
        self._drafts.clear()

    # ---- planning (CPU, before scheduling) ---------------------------------------------------------
    def plan(
        self, running: Sequence[Request], positions: Sequence[int], base_tokens: int, budget: int
    ) -> dict[int, int]:
        """id(request) -> drafts to verify this step. ``running``: requests with a one-token
        decode slice in the step; ``positions``: where each one's first draft would sit (its
        slice's start + 1). A request whose drafts sit there may verify some; one whose input
        token is still being sampled (position num_tokens + 1, async scheduling) may verify
        the drafts the step in flight will propose, planned with the confidences of the drafts
        before them (position num_tokens) when those are all that is known yet."""
        reqs, avail = [], []
        for req, pos in zip(running, positions, strict=True):
            d = self._drafts.get(id(req))
            pending = pos > req.num_tokens  # the drafts are proposed by the step in flight
            if d is None or not (d.position == pos or (pending and d.position == pos - 1)):
                continue
            # tokens it may still emit after those in flight, and positions the context holds
            room = (
                min(req.params.max_tokens - len(req.output), self.max_context - req.num_tokens)
                - req.in_flight
            )
            n = min(len(d.tokens), room)
            if n > 0:
                reqs.append(req)
                avail.append(n)
        if not reqs:
            return {}
        if self.mode == "fixed" or self.curve is None:
            lengths = fixed_lengths(avail, self.k, budget)
        else:
            curve, sampled = self.curve, len(running)
            lengths = dspark_lengths(
                [self._drafts[id(r)].confidence[:n] for r, n in zip(reqs, avail, strict=True)],
                base_tokens,
                sampled,
                lambda n: curve.step_time(sampled, n),
                budget,
            )
        self.stats.steps += 1
        if self.mode == "dspark" and not self.pipelined:
            self.depth = min(self.k, max(lengths, default=0) + 1)
        for n in lengths:
            self.stats.lengths[n] = self.stats.lengths.get(n, 0) + 1
        return {id(r): n for r, n in zip(reqs, lengths, strict=True) if n}

    def drafts_of(self, req: Request, n: int) -> list[int]:
        return self._drafts[id(req)].tokens[:n]

    def fill_drafts(self, req: Request, position: int, n: int, last: int) -> list[int]:
        """Worker (async scheduling): the first ``n`` drafts at ``position``, proposed by the
        step before. A request that finished meanwhile got none (its tokens are discarded):
        ``last`` repeated, which ``verify`` then does not check."""
        d = self._drafts.get(id(req))
        if d is None or d.position != position or len(d.tokens) < n:
            return [last] * n
        return d.tokens[:n]

    # ---- worker: verify and propose -----------------------------------------------------------------
    def verify(self, req: Request, logits: torch.Tensor, start: int) -> Verified:
        """logits: [k + 1, V] of a verify slice at ``start`` (k = its drafts)."""
        k = logits.shape[0] - 1
        d = self._drafts.get(id(req))
        constraint = constraint_at(start + 1, req)  # having accepted the output so far
        if d is None or d.position != start + 1 or len(d.tokens) < k:  # see fill_drafts
            return verify(logits[:1], [], req.params, req.seed, start, constraint)
        out = verify(logits, d.tokens[:k], req.params, req.seed, start, constraint)
        st = self.stats
        st.verify_slices += 1
        st.emitted += len(out.tokens)
        for i in range(min(out.accepted + 1, k)):
            st.reached[i] += 1
            st.accepted[i] += i < out.accepted
        return out

    @torch.no_grad()
    def propose(
        self, reqs: list[Request], hidden: torch.Tensor, tokens: list[int], positions: list[int]
    ) -> None:
        """Draft K tokens for each request from the target's hidden state [N, H] at its last
        kept position and the token just emitted there; ``positions``: where each request's
        first draft sits. Greedy requests take the draft's argmax; sampled ones race over the
        draft's distribution with their own variates at each draft's position. Stored until the
        next plan."""
        if not reqs:
            return
        h, tok = hidden, torch.tensor(tokens, dtype=torch.long)
        sampled = [row for row, req in enumerate(reqs) if not req.params.greedy]
        drafts: list[list[int]] = [[] for _ in reqs]
        conf: list[list[float]] = [[] for _ in reqs]
        for i in range(self.depth):
            h, logits, c = draft_step(self.w, self.embed, h, tok, self.eps, self.out_embed, self.mm)
            choice = logits.argmax(dim=-1)
            if sampled:
                choice[sampled] = self._race(logits, [reqs[r] for r in sampled], sampled, positions, i)
            tok = self.vocab[choice]
            for row, (t, ci) in enumerate(zip(tok.tolist(), torch.sigmoid(c).tolist(), strict=True)):
                drafts[row].append(t)
                conf[row].append(ci)
        for row, req in enumerate(reqs):
            self._drafts[id(req)] = Drafts(positions[row], drafts[row], conf[row])

    def _race(
        self, logits: torch.Tensor, reqs: list[Request], rows: list[int], positions: list[int], i: int
    ) -> torch.Tensor:
        """Draft i's draw for sampled rows ``rows`` of ``logits`` [N, Vd]: per row, the index of
        the largest q / E over the draft vocabulary, E the request's variates at that draft's
        position (the ones the target's own race reads there) -> [len(rows)] int64."""
        at = [positions[r] + i for r in rows]
        noise = exponentials([req.seed for req in reqs], at, self.vocab)  # [len(rows), Vd]
        q = torch.stack([target_probs(logits[r], req.params) for r, req in zip(rows, reqs, strict=True)])
        return (q / noise).argmax(dim=-1)
