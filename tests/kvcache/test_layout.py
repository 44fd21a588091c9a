import torch

from dsi.kvcache.layout import BlockLayout, account, engine_block_bytes, engine_state_bytes
from dsi.model.config import FLASH, TINY


def test_flash_block_is_near_111_kib():
    acc = account(FLASH)
    # 3 sources x 64 latents + 128 global latents, 336 B each, + 128 indexer keys of 36 B.
    assert acc.block == 3 * 64 * 336 + 128 * (336 + 36) == 112_128
    assert 105 * 1024 < acc.block < 115 * 1024
    assert acc.state_slot == 40 * 2 * 134 * 256 * 2 + 3 * 256 * 4


def test_tiny_engine_bytes_match_layout():
    layout = BlockLayout(TINY)
    assert layout.elems == (2 * 64 + 128) * 64
    assert engine_block_bytes(TINY) == layout.elems * 4 == account(TINY).block
    assert engine_state_bytes(TINY) == (8 * 2 * 134 * 64 + 2 * 64) * 4


def test_views_partition_the_page_without_overlap():
    layout = BlockLayout(TINY)
    pages = torch.zeros(3, layout.elems)
    layout.source_view(pages, 0)[1].fill_(1)
    layout.source_view(pages, 1)[1].fill_(2)
    layout.global_view(pages)[1].fill_(3)
    assert pages[0].abs().sum() == 0 and pages[2].abs().sum() == 0
    counts = torch.bincount(pages[1].long(), minlength=4).tolist()
    assert counts == [0, 64 * 64, 64 * 64, 128 * 64]
