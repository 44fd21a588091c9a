"""The Triton paged decode attention against its torch reference (Triton's interpreter, CPU),
and the reference against the engine's decode attention."""

import math

import pytest
import torch

from dsi.engine.decode_batch import attend_decode, build_index
from dsi.model.config import TINY
from tests.kernels.interpreted import interpreted

da = interpreted("decode_attention")


def case(dtype=torch.float32, hq=4, hkv=2, d=16, window=16, ring=20, seed=0):
    """Three rows: a short one, one whose window wraps the ring with a late SWA start, one with no
    latents yet; pages seen through a strided view, as the engine's page views are."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return dict(
        q=r(3, hq, d),
        q_rot=r(3, hq, d),
        ring=r(4, 2, ring, hkv, d),
        slots=torch.tensor([2, 0, 3]),
        pos=torch.tensor([5, 30, 17]),
        swa_start=torch.tensor([0, 20, 10]),
        window=window,
        latents=r(6, 8, d)[:, ::2],  # [6, 4, d], strided
        tables=torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1], [2, 2, 2, 2, 2]]),
        count=torch.tensor([3, 15, 0]),
    )


@pytest.mark.parametrize("latents", [True, False])
def test_kernel_matches_reference_fp32(latents):
    args = case()
    if not latents:
        args.update(latents=None, tables=None, count=None)
    out = da.paged_decode_attention(**args)
    ref = da.paged_decode_attention_reference(**args)
    assert out.shape == (3, 4 * 16) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_kernel_matches_reference_fp16():
    args = case(torch.float16, hq=2, hkv=1, d=8)
    out = da.paged_decode_attention(**args)
    torch.testing.assert_close(out, da.paged_decode_attention_reference(**args), rtol=1e-3, atol=1e-3)


def test_a_row_gets_the_same_bits_alone_and_in_a_batch():
    args = case()
    batch = da.paged_decode_attention(**args)
    one = {
        k: (v[1:2] if isinstance(v, torch.Tensor) and k not in ("ring", "latents") else v)
        for k, v in args.items()
    }
    assert torch.equal(da.paged_decode_attention(**one)[0], batch[1])


def test_keys_outside_the_window_and_latents_past_count_are_ignored():
    args = case()
    before = da.paged_decode_attention(**args)
    ring = args["ring"].clone()
    ring[0, :, 13] = 1e4  # slot 0's position 13 (row 1 sees 20 .. 30 at ring rows 0 .. 10)
    latents = args["latents"].clone()
    latents[1, 3] = 1e4  # row 0's entry 3 (it sees 3 entries); row 1 reaches page 1 at entry 16
    after = da.paged_decode_attention(**{**args, "ring": ring, "latents": latents})
    assert torch.equal(after, before)


def test_reference_is_the_engines_decode_attention():
    """The kernel's semantics are the engine's: the reference equals ``attend_decode`` (its CPU
    path) on the tiny model's shape, the new key written into the ring first."""
    cfg, g = TINY, torch.Generator().manual_seed(1)
    b, hq, hkv, d = 2, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, q_rot = torch.randn(b, hq, d, generator=g), torch.randn(b, hq, d, generator=g)
    k_new, v_new = torch.randn(b, hkv, d, generator=g), torch.randn(b, hkv, d, generator=g)
    ring = torch.randn(3, 2, cfg.ring, hkv, d, generator=g)
    pages = torch.randn(4, 64, d, generator=g)
    pos, tables = [150, 40], [[1, 2], [3]]
    idx = build_index(cfg, [0, 1], [2, 0], pos, [0, 30], tables)
    count = (idx.pos + 1) // 2
    n = int(count.max())
    entries = torch.arange(n)[None, :].expand(b, n)
    lat = pages[idx.tables.gather(1, entries // 64), entries % 64]
    engine = attend_decode(cfg, q, q_rot, k_new, v_new, ring, idx, lat, entries < count[:, None])
    written = ring.clone()
    written[idx.slots, 0, idx.pos % cfg.ring] = k_new
    written[idx.slots, 1, idx.pos % cfg.ring] = v_new
    ref = da.paged_decode_attention_reference(
        q, q_rot, written, idx.slots, idx.pos, idx.swa_start, cfg.window, pages, idx.tables, count
    )
    torch.testing.assert_close(ref, engine, rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(ref.abs().sum()))


def test_wrapper_checks_shapes():
    args = case()
    with pytest.raises(ValueError, match="int64"):
        da.paged_decode_attention(**{**args, "pos": args["pos"].int()})
    with pytest.raises(ValueError, match="tables"):
        da.paged_decode_attention(**{**args, "tables": None})
