"""The V4 attention C kernel against its torch reference, and what it promises: a row's result has
the same bits alone and in any batch, whatever its group of heads, and reads only the keys its
lists name."""

from dataclasses import replace

import pytest
import torch

from dsi.kernels import native
from dsi.kernels import v4_attention as va

pytestmark = pytest.mark.skipif(
    not va.available(), reason=f"no C kernel here: {native.why_not('v4_attention')}"
)


def _case(hq: int, hkv: int, d: int, rows: int = 9, lists: int = 3, seed: int = 0):
    """Random rows over keys and latents addressed by shuffled offsets (as ring slots and pages
    are): (q, q_rot, KeyLists)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, hq + 1, d, generator=gen)[:, :hq]  # rows strided, heads contiguous
    q_rot = torch.randn(rows, hq, d, generator=gen)
    keys, vals = torch.randn(300, hkv, d, generator=gen), torch.randn(300, hkv, d, generator=gen)
    lat = torch.randn(700, d, generator=gen)
    swa_off = torch.stack([torch.randperm(300, generator=gen)[:260] * hkv * d for _ in range(lists)])
    lat_off = torch.stack([torch.randperm(700, generator=gen)[:600] * d for _ in range(lists)])
    seq = torch.randint(0, lists, (rows,), generator=gen)
    swa_lo = torch.randint(0, 100, (rows,), generator=gen)
    swa_hi = swa_lo + torch.randint(1, 160, (rows,), generator=gen)  # up to two blocks of 128
    lat_n = torch.randint(0, 600, (rows,), generator=gen)
    lat_n[0], lat_n[1] = 0, 129  # no latent; one past a block
    lists_ = va.KeyLists(hkv, keys, vals, d, swa_off, swa_lo, swa_hi, seq, lat, lat_off, lat_n)
    return q, q_rot, lists_


@pytest.mark.parametrize(
    "hq, hkv, d", [(4, 1, 64), (6, 2, 64), (40, 2, 128), (9, 3, 256), (4, 2, 16), (3, 1, 32)]
)
def test_the_kernel_equals_its_reference(hq, hkv, d):
    q, q_rot, keys = _case(hq, hkv, d)
    got = va.v4_attention(q, q_rot, keys)
    want = va.v4_attention_reference(q, q_rot, keys)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("hq, hkv", [(4, 1), (7, 1), (40, 2)])
def test_a_row_has_the_same_bits_alone_and_in_any_batch(hq, hkv):
    """7 heads run as sub-groups of 4, 2 and 1, 20 as five of 4: a head's bits are its own."""
    q, q_rot, keys = _case(hq, hkv, 64, rows=12)
    together = va.v4_attention(q, q_rot, keys)
    for r in range(12):
        alone = va.v4_attention(q[r : r + 1], q_rot[r : r + 1], keys.rows(r, r + 1))
        assert torch.equal(alone[0], together[r]), r
    # a head alone (its own group of one) gets the bits it gets among its group
    h = hq // hkv - 1
    single = va.v4_attention(q[:, h : h + 1], q_rot[:, h : h + 1], replace(keys, hkv=1))
    assert torch.equal(single, together[:, h * 64 : (h + 1) * 64])


def test_only_the_listed_keys_are_read():
    """NaNs everywhere else in the keys, values and latents leave every row's result unchanged."""
    q, q_rot, keys = _case(4, 1, 64)
    clean = va.v4_attention(q, q_rot, keys)
    k2, v2, l2 = (torch.full_like(t, float("nan")) for t in (keys.kbase, keys.vbase, keys.lbase))
    for r in range(q.shape[0]):
        at = keys.swa_off[keys.seq[r], keys.swa_lo[r] : keys.swa_hi[r]] // 64
        k2.view(-1, 64)[at], v2.view(-1, 64)[at] = keys.kbase.view(-1, 64)[at], keys.vbase.view(-1, 64)[at]
        la = keys.lat_off[keys.seq[r], : keys.lat_n[r]] // 64
        l2[la] = keys.lbase[la]
    dirty = va.v4_attention(q, q_rot, replace(keys, kbase=k2, vbase=v2, lbase=l2))
    assert torch.equal(dirty, clean)


def test_without_latents_only_the_window_counts():
    q, q_rot, keys = _case(4, 1, 64)
    keys = replace(keys, lbase=None, lat_off=None, lat_n=None)
    got = va.v4_attention(q, q_rot, keys)
    assert torch.allclose(got, va.v4_attention_reference(q, q_rot, keys), atol=2e-6, rtol=1e-5)


def test_rows_written_into_a_range_of_a_larger_result_are_the_batchs():
    q, q_rot, keys = _case(4, 1, 64)
    whole = va.v4_attention(q, q_rot, keys)
    out = torch.full((12, 256), 7.0)
    va.v4_attention(q[2:6], q_rot[2:6], keys.rows(2, 6), out=out[5:9])
    assert torch.equal(out[5:9], whole[2:6])
    assert bool((out[:5] == 7).all()) and bool((out[9:] == 7).all())
    with pytest.raises(ValueError, match="out must be fp32"):
        va.v4_attention(q[2:6], q_rot[2:6], keys.rows(2, 6), out=out[5:9, :128])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda k: dict(swa_off=k.swa_off + 10**9), "SWA offset points outside"),
        (lambda k: dict(lat_off=k.lat_off - 10**9), "latent offset points outside"),
        (lambda k: dict(swa_hi=k.swa_lo - 1), "SWA range"),
        (lambda k: dict(lat_n=k.lat_n + 10**4), "latent count"),
        (lambda k: dict(seq=k.seq + 3), "seq must name"),
        (lambda k: dict(swa_off=k.swa_off.int()), "int64"),
        (lambda k: dict(kbase=k.kbase.double()), "fp32"),
    ],
)
def test_bad_offsets_and_ranges_are_refused_before_the_kernel_reads(change, message):
    q, q_rot, keys = _case(4, 1, 64)
    with pytest.raises(ValueError, match=message):
        va.v4_attention(q, q_rot, replace(keys, **change(keys)))
