"""CPU: the QAT rules (`cute_kernels.qat.reference`, what the kernels compute bit for bit) against torch's own CPU ops:
per-tensor and per-channel fake-quant (outputs and STE masks bit-identical, every float dtype, int8 / uint8 / int4
grids, symmetric and asymmetric), per-group as per-channel over the (N / G, G) view, the learnable forward and
backward (dx identical; the per-element scale / zero-point terms summed in fp64 agree with torch's sums to fp32
summation error), the fused observer (running range and qparams identical), e4m3 against an fp64 search of the
e4m3 grid, and the packed mask."""

import math

import pytest
import torch

from cute_kernels.qat import reference as R

A = torch.ops.aten
GRIDS = [(-128, 127, 0), (0, 255, 113), (-8, 7, -3), (0, 15, 6)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(_bits(a), _bits(b)), f"{int((_bits(a) != _bits(b)).sum())} of {a.numel()} differ"


def _x(shape, dtype, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * spread).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grid", GRIDS)
def test_per_tensor_matches_torch(dtype, grid):
    qmin, qmax, zp = grid
    x = _x((257, 129), dtype)
    s = 0.0371
    y, m = A.fake_quantize_per_tensor_affine_cachemask(x, s, zp, qmin, qmax)
    ry, rm = R.fake_quant(x, torch.tensor(s, dtype=torch.float32), torch.tensor(zp), qmin, qmax)
    _same(y, ry)
    assert torch.equal(m, rm) and 0 < int(m.sum()) < m.numel()  # both sides of the range are exercised
    y2, m2 = torch._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
        x, torch.tensor([s]), torch.tensor([zp], dtype=torch.int32), torch.tensor([1]), qmin, qmax
    )
    _same(y2, ry)
    assert torch.equal(m2, rm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("shape,axis", [((257, 129), 0), ((257, 129), 1), ((6, 33, 10), 1), ((6, 33, 10), -1)])
def test_per_channel_matches_torch(dtype, grid, shape, axis):
    qmin, qmax, _ = grid
    x = _x(shape, dtype, seed=1)
    c = shape[axis]
    g = torch.Generator().manual_seed(2)
    sc = torch.rand(c, generator=g) * 0.1 + 0.01
    zp = torch.randint(qmin, qmax + 1, (c,), generator=g, dtype=torch.int32)
    y, m = A.fake_quantize_per_channel_affine_cachemask(x, sc, zp, axis % x.dim(), qmin, qmax)
    ry, rm = R.fake_quant(x, sc, zp, qmin, qmax, axis=axis)
    _same(y, ry)
    assert torch.equal(m, rm)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_channel_float_zero_point(dtype):
    """Float zero points: the STE mask is identical (rint(x * inv + zp)); torch's CPU kernel computes
    (q - zp) * scale in fp64 and rounds once where its CUDA kernel (the rule here) rounds q - zp to fp32 first, so
    fp32 outputs may differ by an ulp; 16-bit outputs (rounded further) agree."""
    x = _x((257, 129), dtype, seed=3)
    g = torch.Generator().manual_seed(4)
    sc = torch.rand(129, generator=g) * 0.1 + 0.01
    zp = torch.randint(0, 256, (129,), generator=g).float() + torch.rand(129, generator=g) - 0.5
    y, m = A.fake_quantize_per_channel_affine_cachemask(x, sc, zp, 1, 0, 255)
    ry, rm = R.fake_quant(x, sc, zp, 0, 255, axis=1, zp_rule="float")
    assert torch.equal(m, rm)
    ulp = torch.finfo(dtype).eps * y.float().abs().clamp_min(torch.finfo(dtype).tiny)
    assert ((y.float() - ry.float()).abs() <= ulp).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 128])
