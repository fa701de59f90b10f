"""GPU: gemm_w4a16 against x @ unpack_int4(...)^T in fp32 (bf16-level relative error) for M from 1 to 4096, groups
32 / 64 / 128 / per channel, symmetric and with zero points, bf16 and fp16, K not a multiple of the 128-k chunk,
N off the 16-row tile, every output written (poisoned allocator); the dense GEMV through the same mainloop at 9-16
columns; torch.compile and CUDA-graph capture."""

import pytest
import torch

from cute_kernels.w4a16.pack import pack_int4, unpack_int4
from tests.helpers import poison_empty, randn, rel_err

pytestmark = pytest.mark.gpu


def _case(m, n, k, group, symmetric, dtype=torch.bfloat16):
    w = randn(n, k, dtype=dtype) * 0.02
    p, s, z = pack_int4(w, group, symmetric)
    x = randn(m, k, dtype=dtype)
    return x, p, s, z


@pytest.mark.parametrize("m", [1, 2, 7, 16, 33, 128, 1000, 4096])
def test_m_sweep(m, monkeypatch):
    import cute_kernels as ck

    poison_empty(monkeypatch)
    n, k, g = 2112, 4096 + 32 * 3, 32  # K % 128 = 96: a partial last chunk
    x, p, s, z = _case(m, n, k, g, symmetric=m % 2 == 0)
    y = ck.gemm_w4a16(x, p, s, z, g)
    assert y.shape == (m, n) and torch.isfinite(y).all()
    ref = x.float() @ unpack_int4(p, s, z, g).float().t()
    assert rel_err(y, ref) < 8e-3


@pytest.mark.parametrize("group", [32, 64, 128, -1])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_groups_and_dtypes(group, symmetric, dtype):
    import cute_kernels as ck

    n, k = 1000, 2048
    g = k if group == -1 else group
    x, p, s, z = _case(5, n, k, g, symmetric, dtype)
    y = ck.gemm_w4a16(x, p, s, z, g)
    ref = x.float() @ unpack_int4(p, s, z, g).float().t()
    assert y.dtype == dtype and rel_err(y, ref) < 8e-3
    # the elementwise bound: fp32 accumulation of 16-bit products, one rounding of y; against the rounded weight
    # ((q - z) s in the weight dtype, groups of 32 / 64) or the exact one (the scale on the fp32 group sums: groups of
    # 128 and more)
    exact = x.float() @ _exact_weight(p, s, z, g).t()
    err = torch.minimum((y.float() - ref).abs(), (y.float() - exact).abs())
    scale = x.float().abs() @ unpack_int4(p, s, z, g).float().abs().t()
    assert (err <= 2 ** -7 * ref.abs() + 1e-5 * scale + 1e-6).all()


