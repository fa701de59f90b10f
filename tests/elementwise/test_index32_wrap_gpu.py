"""Elementwise sizes whose 32-bit index arithmetic wraps below 2^31 elements (the op takes the
64-bit variant for them: `GridStride.index32_ok`): bit-exact against torch, poisoned outputs."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.large]


def _add(x, y):
    from cute_kernels.elementwise.ops import _launch

    out = torch.full_like(x, float("nan"))
    _launch("add", x, y, out, 1.0, 1.0)
    return out


@pytest.mark.parametrize("n, offset", [(2**31 - 1, 0), (2**31 - 8, 0), (2**30 + 512, 1)])
def test_add_near_2_31(n, offset):
    """(2^31 - 1, aligned): the last CTA's tail index wrapped; (2^31 - 8): it wrapped with no tail
    at all; (2^30 + 512, misaligned): the guarded pass after one complete pass wrapped."""
    base = torch.empty(n + offset, dtype=torch.bfloat16, device="cuda").normal_()
    x = base[offset:]
    y = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    ref = x + y
    out = _add(x, y)
    assert torch.equal(out, ref)
    assert torch.equal(x + y, ref)  # the inputs are intact (a wrapped index writes before `out`)
