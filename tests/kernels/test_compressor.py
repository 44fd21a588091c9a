"""The Triton decode compressor against its torch reference (Triton's interpreter, CPU)."""

import pytest
import torch

from dsi.model.ops import compress_pairs
from tests.kernels.interpreted import interpreted

cp = interpreted("compressor")


def case(dtype=torch.float32, h=40, d=24, seed=0):
    """Rows: even position (opens), odd (closes), odd below its protect (loaded pair), odd."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return dict(
        x=r(4, h),
        wc0=r(h, d),
        wc1=r(h, d),
        partial=r(5, 3, d)[:, 1],  # one source of [slots, sources, D]
        latents=r(6, 4, 2, d)[:, :, 0],  # a strided page view [6, 4, D]
        tables=torch.tensor([[1, 2], [3, 4], [5, 1], [2, 3]]),
        slots=torch.tensor([4, 0, 2, 1]),
        pos=torch.tensor([4, 9, 11, 13]),
        protect=torch.tensor([0, 0, 12, 0]),
    )


def run(fn, args):
    args = {k: (v.clone() if k in ("partial", "latents") else v) for k, v in args.items()}
    fn(**args)
    return args["partial"], args["latents"]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2)])
def test_kernel_matches_reference(dtype, tol):
    args = case(dtype)
    partial, latents = run(cp.compress_decode, args)
    ref_partial, ref_latents = run(cp.compress_decode_reference, args)
    torch.testing.assert_close(partial, ref_partial, rtol=tol, atol=tol)
    torch.testing.assert_close(latents, ref_latents, rtol=tol, atol=tol)
    assert not torch.equal(latents, args["latents"])  # something was written


def test_what_each_row_writes():
    args = case()
    partial, latents = run(cp.compress_decode, args)
    x, wc0, wc1 = args["x"], args["wc0"], args["wc1"]
    torch.testing.assert_close(partial[4], x[0] @ wc0)  # even: opens its pair
    # odd 9 closes pair 4 (page tables[1][4 // 4] = 4, entry 0) from the partial state it had
    torch.testing.assert_close(latents[4, 0], args["partial"][0] + x[1] @ wc1)
    assert torch.equal(latents[1, 1], args["latents"][1, 1])  # 11 < protect 12: pair 5 kept
    assert torch.equal(partial[[0, 1, 2]], args["partial"][[0, 1, 2]])  # odd rows leave partial state


def test_two_decode_steps_give_the_pairs_latent():
    """Position 2j then 2j + 1 as decode tokens: the latent of compress_pairs."""
    args = case()
    x_even, x_odd = args["x"][:1], args["x"][1:2]
    one = {**args, "tables": torch.tensor([[1, 2]]), "slots": torch.tensor([3]), "protect": torch.tensor([0])}
    partial, latents = args["partial"].clone(), args["latents"].clone()
    cp.compress_decode(
        **{**one, "x": x_even, "pos": torch.tensor([6]), "partial": partial, "latents": latents}
    )
    cp.compress_decode(
        **{**one, "x": x_odd, "pos": torch.tensor([7]), "partial": partial, "latents": latents}
    )
    want = compress_pairs(x_even, x_odd, args["wc0"], args["wc1"])[0]
    torch.testing.assert_close(latents[1, 3], want, rtol=1e-5, atol=1e-5)


def test_wrapper_checks_shapes():
    args = case()
    with pytest.raises(ValueError, match="wc0"):
        cp.compress_decode(**{**args, "wc1": args["wc1"][:, :5]})
