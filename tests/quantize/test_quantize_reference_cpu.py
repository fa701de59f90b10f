"""CPU: the quantizers' torch reference is the rounding the kernels implement (true divisions,
RNE e4m3 with saturation, the power-of-two round-up, the NaN / inf policy), and the scale layouts
are the ones the FP8 GEMM reads."""

import pytest
import torch

from cute_kernels.fp8_gemm.ops import E4M3, tma_aligned_scales
from cute_kernels.quantize.ops import _scale_of, quantize_1x128_reference, quantize_128x128_reference


def _e4m3_values():
    """Every finite e4m3fn value, ascending."""
    v = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    return torch.unique(v[torch.isfinite(v)])


def test_scale_is_a_true_division_and_reciprocal():
    # above the 1e-4 floor (checked below): torch.rand's values under it (about one run in a hundred) are clamped
    amax = torch.rand(100000, generator=torch.Generator().manual_seed(0)) * 1000 + 1e-3
    s = _scale_of(amax, False)
    assert torch.equal(s, (amax.double() / 448).float())  # correctly rounded (53 >= 2 * 24 + 2 bits)
    assert torch.equal(torch.reciprocal(s), (1 / s.double()).float())
    assert torch.equal(_scale_of(torch.zeros(1), False), torch.tensor([1e-4]) / torch.tensor([448.0]))  # floor


def test_ue8m0_rounds_up_to_a_power_of_two():
    amax = torch.cat([torch.rand(10000) * 1000, torch.tensor([448.0, 896.0, 224.0, 0.0])])
    s = _scale_of(amax, True)
    exact = _scale_of(amax, False)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)
    assert (s >= exact).all() and (s < 2 * exact).all()
    assert _scale_of(torch.tensor([448.0, 896.0]), True).tolist() == [1.0, 2.0]  # powers of two stay


def test_rne_with_saturation():
    """Midpoints between neighbouring e4m3 values go to the even one; past 448 saturates."""
    vals = _e4m3_values()
    pos = vals[vals >= 0]
    mids = (pos[:-1] + pos[1:]) / 2
    x = torch.zeros(1, 128 * 4)
    x[0, 0] = 448.0  # scale 1.0
    q_lo = pos[:-1].to(E4M3).view(torch.uint8)
    q_hi = pos[1:].to(E4M3).view(torch.uint8)
    even = torch.where(q_lo % 2 == 0, pos[:-1], pos[1:])
    n = mids.numel()
    assert n <= 127
    x[0, 1:1 + n] = mids
    q, sa = quantize_1x128_reference(x)
    assert sa[0, 0].item() == 1.0
    assert torch.equal(q[0, 1:1 + n].float(), even)
    assert (q_lo != q_hi).all()
    # Saturation: 448 * (1 + 2^-23) / 448 rounds to 448, never to NaN (the fp32 product can exceed 448).
    y = torch.full((1, 128), 448.0)
    y[0, 1] = 447.9999
    q, _ = quantize_1x128_reference(y)
    assert q.float().max().item() == 448.0 and torch.isfinite(q.float()).all()


def test_nan_and_inf_policy():
    x = torch.randn(2, 256)
    x[0, 3] = float("nan")
    x[1, 130] = float("inf")
    q, sa = quantize_1x128_reference(x)
    clean = x.clone()
    clean[0, 3] = 0.0
    q_clean, sa_clean = quantize_1x128_reference(clean)
    assert torch.isnan(q.float()[0, 3]) and sa[0, 0] == sa_clean[0, 0]  # NaN ignored by the amax
    assert torch.equal(q.float()[0, :3], q_clean.float()[0, :3])
    assert sa[1, 1].item() == float("inf")
    qb = q.float()[1, 128:]
    assert torch.isnan(qb[2]) and (qb[torch.arange(128) != 2] == 0).all()
    assert torch.equal(q.float()[1, :128], q_clean.float()[1, :128])


def test_all_zero_block():
    q, sa = quantize_1x128_reference(torch.zeros(3, 200))
    assert (q.float() == 0).all() and torch.equal(sa, torch.full_like(sa, torch.tensor(1e-4).item() / 448))


@pytest.mark.parametrize("m,k", [(1, 16), (5, 300), (129, 128)])
def test_layouts(m, k):
    q, sa = quantize_1x128_reference(torch.randn(m, k))
    kb = -(-k // 128)
    assert sa.shape == (m, kb) and sa.stride() == (1, -(-m // 4) * 4) and tma_aligned_scales(sa) is sa
    w, sb = quantize_128x128_reference(torch.randn(m, k))
    assert sb.shape == (-(-m // 128), kb) and sb.is_contiguous() and w.is_contiguous()


def test_markstein_division_by_448_is_correctly_rounded():
    """The kernels' amax / 448 (collectives.quantize.div_by_max: q0 = a * RN(1/448), r = fma(-q0,
    448, a), q0 + r * RN(1/448)) against the correctly rounded quotient, for every fp32 in [1, 2)
    (the steps scale exactly by powers of two, so one binade covers every amax >= 1e-4). fp64
    emulates the fmas: the remainder is exact, and no fp64 sum lands on an fp32 midpoint."""
    np = pytest.importorskip("numpy")
    a = (np.arange(2**23, dtype=np.uint32) + np.uint32(0x3F800000)).view(np.float32)
    c = np.float32(1) / np.float32(448)
    q0 = a * c
    rem64 = a.astype(np.float64) - q0.astype(np.float64) * 448.0
    rem = rem64.astype(np.float32)
    assert np.array_equal(rem.astype(np.float64), rem64)
    t = q0.astype(np.float64) + rem.astype(np.float64) * np.float64(c)
    assert not ((t.view(np.uint64) & np.uint64((1 << 29) - 1)) == (1 << 28)).any()
    exact = (a.astype(np.float64) / 448.0).astype(np.float32)
    assert np.array_equal(t.astype(np.float32), exact)
    assert not np.array_equal(q0, exact)  # the plain multiply (torch's CUDA tensor / scalar) is not


def test_norm_fp8_fake_mode_shapes_and_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cute_kernels as ck

    with FakeTensorMode():
        x = torch.empty(3, 70, 300, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(300, dtype=torch.bfloat16, device="cuda")
        q, s, _ = torch.ops.cute_kernels.rms_norm_fp8(x, w, None, 1e-6, "block128")
        assert q.shape == x.shape and q.dtype == E4M3 and s.shape == (210, 3) and s.stride() == (1, 212)
        q, s, r = torch.ops.cute_kernels.layer_norm_fp8(x, w, w, x, 1e-5, "per_token")
        assert s.shape == (210, 1) and s.dtype == torch.float32 and r.shape == x.shape and r.dtype == x.dtype
        with pytest.raises(ValueError, match="fp8_out must be"):
            torch.ops.cute_kernels.rms_norm_fp8(x, w, None, 1e-6, "block64")
    with pytest.raises(ValueError, match="fp8_out must be"):
        ck.rms_norm(torch.randn(4, 16), fp8_out="e5m2")
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.layer_norm(torch.randn(4, 16), fp8_out="per_token")
