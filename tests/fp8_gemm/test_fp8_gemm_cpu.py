"""CPU: FP8 GEMM schedules, scale layouts, the quantizers' reference math, and the torch ops in
fake mode (shapes, layouts, named errors)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels.fp8_gemm.ops import E4M3, tma_aligned_scales
from cute_kernels.quantize.ops import (
    dequantize_1x128,
    dequantize_128x128,
    quantize_1x128_reference,
    quantize_128x128_reference,
)
from schedules.fp8_gemm import default_fp8_schedule, fp8_schedule, fp8_stages, halves_only_error, promoted_error
from schedules.gemm import SMEM_BYTES, GemmSchedule

ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def test_schedules_fit_and_are_promotable():
    for m in (1, 64, 128, 4096):
        for n, k in ISSUE_NK:
            s = default_fp8_schedule(m, n, k)
            assert s.tile_k == 128 and promoted_error(s) is None
            assert s.stages >= 3
            smem = s.stages * (s.stage_bytes(1) + 4 * s.tile_m) + s.epi_bytes(2) + 1024
            assert smem <= SMEM_BYTES
    assert default_fp8_schedule(4096, 7168, 7168).tile_m == 128
    assert default_fp8_schedule(64, 7168, 7168).tile_m == 64


def test_small_grids_narrow_the_tile():
    """A 64x64 ping-pong tile on less than a wave narrows while the narrower grid still fits one wave
    (the measured small-M wins); grids that 64x64 / 64x128 fill keep their tile; grouped never narrows."""
    from schedules.fp8_gemm import default_grouped_schedule

    assert default_fp8_schedule(64, 2112, 7168).tile_n == 16  # 33 -> 132 tiles
    assert default_fp8_schedule(64, 4096, 7168).tile_n == 32  # 64 -> 128 (16 would be 256)
    s = default_fp8_schedule(128, 2112, 7168)
    assert (s.tile_n, s.cluster_m) == (32, 2)  # 2 x 66 tiles, the 2x1 cluster kept
    assert default_fp8_schedule(128, 4096, 7168).tile_n == 64  # 128 tiles already
    assert default_fp8_schedule(64, 7168, 16384).tile_n == 64  # 112 tiles: 224 at 64x32 is two waves
    assert default_fp8_schedule(64, 24576, 1536).tile_n == 128
    assert default_fp8_schedule(64, 2112, 7168, narrow=False).tile_n == 64
    assert default_grouped_schedule("masked", 64, 2112, 7168, groups=1).tile_n >= 64


def test_schedule_errors_name_the_problem():
    assert "accumulators per thread" in promoted_error(GemmSchedule(kind="pingpong", tile_m=128, tile_n=128,
                                                                    tile_k=128))
    with pytest.raises(ValueError, match="cooperative 128-row tile"):
        fp8_schedule("pingpong", 64, 256)
    wide = fp8_schedule("cooperative", 128, 256)  # a schedule; its mainloop must promote in (sequential) halves
    assert "needs promote_halves" in halves_only_error(wide, False) and halves_only_error(wide, True) is None
    with pytest.raises(ValueError, match="divide 128"):
        fp8_schedule("cooperative", 128, 176)  # would span three scale blocks (192 / 160: wide tiles)
    assert "tile_k" in promoted_error(GemmSchedule(tile_k=64, tile_n=128))
    s = fp8_schedule()
    assert s.stages == fp8_stages(s) and str(s).startswith("cooperative_128x128x128")


def test_tma_aligned_scales():
    sa = torch.randn(6, 3)  # row-major: not MN-major, copied
    t = tma_aligned_scales(sa)
    assert t.shape == (6, 3) and t.stride() == (1, 8) and torch.equal(t, sa)
    assert tma_aligned_scales(t) is t
    q, sa2 = quantize_1x128_reference(torch.randn(5, 300))
    assert sa2.stride() == (1, 8) and tma_aligned_scales(sa2) is sa2  # the quantizer's layout is the kernel's


@pytest.mark.parametrize("m,k", [(5, 300), (128, 256), (1, 16), (3, 129)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantize_1x128_reference(m, k, ue8m0):
    x = torch.randn(m, k) * torch.logspace(-3, 3, k)
    q, sa = quantize_1x128_reference(x, ue8m0)
    kb = -(-k // 128)
    assert q.dtype == E4M3 and q.shape == (m, k) and sa.shape == (m, kb) and sa.stride(0) == 1
    assert torch.isfinite(q.float()).all()
    # The largest |x| of each block lands on 448 (fp32 scale) or within a factor 2 below (ue8m0).
    qb = torch.nn.functional.pad(q.float().abs(), (0, kb * 128 - k)).view(m, kb, 128).amax(2)
    if ue8m0:
        assert torch.equal(torch.exp2(torch.log2(sa).round()), sa)
        assert ((qb > 224 - 1e-3) & (qb <= 448)).all()
    else:
        assert torch.allclose(qb, torch.full_like(qb, 448.0))
    err = (dequantize_1x128(q, sa) - x).norm() / x.norm()
    assert err <= 2**-4 + 1e-3  # e4m3: each normal value within 2^-4 of itself


@pytest.mark.parametrize("n,k", [(200, 300), (256, 128), (1, 16)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantize_128x128_reference(n, k, ue8m0):
    w = torch.randn(n, k)
    q, sb = quantize_128x128_reference(w, ue8m0)
    assert q.shape == (n, k) and sb.shape == (-(-n // 128), -(-k // 128)) and sb.is_contiguous()
    # e4m3 keeps 3 mantissa bits: each normal value is off by at most 2^-4 of itself (subnormals by a
    # tiny absolute amount), so the norm-wise bound is 2^-4 whatever the draw; 0.04 (the typical
    # error of a large block) failed on a few blocks of 16 values
    assert (dequantize_128x128(q, sb) - w).norm() / w.norm() <= 2**-4 + 1e-3


def test_quantize_rounding_is_round_to_nearest_even():
    """q = e4m3(x * (1 / scale)): fp32 multiply, then torch's RNE cast (the documented rounding)."""
    x = torch.tensor([[448.0, 1.0, 1.0625, 1.1875, -3.0] + [0.0] * 123])
    q, sa = quantize_1x128_reference(x)
    assert sa.item() == 1.0
    assert q.float()[0, :5].tolist() == [448.0, 1.0, 1.0, 1.25, -3.0]


