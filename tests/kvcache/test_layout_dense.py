"""The cache layout of a full-attention family: pages hold every layer's K and V; the state slot
and the ring snapshot are empty, so a request's state is its pages."""

import torch

from dsi.engine.shape import EngineShape
from dsi.kvcache.layout import page_elems
from dsi.kvcache.layout_dense import DenseBlockLayout
from dsi.kvcache.state_slots import StateSlots
from dsi.model.config import TINY
from dsi.model.llama import LlamaConfig

SMOL = LlamaConfig(
    "smol", vocab_size=49152, hidden=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, intermediate=1536
)


def test_page_holds_k_and_v_of_every_layer():
    assert page_elems(SMOL) == 30 * 2 * 128 * 3 * 64 == DenseBlockLayout(SMOL).elems
    pages = torch.arange(2 * page_elems(SMOL), dtype=torch.float32).view(2, -1)
    view = DenseBlockLayout(SMOL).kv_view(pages)
    assert view.shape == (2, 30, 2, 128, 3, 64)
    assert view[1, 0, 1, 0, 0, 0] == page_elems(SMOL) + 128 * 3 * 64  # layer 0's V follows its K
    assert page_elems(TINY) != page_elems(SMOL)  # the V4 page layout is unchanged


def test_state_is_the_pages_alone():
    shape = EngineShape.of(SMOL, num_blocks=5, num_slots=2)
    assert shape.page_bytes == 4 * page_elems(SMOL) and shape.keep is None
    assert shape.ring_bytes == 0
    assert shape.state_nbytes(3) == 3 * shape.page_bytes
    slots = StateSlots(SMOL, 2)
    assert slots.rings.numel() == 0 and slots.partial.numel() == 0
