"""Batch invariance: a request's logits are the same bits alone, in any batch, under any chunking,
after a preemption, and on the decode path as on the prefill path."""

import pytest
import torch

from dsi.engine import attention_v4, invariant
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.ops import attend
from tests.dsi.engine.conftest import ROW_COUNTS, random_prompts, rows_with


@pytest.mark.parametrize("k,n", [(256, 256), (256, 8), (128, 256), (64, 128), (576, 1536), (256, 129_280)])
def test_mm_rows_do_not_depend_on_the_row_count_position_or_thread_count(k, n, threads):
    """Row counts 1 .. 2,048 (a full prefill block); the 129,280-column output projection up to
    257 rows, each at one and two threads against one reference."""
    torch.manual_seed(0)
    w = torch.randn(n, k).T if n > 10_000 else torch.randn(k, n)  # the LM head is a transposed view
    x = torch.randn(k)
    threads(1)
    want = invariant.mm(x[None], w)[0]
    counts = [m for m in ROW_COUNTS if m <= 257] if n > 10_000 else ROW_COUNTS
    for t in (1, 2):
        threads(t)
        for m in counts:
            rows, at = rows_with(x, m, seed=m)
            assert torch.equal(invariant.mm(rows, w)[at], want), (t, m)
    assert torch.allclose(want, x @ w, atol=1e-4, rtol=1e-4)


def test_bmm_matrices_do_not_depend_on_the_batch_size(threads):
    torch.manual_seed(0)
    a, b = torch.randn(4, 64), torch.randn(64, 128)  # heads per KV head x D, D x key block
    threads(1)
    tile = invariant.attention_tile(4)
    want = invariant.bmm(a[None], b[None], tile)[0]
    for t in (1, 2):
        threads(t)
        for batch in (1, 2, 3, 7, 16, 64, 129):
            aa, bb = torch.randn(batch, 4, 64), torch.randn(batch, 64, 128)
            at = batch // 2
            aa[at], bb[at] = a, b
            assert torch.equal(invariant.bmm(aa, bb, tile)[at], want), (t, batch)


