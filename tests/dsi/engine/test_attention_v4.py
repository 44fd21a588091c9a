"""The V4 runner's C-kernel attention: a query gets the same bits in any chunk and as a decode slice
read from the rings and pages, close to the torch attention; the engine is batch-invariant with it."""

import pytest
import torch

from dsi.engine import attention_v4, invariant
from dsi.kernels import native
from dsi.kernels import v4_attention as kernel
from dsi.model.ops import attend

pytestmark = pytest.mark.skipif(
    not kernel.available(), reason=f"no C kernel here: {native.why_not('v4_attention')}"
)

WINDOW, RING, D = 128, 134, 64


def _sequence(total: int, hq: int, hkv: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, q_rot = torch.randn(total, hq, D, generator=g), torch.randn(total, hq, D, generator=g)
    keys, vals = torch.randn(total, hkv, D, generator=g), torch.randn(total, hkv, D, generator=g)
    return q, q_rot, keys, vals, torch.randn(total, D, generator=g)  # latents: entry n covers position n


@pytest.mark.parametrize("hq,hkv", [(4, 1), (6, 2), (40, 2)])
def test_a_query_gets_the_same_bits_in_any_chunk_and_as_a_decode_slice(hq, hkv):
    total, swa_start = 420, 3
    q, q_rot, keys, vals, lat = _sequence(total, hq, hkv)
    pos = torch.arange(total)
    native = attention_v4.NativeAttention(WINDOW)

    def chunk(s: int, e: int) -> torch.Tensor:
        lo = max(swa_start, s - WINDOW + 1)
        return native.chunk(q[s:e], q_rot[s:e], s, keys[lo:e], vals[lo:e], lo, swa_start, lat[:e], pos[:e])

    whole = chunk(0, total)
    for s, e in [(0, 7), (100, 300), (255, 256), (256, 420), (399, 420)]:
        assert torch.equal(chunk(s, e), whole[s:e]), (s, e)
    want = attend(q, q_rot, pos, keys, vals, pos, swa_start, lat, pos, WINDOW)
    assert torch.allclose(whole, want, atol=1e-5, rtol=1e-5)

    # The same queries as decode slices of a batch: rings of 134 positions (one layer's view of
    # three layers' rings) holding the window and NaNs elsewhere; latents in shuffled pages of 16
    # entries, NaNs past each slice's count.
    ts = torch.tensor([0, 130, 255, 256, 300, 419])
    rings = torch.full((len(ts) + 2, 3, 2, RING, hkv, D), float("nan"))
    ring = rings[:, 1]
    slots = torch.arange(len(ts)) + 2
    for b, t in enumerate(ts.tolist()):
        for p in range(max(0, t - WINDOW + 1), t + 1):
            ring[slots[b], 0, p % RING], ring[slots[b], 1, p % RING] = keys[p], vals[p]
    per_page, width = 16, -(-total // 16)
    pages = torch.full((len(ts) * width + 1, 2, per_page, D), float("nan"))
    view = pages[:, 1]  # one part of every page, as the runner's page views are
    tables = torch.randperm(len(ts) * width).view(len(ts), width) + 1
    for b, t in enumerate(ts.tolist()):
        for n in range(t + 1):
            view[tables[b, n // per_page], n % per_page] = lat[n]
    got = native.decode(
        q[ts], q_rot[ts], ring, slots, ts, torch.full_like(ts, swa_start), (view, tables, ts + 1, per_page)
    )
    assert torch.equal(got, whole[ts])


def test_the_chunk_path_is_close_to_the_torch_batch_invariant_path():
    q, q_rot, keys, vals, lat = _sequence(300, 4, 1, seed=1)
    last = torch.arange(300) * 2 + 1  # compressed latents: entry n covers positions 2n, 2n + 1
    got = attention_v4.NativeAttention(WINDOW).chunk(q, q_rot, 0, keys, vals, 0, 0, lat[:150], last[:150])
    want = invariant.attend_chunk(q, q_rot, 0, keys, vals, 0, 0, lat[:150], last[:150], WINDOW)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_kernel_serves_fp32_on_the_cpu_only():
    assert attention_v4.usable(64, torch.float32, None)
    assert attention_v4.usable(64, torch.float32, torch.device("cpu"))
    assert not attention_v4.usable(64, torch.bfloat16, None)
    assert not attention_v4.usable(64, torch.float32, torch.device("cuda:0"))
    assert not attention_v4.usable(96, torch.float32, None)
    assert attention_v4.usable(16, torch.float32, None)  # the tiny Gemma 3 test shape


@pytest.mark.parametrize("hq,hkv", [(4, 1), (9, 3)])
def test_a_full_attention_decode_over_pages_gets_the_bits_of_its_chunk(hq, hkv):
    """Gemma 3's global layers: one-token slices over their pages equal the chunk's rows."""
    total = 300
    _, q, keys, vals, _ = _sequence(total, hq, hkv, seed=2)
    full = attention_v4.NativeAttention(total + 1)  # a window longer than the context
    whole = full.chunk(q, q, 0, keys, vals, 0, 0, None, None)
    pos = torch.arange(total)
    want = attend(q, q, pos, keys, vals, pos, 0, None, None, total + 1)
    assert torch.allclose(whole, want, atol=1e-5, rtol=1e-5)
    ts = torch.tensor([0, 127, 128, 200, 299])
    block = 128
    kv = torch.full((3 * len(ts) + 1, 2, block, hkv, D), float("nan"))  # nothing past a position is read
    tables = torch.zeros(len(ts), 3, dtype=torch.long)
    for b, t in enumerate(ts.tolist()):
        for j in range(t // block + 1):
            page = 1 + 3 * b + j
            tables[b, j] = page
            lo, hi = j * block, min((j + 1) * block, t + 1)
            kv[page, 0, : hi - lo], kv[page, 1, : hi - lo] = keys[lo:hi], vals[lo:hi]
    assert torch.equal(full.pages(q[ts], kv, tables, ts), whole[ts])
