"""RequestState: everything needed to continue a request in another engine instance.

Buffers (engine format, fp32, C-contiguous)::

    pages    [num_blocks, page_elems]                       Block KV pages, in block-table order
    rings    [n_layers, 2, window + rollback, n_kv_heads, D] SWA rings (slot = position % ring)
    partial  [n_sources, D]                                  compressor partial state

``pages`` covers positions [0, num_computed); ``rings`` / ``partial`` are the state after
``num_computed`` positions. Output tokens past ``num_computed`` are known but not yet run
through the model (normally exactly one: the token the decode engine feeds next).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.engine.params import SamplingParams


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: list[int]
    output: list[int]
    params: SamplingParams
    seed: int
    consumer_start: int
    num_computed: int
    pages: torch.Tensor
    rings: torch.Tensor
    partial: torch.Tensor
    logprobs: list[float]

    def buffers(self) -> dict[str, tuple[tuple[int, ...], str, int]]:
        """name -> (shape, dtype, bytes) of each buffer."""
        return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size())
                for name, t in (("pages", self.pages), ("rings", self.rings), ("partial", self.partial))}

    @property
    def nbytes(self) -> int:
        return sum(b for _, _, b in self.buffers().values())