def _exact_weight(p, s, z, g):
    """(q - z) * s in fp32 (no rounding to the scales' dtype)."""
    from cute_kernels.w4a16.pack import unpack_nibbles

    n, k = p.shape[0], 8 * p.shape[1]
    q = unpack_nibbles(p).float().view(n, k // g, g)
    zz = torch.full((n, k // g), 8.0, device=p.device) if z is None else z.float()
    return ((q - zz[..., None]) * s.float()[..., None]).view(n, k)


def test_batched_x_noncontiguous_and_graph():
    import cute_kernels as ck

    n, k, g = 4096, 4096, 128
    x, p, s, z = _case(8, n, k, g, True)
    x3 = x.view(2, 4, k)
    ref = x.float() @ unpack_int4(p, s, None, g).float().t()
    assert rel_err(ck.gemm_w4a16(x3, p, s, None, g).view(8, n), ref) < 8e-3
    xt = x.t().contiguous().t()  # column-major x: copied to rows
    assert rel_err(ck.gemm_w4a16(xt, p, s, None, g), ref) < 8e-3
    f = torch.compile(lambda a: ck.gemm_w4a16(a, p, s, None, g), fullgraph=True)
    assert rel_err(f(x), ref) < 8e-3
    xs = x.clone()
    ck.gemm_w4a16(xs, p, s, None, g)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ck.gemm_w4a16(xs, p, s, None, g)
    x2 = randn(8, k)
    xs.copy_(x2)
    graph.replay()
    assert rel_err(out, x2.float() @ unpack_int4(p, s, None, g).float().t()) < 8e-3


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 24, 40, 64])
def test_paths_and_splits(m, stream, monkeypatch):
    """Both small-M paths (the streaming kernel; the GEMV mainloop in passes of 16), at split counts 1 to 8 (N from
    28672 to 1000), every output written."""
    import cute_kernels as ck
    from cute_kernels.w4a16 import ops

    poison_empty(monkeypatch)
    monkeypatch.setattr(ops, "STREAM", stream)
    for n, k, g in ((1000, 4096, 128), (4096, 2048 + 64, 64), (28672, 1024, 128)):
        x, p, s, z = _case(m, n, k, g, symmetric=n != 4096)
        y = ck.gemm_w4a16(x, p, s, z, g)
        ref = x.float() @ unpack_int4(p, s, z, g).float().t()
        assert torch.isfinite(y).all() and rel_err(y, ref) < 8e-3, (n, k, g)
        y2 = ck.gemm_w4a16(x, p, s, z, g)
        assert torch.equal(y, y2)  # split K reduces in a fixed order


@pytest.mark.parametrize("cols", [9, 12, 16])
def test_dense_mainloop_at_16_columns(cols):
    """The GEMV mainloop's second A half (columns 8-15) for 16-bit W."""
    from cute_kernels.gemv import GEMV_MMA
    from schedules.gemv import plan_gemv_mma

    n, k = 1000, 1032
    w, x = randn(n, k), randn(cols, k)
    y = torch.full((n, cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    fn = GEMV_MMA.compiled(plan_gemv_mma(n, k, 132), dtype="bf16", cols=cols, index64=False)
    ph = torch.zeros(1, 1, dtype=torch.bfloat16, device="cuda")
    fn(w, x, y, ph, ph)
    assert rel_err(y, w.float() @ x.float().t()) < 8e-3


@pytest.mark.parametrize("group", [32, 128, -1])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_kernel_is_unpack(group, symmetric, dtype, monkeypatch):
    """The prefill path's one-pass dequantization: bit-identical to unpack_int4, every element written."""
    from cute_kernels.w4a16.ops import dequantize

    poison_empty(monkeypatch)
    n, k = 1031, 4096 + 128 * 3
    g = k if group == -1 else group
    _, p, s, z = _case(1, n, k, g, symmetric, dtype)
    assert torch.equal(dequantize(p, s, z, g), unpack_int4(p, s, z, g))


@pytest.mark.parametrize("m", [1, 5, 16, 33, 200])
@pytest.mark.parametrize("n,k", [(28672, 4096), (4096, 14336), (1056, 2048)])  # stream, stream, GEMV mainloop (M<=16)
def test_fused_epilogues(m, n, k, monkeypatch):
    """gemm_w4a16_swiglu over a pack_gate_up weight and gemm_w4a16's residual against the unfused ops on the same
    int4 weight (fp32 reference): the streaming kernel's epilogue (M <= 64 on large weights), the GEMM's (M > 64, after
    the dequantization) and the GEMV mainloop's second pass; every output written."""
    import cute_kernels as ck
    from cute_kernels.gemm.ops import pack_gate_up

    poison_empty(monkeypatch)
    wg, wu = randn(n // 2, k) * 0.02, randn(n // 2, k) * 0.02
    p, s, z = pack_int4(pack_gate_up(wg, wu), 128, True)
    x = randn(m, k)
    wd = unpack_int4(p, s, z, 128).float()
    full = x.float() @ wd.t()
    v = full.view(m, -1, 2, 8)
    ref = torch.nn.functional.silu(v[:, :, 0].reshape(m, -1)) * v[:, :, 1].reshape(m, -1)
    y = ck.gemm_w4a16_swiglu(x, p, s, z, 128)
    assert y.shape == (m, n // 2) and torch.isfinite(y).all()
    assert rel_err(y, ref) < 8e-3
    r = randn(m, n)
    yr = ck.gemm_w4a16(x, p, s, z, 128, residual=r)
    assert torch.isfinite(yr).all() and rel_err(yr, full + r.float()) < 8e-3
