"""On a machine with CUDA: the Triton kernels against their torch references on the GPU, then an
engine with ``device = "cuda"``; prints one line per check and exits 1 when a check fails.

    python -m dsi.bench.device_check            (needs torch with CUDA and Triton)

Shapes are the V4 shape's decode step at the ``tiny`` config's sizes (Hq 4, Hkv 1, D 64, window
128, ring 134) and at a wider head (D 128, GQA 2); fp32 and fp16 inputs; 64 rows.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from dsi.kernels import compressor, decode_attention, moe_gate


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3


def _attention(dtype: torch.dtype, hq: int, hkv: int, d: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(0)
    b, window, ring, blocks, per = 64, 128, 134, 256, 64
    r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(dtype)  # noqa: E731
    pos = torch.randint(0, 2000, (b,), device="cuda", generator=g)
    args = dict(
        q=r(b, hq, d), q_rot=r(b, hq, d), ring=r(b, 2, ring, hkv, d),
        slots=torch.arange(b, device="cuda"), pos=pos, swa_start=(pos - 300).clamp(min=0), window=window,
        latents=r(blocks, per, d), tables=torch.randint(1, blocks, (b, 40), device="cuda", generator=g),
        count=(pos + 1) // 2,
    )  # fmt: skip
    out, ms = _timed(lambda: decode_attention.paged_decode_attention(**args))
    ref, ref_ms = _timed(lambda: decode_attention.paged_decode_attention_reference(**args))
    err = float((out - ref).abs().max())
    print(
        f"paged_decode_attention {dtype} Hq{hq}/Hkv{hkv} D{d}: max |diff| {err:.2e}, {ms:.3f} ms (ref {ref_ms:.3f} ms)"
    )
    return err


def _compressor(dtype: torch.dtype) -> float:
    g = torch.Generator(device="cuda").manual_seed(1)
    b, h, d = 64, 256, 64
    r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(dtype)  # noqa: E731
    base = dict(
        x=r(b, h), wc0=r(h, d), wc1=r(h, d), tables=torch.randint(1, 32, (b, 4), device="cuda", generator=g),
        slots=torch.arange(b, device="cuda"), pos=torch.randint(0, 500, (b,), device="cuda", generator=g),
        protect=torch.zeros(b, dtype=torch.long, device="cuda"),
    )  # fmt: skip
    partial, latents = r(b, d).float(), r(32, 64, d).float()
    outs = []
    for fn in (compressor.compress_decode, compressor.compress_decode_reference):
        p, lat = partial.clone(), latents.clone()
        fn(**base, partial=p, latents=lat)
        outs.append((p, lat))
    err = max(float((a - b).abs().max()) for a, b in zip(*outs, strict=True))
    print(f"compress_decode {dtype}: max |diff| {err:.2e}")
    return err


def _gate(dtype: torch.dtype) -> float:
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(512, 256, generator=g, device="cuda").to(dtype)
    router = torch.randn(256, 384, generator=g, device="cuda").to(dtype)
    (w, i), ms = _timed(lambda: moe_gate.moe_gate(x, router, 6))
    (ref_w, ref_i), ref_ms = _timed(lambda: moe_gate.moe_gate_reference(x, router, 6))
    same = float((i == ref_i).float().mean())
    err = float((w - ref_w).abs().max())
    print(
        f"moe_gate {dtype} T512 E384 k6: max |diff| {err:.2e}, same experts {same:.4f}, {ms:.3f} ms (ref {ref_ms:.3f} ms)"
    )
    return err if same == 1.0 else float("inf")


def _engine() -> bool:
    from dsi.engine import Engine, EngineConfig, SamplingParams
    from dsi.model.config import TINY
    from dsi.model.weights import init_weights

    weights, prompt = init_weights(TINY), list(range(100, 140))
    outputs = {}
    for device in ("cpu", "cuda"):
        try:
            engine = Engine(TINY, weights, EngineConfig(num_blocks=16, num_slots=2, device=device))
        except ValueError as exc:
            print(f"engine device={device}: refused: {exc}")
            return False
        engine.add_request("r", prompt, SamplingParams(max_tokens=8, temperature=0.0))
        t0 = time.perf_counter()
        outputs[device] = engine.run_until_done()[-1].output
        engine.close()
        print(f"engine device={device}: {outputs[device]} in {time.perf_counter() - t0:.2f} s")
    return outputs["cpu"] == outputs["cuda"]


def main() -> int:
    try:
        import triton
    except ImportError:
        print("Triton is not installed: the kernels cannot run")
        return 1
    print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.cuda.is_available()}")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    print(f"device: {torch.cuda.get_device_name()}")
    tol = {torch.float32: 1e-4, torch.float16: 2e-2}
    ok = True
    for dtype in (torch.float32, torch.float16):
        ok &= _attention(dtype, 4, 1, 64) <= tol[dtype]
        ok &= _attention(dtype, 4, 2, 128) <= tol[dtype]
        ok &= _compressor(dtype) <= tol[dtype] * 10  # sums of 256 products
        ok &= _gate(dtype) <= tol[dtype]
    engine_ok = _engine()
    print(
        f"kernels: {'pass' if ok else 'FAIL'}; engine on cuda: {'same tokens as cpu' if engine_ok else 'not run / differs'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
