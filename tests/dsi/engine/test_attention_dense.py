"""PagedRows: a step's rows shared among the kernel threads give the bits of one thread."""

import pytest
import torch

from dsi.engine.attention_dense import PagedRows, StepRows
from dsi.kernels import paged_attention as native


def test_attention_rows_shared_among_threads_have_the_bits_of_one_thread(threads):
    if not native.supports(3, 64):
        pytest.skip("no C attention kernel here")
    gen = torch.Generator().manual_seed(5)
    kv = torch.randn(12, 2, 128, 3, 64, generator=gen)
    rows = 40
    q = torch.randn(rows, 9, 64, generator=gen)
    k, v = torch.randn(rows, 192, generator=gen), torch.randn(rows, 192, generator=gen)
    plan = StepRows(
        pos=torch.tensor([(37 * r) % 380 for r in range(rows)]),
        seq=torch.tensor([r % 3 for r in range(rows)]),
        tables=torch.tensor([[3, 7, 1], [5, 2, 9], [11, 4, 6]]),
        page=torch.full((rows,), -1),
        off=torch.zeros(rows, dtype=torch.long),
    )
    attend = PagedRows()
    threads(1)
    want = attend(kv, q, k, v, plan)
    threads(2)
    assert torch.equal(attend(kv, q, k, v, plan), want)
    assert torch.allclose(
        want, native.paged_attention_reference(q, kv, plan.tables, plan.seq, plan.pos), atol=1e-5
    )
