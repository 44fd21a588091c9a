"""RequestState: everything needed to continue a request in another engine instance.

Buffers (engine format, fp32, C-contiguous), in this order in one flat state buffer::

    pages    [num_blocks, page_elems]                       Block KV pages, in block-table order
    rings    [ring_layers, 2, window + rollback, n_kv_heads, D] SWA rings (slot = position % ring)
    partial  [n_sources, D]                                  compressor partial state
    images   [image tokens, hidden]                          only for a prompt with images: their
                                                             embeddings, in prompt order (the spans
                                                             travel in ``image_spans``)

``pages`` covers positions [0, num_computed); ``rings`` / ``partial`` are the state after
``num_computed`` positions. Output tokens past ``num_computed`` are known but not yet run
through the model (normally exactly one: the token the decode engine feeds next).

On the data plane a state travels as ``to_parts()`` (flat byte views, no copy); the receiver
rebuilds views over the one buffer it received with ``from_buffer`` and a ``StateLayout``
(a msgspec header, or the receiving engine's ``EngineShape.state_layout(num_blocks)``).

A ``Reservation`` holds pages and a state slot of a decode engine out of its scheduler's reach
until a state is imported into them (or it is released).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import msgspec
import torch

from dsi.engine.params import SamplingParams
from dsi.kvcache.layout import page_elems
from dsi.model.config import ModelConfig


class BufferSpec(msgspec.Struct, array_like=True, frozen=True, gc=False):
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix
    offset: int  # bytes from the start of the state buffer
    nbytes: int


class StateLayout(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Where each buffer of a RequestState lies inside one flat state buffer."""

    buffers: tuple[BufferSpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @classmethod
    def of(cls, cfg: ModelConfig, num_blocks: int, image_tokens: int = 0) -> StateLayout:
        shapes = [
            ("pages", (num_blocks, page_elems(cfg))),
            ("rings", (cfg.ring_layers, 2, cfg.ring, cfg.n_kv_heads, cfg.head_dim)),
            ("partial", (len(cfg.kv_sources), cfg.head_dim)),
        ]
        if image_tokens:
            shapes.append(("images", (image_tokens, cfg.hidden)))
        return cls._packed([(name, shape, "float32", 4) for name, shape in shapes])

    def with_images(self, image_tokens: int, hidden: int) -> StateLayout:
        """This layout with an ``images`` buffer of ``image_tokens`` rows (none for 0)."""
        parts = [
            (b.name, b.shape, b.dtype, getattr(torch, b.dtype).itemsize)
            for b in self.buffers
            if b.name != "images"
        ]
        if image_tokens:
            parts.append(("images", (image_tokens, hidden), "float32", 4))
        return self._packed(parts)

    def with_pages(self, num_blocks: int) -> StateLayout:
        """This layout with ``num_blocks`` pages instead (the other buffers unchanged)."""
        if num_blocks < 0:
            raise ValueError(f"a state holds 0 or more pages, not {num_blocks}")
        return self._packed(
            [
                (
                    b.name,
                    (num_blocks, *b.shape[1:]) if b.name == "pages" else b.shape,
                    b.dtype,
                    getattr(torch, b.dtype).itemsize,
                )
                for b in self.buffers
            ]
        )

    @classmethod
    def _packed(cls, parts: list[tuple[str, tuple[int, ...], str, int]]) -> StateLayout:
        specs, offset = [], 0
        for name, shape, dtype, size in parts:
            n = size
            for d in shape:
                n *= d
            specs.append(BufferSpec(name, tuple(shape), dtype, offset, n))
            offset += n
        return cls(tuple(specs))


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
    num_cached: int = 0  # H of a prefix hit (pages[: H // block_size] came from the store)
    replay_start: int = 0  # R: producer SWA keys start here (0 without a hit)
    images: torch.Tensor | None = None  # [image tokens, hidden] fp32; None: a prompt without images
    image_spans: list[tuple[int, int, bytes]] = field(default_factory=list)  # (offset, tokens, digest)
    # A held export (Engine.export_request(hold=True)): ``pages`` is a meta tensor of the pages'
    # shape, the bytes are ``page_rows`` (views of the engine's pool, one per page, in order), and
    # ``held`` names the pool pages kept for them until Engine.release_held.
    page_rows: tuple[torch.Tensor, ...] = ()
    held: tuple[int, ...] = ()

    def buffers(self) -> dict[str, tuple[tuple[int, ...], str, int]]:
        """name -> (shape, dtype, bytes) of each buffer."""
        return {
            name: (tuple(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size())
            for name, t in self._tensors()
        }

    @property
    def nbytes(self) -> int:
        return sum(b for _, _, b in self.buffers().values())

    def layout(self) -> StateLayout:
        return StateLayout._packed(
            [
                (name, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.element_size())
                for name, t in self._tensors()
            ]
        )

    def to_parts(self) -> list[memoryview]:
        """Flat byte views of pages, rings, partial (in ``layout()`` order), sharing memory with
        them (a held export's pages: one view per pool page); an empty one (a family without SWA
        rings or compressor state) is left out."""
        parts = []
        for name, t in self._tensors():
            if name == "pages" and self.page_rows:
                parts += [memoryview(row.numpy()).cast("B") for row in self.page_rows]
            elif t.numel():
                parts.append(memoryview(t.contiguous().numpy()).cast("B"))
        return parts

    @classmethod
    def from_buffer(
        cls,
        layout: StateLayout,
        buf: memoryview | bytes | bytearray,
        request_id: str,
        prompt: list[int],
        output: list[int],
        params: SamplingParams,
        seed: int,
        consumer_start: int,
        num_computed: int,
        logprobs: list[float],
        num_cached: int = 0,
        replay_start: int = 0,
        image_spans: list[tuple[int, int, bytes]] | None = None,
    ) -> RequestState:
        """Views (no copy) over one received state buffer. ``layout``: the sender's header, or
        the receiver's ``EngineShape.state_layout(num_blocks)``. A read-only buffer gives
        read-only tensors: import copies them into the engine and never writes."""
        view = memoryview(buf).cast("B")
        if layout.nbytes != view.nbytes:
            raise ValueError(f"the state buffer has {view.nbytes} bytes; its layout says {layout.nbytes}")
        t = {}
        with warnings.catch_warnings():  # torch warns about read-only buffers; we never write them
            warnings.simplefilter("ignore", UserWarning)
            for b in layout.buffers:
                dtype = getattr(torch, b.dtype)
                count = b.nbytes // torch.empty((), dtype=dtype).element_size()
                t[b.name] = (
                    torch.frombuffer(view, dtype=dtype, count=count, offset=b.offset).view(b.shape)
                    if count
                    else torch.empty(b.shape, dtype=dtype)
                )
        return cls(
            request_id,
            list(prompt),
            list(output),
            params,
            seed,
            consumer_start,
            num_computed,
            t["pages"],
            t["rings"],
            t["partial"],
            list(logprobs),
            num_cached,
            replay_start,
            t.get("images"),
            list(image_spans or []),
        )

    def _tensors(self) -> tuple[tuple[str, torch.Tensor], ...]:
        out = (("pages", self.pages), ("rings", self.rings), ("partial", self.partial))
        if self.images is not None and self.images.shape[0]:
            out += (("images", self.images),)
        return out


@dataclass(slots=True, eq=False)
class Reservation:
    """Pages and a state slot held for one incoming request (see ``Engine.reserve``)."""

    blocks: list[int]
    slot: int
    active: bool = True  # False once released or consumed by an import
    filled: bool = False  # a RequestState has been written into the pages and slot