def test_per_group_is_per_channel_of_the_group_view(dtype, group_size):
    """Per-group (no torch op) is per-channel over the (N / G, G) view of x, so torch's per-channel op is its
    bit-exact reference."""
    x = _x((64, 512), dtype, seed=5)
    k = x.numel() // group_size
    g = torch.Generator().manual_seed(6)
    sc = torch.rand(64, 512 // group_size, generator=g) * 0.05 + 0.01
    zp = torch.randint(-8, 8, (64, 512 // group_size), generator=g, dtype=torch.int32)
    y, m = A.fake_quantize_per_channel_affine_cachemask(
        x.reshape(k, group_size), sc.reshape(-1), zp.reshape(-1), 0, -8, 7
    )
    ry, rm = R.fake_quant(x, sc, zp, -8, 7, group_size=group_size)
    _same(y.reshape(x.shape), ry)
    assert torch.equal(m.reshape(x.shape), rm)


def _e4m3_grid():
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return vals[torch.isfinite(vals)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_e4m3_against_an_fp64_search(dtype):
    """e4m3 emulation: q is the e4m3 value nearest to v = RN32(x * RN32(1 / s)) (ties: even mantissa), saturated to
    +-448, found by an fp64 search of the whole grid; y = RN(q * s); the mask is |v| <= 448."""
    x = _x((64, 97), dtype, seed=7, spread=40.0)
    s = torch.tensor(0.0625 * 1.37)
    y, m = R.fake_quant(x, s, None, -448, 448, qtype="e4m3")
    v = (x.float() * (1.0 / s)).double().reshape(-1)
    grid = _e4m3_grid()
    d = (v[:, None] - grid[None, :]).abs()
    best = d.min(1, keepdim=True).values
    cand = d == best
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    even = torch.tensor([(i & 1) == 0 for i in range(256)])[torch.isfinite(codes)]
    pick = torch.where((cand & even).any(1, keepdim=True), cand & even, cand).float().argmax(1)
    q = grid[pick].clamp(-448, 448)
    ref = (q * s.double()).float().to(dtype).reshape(x.shape)
    _same(y, ref)
    assert torch.equal(m, (v.abs() <= 448).reshape(x.shape))
    assert m.all() or not m.all()  # (shape check above); saturation is exercised below
    big = torch.tensor([1e6, -1e6, 447.9, 460.0], dtype=torch.float32)
    yb, mb = R.fake_quant(big, torch.tensor(1.0), None, -448, 448, qtype="e4m3")
    assert yb.tolist() == [448.0, -448.0, 448.0, 448.0] and mb.tolist() == [False, False, True, False]


@pytest.mark.parametrize("grid", [(-128, 127), (0, 255), (-8, 7)])
@pytest.mark.parametrize("zp", [0.0, 3.4, -1.7, 2.5, -0.3])
@pytest.mark.parametrize("grad_factor", [1.0, 0.37])
def test_learnable_per_tensor_matches_torch(grid, zp, grad_factor):
    """The per-tensor learnable backward: dx identical to torch's (its CPU kernel rounds rint(zp + x inv), the CUDA
    kernel rint(x inv) + zp: the same here, checked both ways); the sums of the per-element terms (fp64) agree with
    torch's fp32 sums to summation error; the forward's zero point is clamp(rint(zp)), the backward's
    trunc(clamp(zp + 0.5))."""
    qmin, qmax = grid
    x, dy = _x((257, 129), torch.float32, seed=8), _x((257, 129), torch.float32, seed=9, spread=1.0)
    s = torch.tensor([0.0371])
    z = torch.tensor([float(min(max(zp, qmin), qmax))])
    dx, ds, dz = A._fake_quantize_learnable_per_tensor_affine_backward(dy, x, s, z, qmin, qmax, grad_factor)
    for cpu_rule in (True, False):
        rdx, rds, rdz = R.learnable_grads(dy, x, s, z, qmin, qmax, grad_factor=grad_factor, cpu_rule=cpu_rule)
        assert torch.equal(dx, rdx)
        lay = R.layout_of(x.shape)
        for got, terms in ((ds, rds), (dz, rdz)):
            bound = 4 * x.numel() * 2**-24 * terms.double().abs().sum().item() + 1e-30
            assert abs(got.item() - R.per_scale_sum(terms, lay).item()) <= bound
    y = torch._fake_quantize_learnable_per_tensor_affine(x, s, z, qmin, qmax, grad_factor)
    _same(y, R.fake_quant(x, s, z, qmin, qmax, zp_rule="round")[0])


@pytest.mark.parametrize("grid", [(-128, 127), (0, 255)])
@pytest.mark.parametrize("axis", [0, 1])
def test_learnable_per_channel_matches_torch(grid, axis):
    qmin, qmax = grid
    x, dy = _x((257, 129), torch.float32, seed=10), _x((257, 129), torch.float32, seed=11, spread=1.0)
    c = x.shape[axis]
    g = torch.Generator().manual_seed(12)
    sc = torch.rand(c, generator=g) * 0.1 + 0.01
    zp = torch.randint(qmin, qmax + 1, (c,), generator=g).float() + torch.rand(c, generator=g) - 0.5
    dx, ds, dz = A._fake_quantize_learnable_per_channel_affine_backward(dy, x, sc, zp, axis, qmin, qmax, 1.0)
    rdx, rds, rdz = R.learnable_grads(dy, x, sc, zp, qmin, qmax, axis=axis)
    assert torch.equal(dx, rdx)
    lay = R.layout_of(x.shape, axis)
    for got, terms in ((ds, rds), (dz, rdz)):
        t = terms.double().reshape(lay.outer, lay.channels, lay.inner).abs().sum(dim=(0, 2))
        assert ((got.double() - R.per_scale_sum(terms, lay)).abs() <= 4 * x.numel() * 2**-24 * t + 1e-30).all()
    y = torch._fake_quantize_learnable_per_channel_affine(x, sc, zp, axis, qmin, qmax, 1.0)
    _same(y, R.fake_quant(x, sc, zp, qmin, qmax, axis=axis, zp_rule="round")[0])


def _state(c, trial):
    if trial % 3 == 0:
        return [
            torch.full((c,), math.inf),
            torch.full((c,), -math.inf),
            torch.ones(c),
            torch.zeros(c, dtype=torch.int32),
        ]
    g = torch.Generator().manual_seed(trial)
    return [
        torch.randn(c, generator=g) - 1,
        torch.randn(c, generator=g) + 1,
        torch.ones(c),
        torch.zeros(c, dtype=torch.int32),
    ]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("grid", [(0, 255), (-128, 127), (-8, 7)])
def test_observer_matches_torch(per_channel, symmetric, grid):
    """torch's fused observer on CPU (moving average unfused: `fma=False`; its fbgemm qparams floor the scale at
    6.1e-5, which torch's CUDA kernel does not: the ranges here keep every scale above it)."""
    qmin, qmax = grid
    on = torch.tensor([1])
    for trial in range(6):
        x = _x((64, 33), torch.float32, seed=20 + trial, spread=0.5 + trial) + 0.3 * (trial % 3 - 1)
        c = 64 if per_channel else 1
        a, b = _state(c, trial), _state(c, trial)
        y, m = torch._fused_moving_avg_obs_fq_helper(
            x, on, on, *a, 0.01 * (trial + 1), qmin, qmax, 0, per_channel, symmetric
        )
        ry, rm = R.observe(
            x, on, on, *b, 0.01 * (trial + 1), qmin, qmax, per_channel=per_channel, symmetric=symmetric, fma=False
        )
        for p, q in zip(a, b):
            assert torch.equal(p, q)
        _same(y, ry)
        assert torch.equal(m, rm)


def test_observer_flags():
    """observer_on = 0 keeps the running range; fake_quant_on = 0 passes x through with mask 1 and keeps the
    qparams."""
    x = _x((16, 8), torch.float32, seed=30)
    st = [torch.tensor([-1.0]), torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([7], dtype=torch.int32)]
    y, m = R.observe(x, torch.tensor([0]), torch.tensor([0]), *st, 0.01, 0, 255)
    assert torch.equal(y, x) and m.all()
    assert st[0].item() == -1.0 and st[1].item() == 2.0 and st[2].item() == 0.5 and st[3].item() == 7
    R.observe(x, torch.tensor([0]), torch.tensor([1]), *st, 0.01, 0, 255)
    assert st[0].item() == -1.0 and st[2].item() == pytest.approx(3.0 / 255)


@pytest.mark.parametrize("symmetric", [False, True])
def test_choose_qparams_edges(symmetric):
    """Ranges on one side of 0, a zero range (scale 0.1), a tiny range, and exact ties of the zero point, against
    torch's CPU qparams (where its 6.1e-5 scale floor does not apply)."""
    mn = torch.tensor([-1.0, 0.5, -3.0, 0.0, -1.0, -2.0, -0.25])
    mx = torch.tensor([1.0, 2.0, -0.5, 0.0, 1.0 / 3, 6.0, 0.75])
    for qmin, qmax in ((0, 255), (-128, 127)):
        s, z = R.choose_qparams(mn, mx, qmin, qmax, symmetric)
        on = torch.tensor([1])
        for i in range(len(mn)):
            st = [mn[i : i + 1].clone(), mx[i : i + 1].clone(), torch.ones(1), torch.zeros(1, dtype=torch.int32)]
            torch._fused_moving_avg_obs_fq_helper(
                torch.zeros(1), torch.tensor([0]), on, *st, 0.01, qmin, qmax, 0, False, symmetric
            )
            assert st[2].item() == s[i].item() and st[3].item() == z[i].item(), (i, qmin, qmax)


def test_mask_pack_roundtrip():
    for n in (1, 7, 8, 9, 1000):
        m = torch.rand(n) > 0.4
        p = R.pack_mask(m)
        assert p.dtype == torch.uint8 and p.numel() == -(-n // 8)
        assert torch.equal(R.unpack_mask(p, (n,)), m)
    p = R.pack_mask(torch.tensor([True, False, False, True, False, False, False, False, True]))
    assert p.tolist() == [9, 1]


def test_layouts():
    assert R.layout_of((4, 6, 5)) == R.Layout("tensor", 1, 1, 120)
    assert R.layout_of((4, 6, 5), axis=1) == R.Layout("channel", 4, 6, 5)
    assert R.layout_of((4, 6, 5), axis=-1) == R.Layout("channel", 24, 5, 1)
    assert R.layout_of((4, 6, 8), group_size=4) == R.Layout("group", 1, 48, 4)
    with pytest.raises(ValueError, match="group_size"):
        R.layout_of((4, 6, 5), group_size=4)
    with pytest.raises(ValueError, match="axis"):
        R.layout_of((4, 6, 5), axis=3)
    with pytest.raises(ValueError, match="axis"):
        R.layout_of((4, 6, 8), axis=0, group_size=4)


def test_zero_rounding_gives_positive_zero():
    """A zero point rounded from (-0.5, 0) is -0.0 in fp32; the rules use +0.0 (as torch, which rounds through an
    integer), so an output of 0 is +0.0."""
    x = torch.tensor([-0.001, 0.0, 0.001])
    y, _ = R.fake_quant(x, torch.tensor(1.0), torch.tensor(-0.3), -8, 7, zp_rule="round")
    assert y.tolist() == [0.0, 0.0, 0.0] and not torch.signbit(y).any()
