"""EngineShape: what a role may know of an engine, fixed when the engine is built.

A role sizes buffers and hashes prompts from this value and talks to the engine only through
``EngineService`` calls; it never reads the engine's scheduler, pool or model config::

    prefill: hash_chain.hashes(prompt)  --> kvstore fetch of page_bytes each --> [n, page_elems] fp32
             ring_shape                 --> the bytes of a pulled SWA state
             keep, block_size           --> where an exact hit may end (exact_hit_limit)
    decode:  blocks(len(prompt))        --> reserve pages; state_layout(n) --> receive region size
                                            and the views over the received state buffer

Every field follows from the model config and the engine config; nothing here changes while the
engine runs (what changes is in ``EngineLoad``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsi.engine.prefix import ring_snapshot_shape
from dsi.engine.transfer import StateLayout
from dsi.kvcache.hashchain import HashChain
from dsi.kvcache.layout import page_elems
from dsi.model.config import ModelConfig

_FP32 = 4  # bytes: the engine format of pages, rings and partial state


@dataclass(frozen=True, slots=True)
class EngineShape:
    block_size: int  # tokens per Block KV page, and per block of the hash chain
    page_elems: int  # fp32 values in one page
    ring_shape: tuple[
        int, ...
    ]  # one SWA ring snapshot: [n_producer, 2, block_size, n_kv_heads, head_dim] fp32
    keep: (
        int | None
    )  # decoder-side bounded replay: consumer layers see the last `keep` prompt tokens; None: off
    num_pages: int  # usable Block KV pages (the null page is not counted)
    num_slots: int  # state slots: the most sequences the engine holds at once
    hash_chain: HashChain  # the chain hashes of this engine's pages (model, cluster root seed)
    state: StateLayout  # a RequestState with no pages (see state_layout)
    hidden: int = 0  # the model's hidden size: the width of an image embedding

    @classmethod
    def of(
        cls, cfg: ModelConfig, *, num_blocks: int, num_slots: int, root_seed: int = 0, replay: bool = True
    ) -> EngineShape:
        """The shape of an engine of model ``cfg`` with ``num_blocks`` pages (the null page
        included) and ``num_slots`` state slots."""
        return cls(
            block_size=cfg.block_size,
            page_elems=page_elems(cfg),
            ring_shape=ring_snapshot_shape(cfg),
            # `replay` switches the V4 consumer half; a family without one keeps its keep (Gemma 3: 0).
            keep=cfg.keep if replay or cfg.family != "v4" else None,
            num_pages=num_blocks - 1,
            num_slots=num_slots,
            hash_chain=HashChain.of(cfg, root_seed),
            state=StateLayout.of(cfg, 0),
            hidden=cfg.hidden,
        )

    @property
    def page_bytes(self) -> int:
        return self.page_elems * _FP32

    @property
    def ring_bytes(self) -> int:
        return math.prod(self.ring_shape) * _FP32

    @property
    def rings(self) -> bool:
        """Whether the model keeps SWA rings; without (full attention), the pages are the whole
        cache and every prefix hit is exact (see dsi.engine.hit_policy)."""
        return self.ring_bytes > 0

    def blocks(self, num_tokens: int) -> int:
        """Pages that hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def state_layout(self, num_blocks: int, image_tokens: int = 0) -> StateLayout:
        """Where pages, rings and partial state (and the embeddings of ``image_tokens`` image
        positions) lie in a flat state buffer with ``num_blocks`` pages."""
        layout = self.state.with_pages(num_blocks)
        return layout.with_images(image_tokens, self.hidden) if image_tokens else layout

    def state_nbytes(self, num_blocks: int) -> int:
        """Bytes of a RequestState with ``num_blocks`` pages (what a lease must receive)."""
        return self.state_layout(num_blocks).nbytes
