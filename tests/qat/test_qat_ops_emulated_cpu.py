"""CPU: the QAT ops end to end with each compiled kernel replaced by a torch emulator of its contract (the arguments
it takes and what it computes from them, by the reference's rules): the ops' layout and mode choices (scalar /
tensor / vector / element scale indexing, the packed mask, the row views, splits and the direct-or-merge finish, the
channel-first gather, the observer's flags), autograd wiring and operand preparation (non-contiguous and misaligned
x, int zero points broadcast), against torch's CPU ops and the reference. What the DSL kernels compute is the GPU
tests' part; the emulators also assert the contracts the kernels rely on (alignment, row strides, mask size)."""

import math

import pytest
import torch

import cute_kernels as ck
from cute_kernels import catalog, torch_ops
from cute_kernels.qat import ops
from cute_kernels.qat import reference as R

A = torch.ops.aten
LOG = []


def _fq(p):
    def run(x, y, m, scale, zp, flag, s_arg, z_arg, inner, channels, qmin, qmax, max_ctas):
        LOG.append(("fq", p["mode"]))
        assert x.dim() == 1 and x.is_contiguous() and x.data_ptr() % 16 == 0 and y.is_contiguous()
        assert zp.dtype == (torch.int32 if p["zp"] == "int" else torch.float32) and m.dtype == torch.uint8
        n = x.numel()
        if p["mode"] == "scalar":
            s, z = torch.full((n,), s_arg), torch.full((n,), z_arg)
        else:
            i = torch.arange(n)
            c = torch.zeros(n, dtype=torch.long) if p["mode"] == "tensor" else (i // inner) % channels
            assert p["mode"] != "vector" or inner % 8 == 0
            s, z = scale[c], R.zero_point_of(zp[c], p["zp"], qmin, qmax)
        xf, inv = x.float(), 1.0 / s
        if p["qtype"] == "e4m3":
            v = xf * inv
            yv, mk = v.clamp(-448, 448).to(torch.float8_e4m3fn).float() * s, v.abs() <= 448
        else:
            r = torch.round(R.fma32(xf, inv, z)) + 0.0 if p["zp"] == "float" else torch.round(xf * inv) + z
            mk = (r >= qmin) & (r <= qmax)
            yv = (R._clamp_nan_low(r, qmin, qmax) - z) * s
        if p["gated"] and int(flag[0]) == 0:
            yv, mk = xf, torch.ones(n, dtype=torch.bool)
        y.copy_(yv.to(y.dtype))
        if p["mask"]:
            assert m.numel() == -(-n // 8)
            m.copy_(R.pack_mask(mk))

    return run


def _ste(p):
    def run(dy, dx, m, max_ctas):
        assert dy.dim() == 1 and dy.is_contiguous() and m.numel() == -(-dy.numel() // 8)
        dx.copy_((dy.float() * R.unpack_mask(m, (dy.numel(),)).float()).to(dx.dtype))

    return run


def _rows_contract(p, x, partial, splits):
    rows, length = x.shape
    vec = 16 // x.element_size() if p["aligned"] else 1
    assert x.stride(1) == 1 and x.stride(0) % vec == 0 and (rows == 1 or x.stride(0) == length)
    assert not p["aligned"] or rows == 1 or length % vec == 0
    assert partial.shape == (rows, splits, 2) if p["merge"] else splits == 1


def _learn(p):
    def run(x, dy, dx, scale, zp, partial, out_s, out_z, counter, splits, channels, qmin, qmax, gf, max_ctas):
        LOG.append(("learn", p["merge"], splits))
        _rows_contract(p, x, partial, splits)
        rows = x.shape[0]
        sums = torch.zeros(rows, 2, dtype=torch.float64)
        for r in range(rows):
            c = r % channels
            d, ts, tz = R.learnable_grads(
                dy[r], x[r], scale[c : c + 1], zp[c : c + 1], qmin, qmax, zp_rule=p["zp"], grad_factor=gf
            )
            dx[r].copy_(d)
            sums[r] = torch.stack([ts.double().sum(), tz.double().sum()])
        if not p["merge"]:
            assert rows == channels
        for c in range(channels):
            out_s[c], out_z[c] = sums[c::channels].sum(0)

    return run


def _observe(p):
    def run(
        x, observer_on, fake_quant_on, rmin, rmax, scale, zp, partial, counter, splits, averaging, qmin, qmax, max_ctas
    ):
        LOG.append(("observe", p["merge"], splits))
        _rows_contract(p, x, partial, splits)
        assert rmin.numel() == x.shape[0]
        if int(observer_on[0]) == 1:
            xf = x.float()
            rmin.copy_(R.moving_average(rmin, xf.amin(1), averaging))
            rmax.copy_(R.moving_average(rmax, xf.amax(1), averaging))
        if int(fake_quant_on[0]) == 1:
            s, z = R.choose_qparams(rmin, rmax, qmin, qmax, p["symmetric"])
            scale.copy_(s)
            zp.copy_(z)

    return run


def _observe_rows(p):
    def run(x, y, m, observer_on, fake_quant_on, rmin, rmax, scale, zp, averaging, qmin, qmax, max_ctas):
        LOG.append(("observe_rows", p["mask"], p["symmetric"]))
        rows, length = x.shape
        assert x.is_contiguous() and x.data_ptr() % 16 == 0 and length % 8 == 0 and y.is_contiguous()
        vec = 16 // x.element_size()
        assert p["unroll"] * vec * p["threads_per_row"] >= length and vec * p["threads_per_row"] >= 8
        assert rmin.numel() == rows and (not p["mask"] or m.numel() == rows * length // 8)
        yr, mk = R.observe(
            x, observer_on, fake_quant_on, rmin, rmax, scale, zp, averaging, qmin, qmax, True, p["symmetric"]
        )
        y.copy_(yr.to(y.dtype))
        if p["mask"]:
            m.copy_(R.pack_mask(mk))

    return run


_EMULATORS = {
    "qat.fake_quant": _fq,
    "qat.ste_bwd": _ste,
    "qat.learnable_bwd": _learn,
    "qat.observe": _observe,
    "qat.observe_rows": _observe_rows,
}


@pytest.fixture(autouse=True)
def emulated(monkeypatch):
    def check_tensor(name, t, *, allowed=ops.dtypes.FLOAT_TORCH, min_ndim=0):
        if not isinstance(t, torch.Tensor) or t.dtype not in allowed:
            raise TypeError(f"{name}: {type(t).__name__} {getattr(t, 'dtype', None)}")

    def call(qualname, *args):
        fn = torch_ops._FUNCTIONS.get(qualname)
        if fn is not None and torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
            return fn.apply(*args)
        return torch_ops._IMPLS[qualname](*args)

    def compiled(self, schedule=None, **overrides):
        return _EMULATORS[self.name](self.params_of_call(schedule, **overrides))

    monkeypatch.setattr(ops, "check_tensor", check_tensor)
    monkeypatch.setattr(ops, "num_sms", lambda dev=None: 132)
    monkeypatch.setattr(ops, "split_counters", lambda device, n: torch.zeros(n, dtype=torch.int32, device=device))
    monkeypatch.setattr(ops, "call", call)
    monkeypatch.setattr(catalog.KernelSpec, "compiled", compiled)
    LOG.clear()


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    view = torch.int16 if a.element_size() == 2 else torch.int32
    assert torch.equal(a.contiguous().view(view), b.contiguous().view(view))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(0,), (1,), (9,), (257, 129), (6, 33, 16)])
def test_fake_quant_modes(dtype, shape):
    from cute_kernels.qat.ops import fake_quant_with_mask

    x = (torch.randn(*shape) * 3).to(dtype)
    ty, tm = A.fake_quantize_per_tensor_affine_cachemask(x, 0.0371, 5, -8, 7)
    for s, z in ((0.0371, 5), (torch.tensor([0.0371]), torch.tensor([5], dtype=torch.int32))):
        y, m = fake_quant_with_mask(x, s, z, -8, 7)
        _same(y, ty)
        assert torch.equal(m, tm)
    for axis in range(x.dim()) if x.numel() else ():
        sc = torch.rand(shape[axis]) * 0.1 + 0.01
        zp = torch.randint(-8, 8, (shape[axis],), dtype=torch.int32)
        y, m = fake_quant_with_mask(x, sc, zp, -8, 7, axis=axis)
        ty, tm = A.fake_quantize_per_channel_affine_cachemask(x, sc, zp, axis, -8, 7)
        _same(y, ty)
        assert torch.equal(m, tm)
        _same(
            ck.fake_quant(x, sc, 3, -8, 7, axis=axis),
            A.fake_quantize_per_channel_affine(x, sc, torch.full_like(zp, 3), axis, -8, 7),
        )
    if x.numel() and shape[-1] % 3 == 0:
        sg = torch.rand(*shape[:-1], shape[-1] // 3) * 0.1 + 0.01
        y, m = fake_quant_with_mask(x, sg, None, -8, 7, group_size=3)
        ry, rm = R.fake_quant(x, sg, None, -8, 7, group_size=3)
        _same(y, ry)
        assert torch.equal(m, rm)
    se = torch.tensor(0.01)
    y, m = fake_quant_with_mask(x, se, None, qtype="e4m3")
    ry, rm = R.fake_quant(x, se, None, -448, 448, qtype="e4m3")
    _same(y, ry)
    assert torch.equal(m, rm)
    if x.numel():
        xr = x.clone().requires_grad_()
        dy = torch.randn(*shape).to(dtype)
        _, pt = A.fake_quantize_per_tensor_affine_cachemask(x, 0.0371, 5, -8, 7)
        ck.fake_quant(xr, 0.0371, 5, -8, 7).backward(dy)
        _same(xr.grad, A.fake_quantize_per_tensor_affine_cachemask_backward(dy, pt))


def test_scale_indexing_modes_chosen():
    x = torch.randn(4, 16, 6)
    ck.fake_quant(x, torch.ones(4), None, -8, 7, axis=0)  # inner 96: once an item
    ck.fake_quant(x, torch.ones(6), None, -8, 7, axis=2)  # inner 1: per element
    ck.fake_quant(x, 0.5, 0, -8, 7)
    ck.fake_quant(x, torch.ones(1), None, -8, 7)
    assert [m for _, m in LOG] == ["vector", "element", "scalar", "tensor"]


def test_awkward_layouts():
    base = torch.randn(30, 201)
    for x in (base[:, 1:101], base.t(), base.reshape(-1)[1:1001]):
        _same(ck.fake_quant(x, 0.05, 3, -128, 127), A.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,axis,group_size",
    [
        ((257, 129), None, None),
        (((1 << 16) + 3,), None, None),
        ((257, 129), 0, None),
        ((257, 129), 1, None),
        ((4, 8, 6, 70), 1, None),
        ((8, 96), None, 32),
        ((16, 4096), 0, None),
        ((2, 3_000_000), 0, None),
    ],
)
def test_learnable(dtype, shape, axis, group_size):
    x = (torch.randn(*shape) * 3).to(dtype).requires_grad_()
    dy = torch.randn(*shape).to(dtype)
    lay = R.layout_of(shape, axis, group_size)
    s = (torch.rand(lay.channels) * 0.1 + 0.01).requires_grad_()
    z = (torch.randint(-100, 100, (lay.channels,)).float() + torch.rand(lay.channels) - 0.5).requires_grad_()
    y = ck.fake_quant_learnable(x, s, z, -128, 127, axis=axis, group_size=group_size, grad_factor=0.5)
    _same(y, R.fake_quant(x.detach(), s.detach(), z.detach(), -128, 127, axis, group_size, zp_rule="round")[0])
    if dtype == torch.float32 and group_size is None:
        ref = (
            torch._fake_quantize_learnable_per_tensor_affine(x.detach(), s.detach(), z.detach(), -128, 127, 0.5)
            if axis is None
            else torch._fake_quantize_learnable_per_channel_affine(
                x.detach(), s.detach(), z.detach(), axis, -128, 127, 0.5
            )
        )
        _same(y, ref)
    y.backward(dy)
    rdx, rds, rdz = R.learnable_grads(dy, x.detach(), s.detach(), z.detach(), -128, 127, axis, group_size, 0.5)
    _same(x.grad, rdx)
    mag = rds.double().abs().reshape(lay.outer, lay.channels, lay.inner).sum(dim=(0, 2))
    assert ((s.grad.double() - R.per_scale_sum(rds, lay)).abs() <= 1e-6 * mag + 1e-30).all()
    assert s.grad.shape == s.shape and z.grad.shape == z.shape


def test_learnable_finish_choice():
    """One row a channel and one split: the row's owner finishes (no merge); several rows a channel, or splits:
    the last CTA merges."""

    def run(shape, axis):
        LOG.clear()
        x = torch.randn(*shape).requires_grad_()
        c = shape[axis]
        ck.fake_quant_learnable(x, torch.ones(c) * 0.1, torch.zeros(c), -8, 7, axis=axis).sum().backward()
        return [entry[1:] for entry in LOG if entry[0] == "learn"]

    assert run((4096, 4096), 0) == [(False, 1)]
    assert run((64, 32, 28, 28), 1) == [(True, 1)]  # 64 rows a channel
    assert run((16, 1 << 20), 0)[0][0] is True  # 16 long rows: split over CTAs


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("shape", [(3, 5), (64, 33), (16, 1 << 18)])
def test_observer(per_channel, symmetric, shape):
    on, off = torch.tensor([1]), torch.tensor([0])
    x = torch.randn(*shape)
    c = shape[0] if per_channel else 1
    a = [torch.full((c,), math.inf), torch.full((c,), -math.inf), torch.ones(c), torch.zeros(c, dtype=torch.int32)]
    b = [t.clone() for t in a]
    qmin, qmax = (-128, 127) if symmetric else (0, 255)
    for step in range(2):
        y = ck.fake_quant_observed(x + step, on, on, *a, 0.01, qmin, qmax, 0, per_channel, symmetric)
        ry, _ = R.observe(x + step, on, on, *b, 0.01, qmin, qmax, per_channel=per_channel, symmetric=symmetric)
        for p, q in zip(a, b):
            assert torch.equal(p, q)
        _same(y, ry)
    _same(ck.fake_quant_observed(x, off, off, *a, 0.01, qmin, qmax, 0, per_channel, symmetric), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 8), (64, 40), (5, 2, 32), (4, 33), (3, 8200), (7, 16392), (2, 16384)])
@pytest.mark.parametrize("grad", [False, True])
def test_observer_one_pass_rows(dtype, shape, grad, monkeypatch):
    """Per-channel observation of 16-bit rows of whole 8-element vectors that a CTA's registers hold takes the one-pass
    kernel (with the STE mask when x needs a gradient, differentiable through it), and so do fp32 rows of 64 to 8192;
    rows of odd length, shorter or longer take the two passes. Either way the state and y are the reference's, and dx is dy * mask."""
    monkeypatch.setattr(ops, "ONE_PASS_ROWS", True)
    on = torch.tensor([1])
    x = (torch.randn(*shape) * 3).to(dtype)
    c = shape[0]
    a = [torch.full((c,), math.inf), torch.full((c,), -math.inf), torch.ones(c), torch.zeros(c, dtype=torch.int32)]
    b = [t.clone() for t in a]
    length = x.numel() // c
    shortest = 64 if dtype == torch.float32 else 8
    one_pass = length % 8 == 0 and shortest <= length <= ops.observed_row_max(x.element_size())
    for step in range(2):
        LOG.clear()
        xr = (x + step).requires_grad_(grad)
        y = ck.fake_quant_observed(xr, on, on, *a, 0.01, -128, 127, 0, True, True)
        ry, rm = R.observe(x + step, on, on, *b, 0.01, -128, 127, per_channel=True, symmetric=True)
        assert [e[0] for e in LOG if e[0].startswith("observe")] == ["observe_rows" if one_pass else "observe"]
        if one_pass:
            assert LOG[0][1] == grad  # the mask is stored only for a differentiable x
        for p, q in zip(a, b):
            assert torch.equal(p, q)
        _same(y, ry.to(dtype))
        if grad:
            dy = torch.randn(shape).to(dtype)
            y.backward(dy)
            _same(xr.grad, (dy.float() * rm.float()).to(dtype))


def test_observer_one_pass_rows_off(monkeypatch):
    """`ops.ONE_PASS_ROWS = False` keeps the two passes; the flags off pass x through and keep the state."""
    monkeypatch.setattr(ops, "ONE_PASS_ROWS", False)
    on, off = torch.tensor([1]), torch.tensor([0])
    x = torch.randn(16, 64).to(torch.bfloat16)
    a = [torch.full((16,), math.inf), torch.full((16,), -math.inf), torch.ones(16), torch.zeros(16, dtype=torch.int32)]
    ck.fake_quant_observed(x, on, on, *a, 0.01, -128, 127, 0, True, True)
    assert ("observe", False, 1) in LOG and not any(e[0] == "observe_rows" for e in LOG)
    monkeypatch.setattr(ops, "ONE_PASS_ROWS", True)
    before = [t.clone() for t in a]
    LOG.clear()
    _same(ck.fake_quant_observed(x, off, off, *a, 0.01, -128, 127, 0, True, True), x)
    assert LOG and LOG[0][0] == "observe_rows"
    for p, q in zip(a, before):
        assert torch.equal(p, q)