def _latent_blocks(latents: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, D] entries (any values where not ``valid`` [B, N]) -> ([B, N', D], [B, N']): N
    rounded up to whole key blocks, zeros where not valid, as ``attend_decode`` takes them."""
    b, n, d = latents.shape
    width = -(-n // invariant.KEY_BLOCK) * invariant.KEY_BLOCK
    out = latents.new_zeros(b, width, d)
    out[:, :n] = latents
    ok = torch.nn.functional.pad(valid, (0, width - n))
    out.view(-1, d).index_fill_(0, (~ok).view(-1).nonzero()[:, 0], 0.0)
    return out, ok


def _sequence(t_total: int, d: int = 64, hq: int = 4, hkv: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t_total, hq, d, generator=g)
    q_rot = torch.randn(t_total, hq, d, generator=g)
    keys = torch.randn(t_total, hkv, d, generator=g)
    vals = torch.randn(t_total, hkv, d, generator=g)
    latents = torch.randn(t_total, d, generator=g)  # ratio 1: entry n covers position n
    return q, q_rot, keys, vals, latents


def test_attend_chunk_matches_the_reference_attention():
    q, q_rot, keys, vals, lat = _sequence(300)
    pos = torch.arange(300)
    got = invariant.attend_chunk(q, q_rot, 0, keys, vals, 0, 5, lat, pos, 128)
    want = attend(q, q_rot, pos, keys, vals, pos, 5, lat, pos, 128)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


# (query heads, KV heads): the tiny shape (4 heads fill one attention product), heads padded to a
# product (3 per KV head), and heads that take two products each (20 per KV head, 40 in all).
HEADS = [(4, 1), (6, 2), (40, 2)]


@pytest.mark.parametrize("hq,hkv", HEADS)
def test_a_query_gets_the_same_bits_in_any_chunk_and_on_the_decode_path(hq, hkv):
    total, window, swa_start = 420, 128, 3
    q, q_rot, keys, vals, lat = _sequence(total, hq=hq, hkv=hkv)
    pos = torch.arange(total)

    def chunk(s: int, e: int) -> torch.Tensor:
        lo = max(swa_start, s - window + 1)
        return invariant.attend_chunk(
            q[s:e], q_rot[s:e], s, keys[lo:e], vals[lo:e], lo, swa_start, lat[:e], pos[:e], window
        )

    whole = chunk(0, total)
    for s, e in [(0, 7), (100, 300), (255, 256), (256, 420), (399, 420)]:
        assert torch.equal(chunk(s, e), whole[s:e]), (s, e)
    # The same queries as one-token decode slices of a batch: keys [t - 127, t] in rings of 134
    # (one layer's view of all layers' rings); the other entries hold stale values, a NaN among them.
    cfg = type("Cfg", (), {"window": window, "ring": window + 6})()
    ts = torch.tensor([130, 255, 256, 300, 419])
    rings = torch.randn(len(ts), 3, 2, cfg.ring, hkv, 64)
    ring = rings[:, 1]
    for b, t in enumerate(ts.tolist()):
        for p in range(max(0, t - window + 1), t + 1):
            ring[b, 0, p % cfg.ring], ring[b, 1, p % cfg.ring] = keys[p], vals[p]
        ring[b, :, (t + 1) % cfg.ring] = float("nan")  # a position ahead, in the query's last block
    n = int(ts.max()) + 1
    batch_lat = torch.stack([torch.cat([lat[: t + 1], torch.randn(n - t - 1, 64)]) for t in ts.tolist()])
    batch_lat, valid = _latent_blocks(batch_lat, torch.arange(n)[None, :] <= ts[:, None])
    last = torch.arange(batch_lat.shape[1])[None, :].expand(len(ts), -1)
    got = invariant.attend_decode(
        cfg,
        q[ts],
        q_rot[ts],
        ring,
        torch.arange(len(ts)),
        ts,
        torch.full((len(ts),), swa_start),
        batch_lat,
        valid,
        last,
    )
    assert torch.equal(got, whole[ts])


@pytest.mark.parametrize("hq,hkv", [(9, 3), *HEADS])
def test_a_full_attention_decode_over_pages_gets_the_bits_of_its_chunk(hq, hkv):
    """Llama decode slices (one batched attention over the pages) equal the per-slice path."""
    total, d = 300, 64
    _, q_rot, keys, vals, _ = _sequence(total, d=d, hq=hq, hkv=hkv, seed=2)
    window = total + 1  # longer than the context: full attention
    whole = invariant.attend_chunk(q_rot, q_rot, 0, keys, vals, 0, 0, None, None, window)
    ts = torch.tensor([0, 127, 128, 200, 299])
    kv = torch.randn(3 * len(ts) + 1, 2, invariant.KEY_BLOCK, hkv, d)  # stale data past each position
    tables = torch.zeros(len(ts), 3, dtype=torch.long)
    for b, t in enumerate(ts.tolist()):
        for j in range(t // invariant.KEY_BLOCK + 1):
            page = 1 + 3 * b + j
            tables[b, j] = page
            lo, hi = j * invariant.KEY_BLOCK, min((j + 1) * invariant.KEY_BLOCK, t + 1)
            kv[page, 0, : hi - lo], kv[page, 1, : hi - lo] = keys[lo:hi], vals[lo:hi]
    got = invariant.attend_pages(q_rot[ts], kv, tables, ts)
    assert torch.equal(got, whole[ts])


def _run(tiny, prompts, config: EngineConfig, max_tokens: int = 6):
    cfg, w = tiny
    engine = Engine(cfg, w, config)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    done = {o.request_id: (o.output, o.logprobs) for o in engine.run_until_done() if o.finished}
    preemptions = engine.scheduler.preemptions
    engine.close()
    return [done[str(i)] for i in range(len(prompts))], preemptions


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("attention", ["kernel", "torch"])
def test_alone_together_chunked_and_preempted_give_the_same_bits(
    tiny, async_scheduling, attention, monkeypatch
):
    """With the C attention kernel where it is built, and with the torch paths it falls back to."""
    if attention == "torch":
        monkeypatch.setenv("DSI_NATIVE_KERNELS", "0")
    elif not attention_v4.usable(tiny[0].head_dim, torch.float32, None):
        pytest.skip("the C attention kernel is not built here")
    assert attention_v4.usable(tiny[0].head_dim, torch.float32, None) == (attention == "kernel")
    prompts = random_prompts([10, 130, 257, 700, 33, 1], seed=3)
    base = EngineConfig(async_scheduling=async_scheduling)
    alone = [_run(tiny, [p], base)[0][0] for p in prompts]
    together, _ = _run(tiny, prompts, base)
    assert together == alone  # tokens and every logprob, bit for bit
    chunked, _ = _run(tiny, prompts, EngineConfig(async_scheduling=async_scheduling, max_batch_tokens=97))
    assert chunked == alone
    crossing = random_prompts([120, 121, 122, 123], seed=4)  # each needs a second page while decoding
    squeezed, preemptions = _run(
        tiny, crossing, EngineConfig(async_scheduling=async_scheduling, num_blocks=6), max_tokens=24
    )
    assert preemptions > 0
    assert squeezed == [_run(tiny, [p], base, max_tokens=24)[0][0] for p in crossing]


def test_exp_gives_each_element_the_same_bits_whatever_the_length():
    torch.manual_seed(0)
    x = torch.randn(4096) * 30
    want = invariant.exp(x)
    for n in [1, 3, 4, 17, 31, 33, 100, 1000]:
        assert torch.equal(invariant.exp(x[:n]), want[:n]), n
    assert torch.equal(invariant.exp(x.view(64, 64)), want.view(64, 64))


def test_latent_blocks_gathered_from_pages_hold_each_entry_and_zeros_elsewhere():
    """The decode path's latents: one row gather out of a strided page view (one part of every
    page), padded to whole key blocks; entries past a sequence's count are zeros even where the
    page holds NaN."""
    pages = torch.randn(9, 3 * 64 * 16)  # 9 pages, parts of 64 entries x D = 16
    pages[:, 64 * 16 :] = float("nan")  # the parts after the one read
    pages[4, 40 * 16 : 64 * 16] = float("nan")  # unwritten entries of the last page of sequence 0
    view = pages[:, 64 * 16 : 2 * 64 * 16].unflatten(1, (64, 16))
    view.copy_(torch.randn(9, 64, 16))
    view[4, 40:] = float("nan")
    tables = torch.tensor([[2, 4, 0], [7, 1, 5]])
    count = torch.tensor([104, 150])
    got, valid = invariant.gather_latent_blocks(view, tables, count, 64)
    assert got.shape == (2, 256, 16) and valid.shape == (2, 256)
    for b in range(2):
        n = int(count[b])
        want = torch.cat([view[p] for p in tables[b].tolist()])[:n]
        assert torch.equal(got[b, :n], want)
        assert torch.equal(got[b, n:], torch.zeros(256 - n, 16))
        assert valid[b].tolist() == [i < n for i in range(256)]
