"""Workspace: one buffer per name, reused while big enough, grown when not, never kept past its cap."""

import torch

from dsi.engine.workspace import Workspace


def test_a_name_reuses_its_buffer_while_it_is_big_enough():
    ws = Workspace()
    a = ws.rows("gate_up", 30, 64)
    b = ws.rows("gate_up", 12, 64)
    assert a.shape == (30, 64) and b.shape == (12, 64)
    assert b.data_ptr() == a.data_ptr() and b.is_contiguous()
    assert ws.nbytes() == 30 * 64 * 4


def test_a_larger_request_grows_the_buffer_and_names_do_not_share():
    ws = Workspace()
    small = ws.rows("norm", 4, 16)
    other = ws.rows("proj", 4, 16)
    assert other.data_ptr() != small.data_ptr()
    big = ws.rows("norm", 100, 16)
    assert big.shape == (100, 16) and big.data_ptr() != small.data_ptr()
    assert ws.rows("norm", 4, 16).data_ptr() == big.data_ptr()


def test_a_request_over_the_cap_gets_a_fresh_tensor_that_is_not_kept():
    ws = Workspace(max_bytes=1024)
    kept = ws.rows("x", 16, 16)  # exactly 1 KiB
    over = ws.rows("x", 17, 16)
    assert over.shape == (17, 16) and over.data_ptr() != kept.data_ptr()
    assert ws.rows("x", 16, 16).data_ptr() == kept.data_ptr()
    assert ws.nbytes() == 1024


def test_zero_rows_are_an_empty_view():
    assert Workspace().rows("act", 0, 8).shape == (0, 8)
    assert torch.equal(Workspace().rows("act", 0, 8), torch.empty(0, 8))
