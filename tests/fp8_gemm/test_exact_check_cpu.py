"""CPU: the exact-arithmetic FP8 check (tests/fp8_gemm/exact.py) accepts the kernel's arithmetic and
rejects each scale-mapping mistake the GPU tests are meant to catch (wrong row of a thread's two
rows, wrong pipeline stage's A scales, neighbouring N-block's B scale on the partial last block,
a lost K tail block)."""

import pytest
import torch

from tests.fp8_gemm import exact as fx

SHAPE = (72, 200, 300)  # M, N (a partial second N-block), K (a partial third K-block)


def _ops():
    return fx.operands(*SHAPE, device="cpu", seed=1)


def test_mirror_passes():
    a, sa, b, sb = _ops()
    ref, mag = fx.reference(a, sa, b, sb)
    fx.check(fx.promoted_reference(a, sa, b, sb), ref, mag, "mirror")


@pytest.mark.parametrize("mistake", [dict(sa_row_shift=8), dict(sa_stage_shift=1), dict(sb_block_shift=-1),
                                     dict(k_blocks=2)])
def test_mistakes_fail(mistake):
    a, sa, b, sb = _ops()
    ref, mag = fx.reference(a, sa, b, sb)
    with pytest.raises(AssertionError, match="elements off"):
        fx.check(fx.promoted_reference(a, sa, b, sb, **mistake), ref, mag, str(mistake))


def test_unwritten_fails():
    a, sa, b, sb = _ops()
    ref, mag = fx.reference(a, sa, b, sb)
    out = fx.promoted_reference(a, sa, b, sb)
    out[3, 199] = float("nan")
    with pytest.raises(AssertionError, match="unwritten"):
        fx.check(out, ref, mag)


def test_operands_exact_in_e4m3():
    a, sa, _, _ = _ops()
    assert a.float().abs().max() <= 3 and torch.equal(a.float(), a.float().round())
    assert torch.equal(torch.log2(sa), torch.log2(sa).round())