def test_fake_mode_shapes_and_errors():
    with FakeTensorMode():
        a = torch.empty(100, 300, dtype=E4M3, device="cuda")
        b = torch.empty(2112, 300, dtype=E4M3, device="cuda")
        sa = torch.empty(100, 3, device="cuda")
        sb = torch.empty(17, 3, device="cuda")
        out = torch.ops.cute_kernels.fp8_gemm(a, sa, b, sb)
        assert out.shape == (100, 2112) and out.dtype == torch.bfloat16
        assert torch.ops.cute_kernels.fp8_gemm(a, sa, b, sb, torch.float16).dtype == torch.float16
        with pytest.raises(ValueError, match=r"sa must have shape \(100, 3\)"):
            torch.ops.cute_kernels.fp8_gemm(a, torch.empty(100, 2, device="cuda"), b, sb)
        with pytest.raises(ValueError, match=r"sb must have shape \(17, 3\)"):
            torch.ops.cute_kernels.fp8_gemm(a, sa, b, torch.empty(16, 3, device="cuda"))
        with pytest.raises(TypeError, match="sa has dtype"):
            torch.ops.cute_kernels.fp8_gemm(a, torch.empty(100, 3, dtype=torch.float16, device="cuda"), b, sb)
        with pytest.raises(TypeError, match="a has dtype"):
            torch.ops.cute_kernels.fp8_gemm(torch.empty(100, 300, dtype=torch.bfloat16, device="cuda"), sa, b, sb)
        with pytest.raises(ValueError, match="K differs"):
            torch.ops.cute_kernels.fp8_gemm(a, sa, torch.empty(2112, 200, dtype=E4M3, device="cuda"), sb)
        with pytest.raises(TypeError, match="out_dtype"):
            torch.ops.cute_kernels.fp8_gemm(a, sa, b, sb, torch.float32)
        x = torch.empty(70, 300, dtype=torch.bfloat16, device="cuda")
        q, s = torch.ops.cute_kernels.quantize_1x128(x)
        assert q.shape == (70, 300) and q.dtype == E4M3 and s.shape == (70, 3) and s.stride() == (1, 72)
        q, s = torch.ops.cute_kernels.quantize_128x128(x, True)
        assert s.shape == (1, 3) and s.dtype == torch.float32
        with pytest.raises(ValueError, match="2-D"):
            torch.ops.cute_kernels.quantize_1x128(torch.empty(300, device="cuda"))


def test_cpu_tensors_get_named_device_errors():
    with pytest.raises(ValueError, match="a must be on a CUDA device"):
        ck.fp8_gemm(torch.zeros(4, 16, dtype=E4M3), torch.ones(4, 1), torch.zeros(4, 16, dtype=E4M3),
                    torch.ones(1, 1))
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.quantize_1x128(torch.randn(4, 16))


@pytest.mark.parametrize("m", [1, 64, 128, 769, 4096])
@pytest.mark.parametrize("n,k", [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                                 (7168, 2048), (200, 300), (64, 16)])
def test_default_schedules_are_valid_catalogue_params(m, n, k):
    """What the ops launch must pass the catalogue's parameter check (the first H200 run failed every
    large shape: the schedule chose 7-8 stages, the catalogue allowed at most 6)."""
    from cute_kernels.fp8_gemm import FP8_GEMM, grouped_params, params_for
    from schedules.fp8_gemm import default_grouped_schedule

    for p in (params_for(default_fp8_schedule(m, n, k)),
              grouped_params("contiguous", default_grouped_schedule("contiguous", m, n, k)),
              grouped_params("masked", default_grouped_schedule("masked", m, n, k, 4))):
        FP8_GEMM.check(FP8_GEMM.resolve(p))
