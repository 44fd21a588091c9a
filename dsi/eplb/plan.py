"""StepPlan: the slices of one step and the rank that computes each, as rank 0 broadcasts them.

Every rank decodes the same plan and takes the slices named for it, in step order: token ids,
positions (start), page table, state slot, the replay bounds, and image embeddings (raw fp32 rows,
so a worker embeds the same bits)."""

from __future__ import annotations

import msgspec
import torch

from dsi.engine.batch import StepSlice


class Embed(msgspec.Struct, array_like=True, gc=False):
    row: int
    shape: tuple[int, int]
    data: bytes  # [n, hidden] float32


class Row(msgspec.Struct, array_like=True, gc=False):
    rank: int
    slot: int
    block_table: list[int]
    start: int
    tokens: list[int]
    consumer_start: int
    sample: bool
    producer_start: int
    cached_end: int
    num_logits: int
    embeds: list[Embed] = []


class StepPlan(msgspec.Struct, array_like=True, gc=False):
    rows: list[Row]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(StepPlan)


def encode(batch: list[StepSlice], ranks: list[int]) -> torch.Tensor:
    """[nbytes] uint8 tensor of the plan."""
    rows = [_row(s, r) for s, r in zip(batch, ranks, strict=True)]
    return torch.frombuffer(bytearray(_ENCODER.encode(StepPlan(rows))), dtype=torch.uint8)


def decode(blob: torch.Tensor, rank: int) -> list[StepSlice]:
    """The slices of ``rank``, in step order."""
    plan = _DECODER.decode(blob.numpy().tobytes())
    return [_slice(r) for r in plan.rows if r.rank == rank]


def _row(s: StepSlice, rank: int) -> Row:
    embeds = [
        Embed(row, (t.shape[0], t.shape[1]), t.float().contiguous().numpy().tobytes()) for row, t in s.embeds
    ]
    return Row(
        rank, s.slot, s.block_table, s.start, s.tokens, s.consumer_start, s.sample,
        s.producer_start, s.cached_end, s.num_logits, embeds,
    )  # fmt: skip


def _slice(r: Row) -> StepSlice:
    embeds = [
        (e.row, torch.frombuffer(bytearray(e.data), dtype=torch.float32).view(e.shape)) for e in r.embeds
    ]
    return StepSlice(
        r.slot, r.block_table, r.start, r.tokens, r.consumer_start, r.sample,
        r.producer_start, r.cached_end, embeds, r.num_logits,
    )  # fmt: skip
