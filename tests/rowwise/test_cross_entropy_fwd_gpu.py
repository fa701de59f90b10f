"""GPU: the streaming cross-entropy forward on the shapes that pick each pass: whole rows (short
and long), one long row split over CTAs and merged, odd (scalar) rows; ignore_index, targets out of
range (NaN), -inf logits, rows whose maximum sits in the tail; bit-for-bit deterministic."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import randn

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n", [(1, 1), (3, 7), (300, 769), (512, 4096), (64, 65536), (2, 1 << 22 | 3),
                                 (1, 1 << 24)])
def test_cross_entropy_forward_streams(dtype, m, n):
    import cute_kernels  # noqa: F401  (registers torch.ops.cute_kernels)

    x = randn(m, n, dtype=dtype) * 4
    t = torch.randint(0, n, (m,), device="cuda")
    if m > 2:
        t[1] = -100  # ignored
        t[2] = n + 5  # out of range: NaN
        x[0, -1] = 30.0  # the row's maximum in the tail / last vector
    loss, lse = torch.ops.cute_kernels.cross_entropy(x, t, -100)
    ref_lse = torch.logsumexp(x.double(), dim=-1)
    assert torch.allclose(lse.double(), ref_lse, rtol=2e-6, atol=2e-6 * n ** 0.5)
    ok = (t >= 0) & (t < n)
    ref = F.cross_entropy(x.double()[ok], t[ok], reduction="none")
    assert torch.allclose(loss[ok].double(), ref, rtol=1e-5, atol=1e-5 * n ** 0.5)
    if m > 2:
        assert loss[1].item() == 0.0 and torch.isnan(loss[2])
    again, _ = torch.ops.cute_kernels.cross_entropy(x, t, -100)
    assert torch.equal(torch.nan_to_num(again, 7.0), torch.nan_to_num(loss, 7.0))  # deterministic


def test_cross_entropy_forward_inf_rows():
    import cute_kernels as ck

    x = randn(4, 5000, dtype=torch.float32)
    x[0] = -float("inf")
    x[0, 1234] = 2.0  # one finite logit
    x[1, ::2] = -float("inf")
    t = torch.tensor([1234, 1, 3, 0], device="cuda")
    loss = ck.cross_entropy(x, t, reduction="none")
    ref = F.cross_entropy(x.double(), t, reduction="none")
    assert loss[0].item() == 0.0
    assert torch.allclose(loss[1:].double(), ref[1:], rtol=1e-5, atol=1e-4)
    assert torch.isfinite(loss[2:]).all()
