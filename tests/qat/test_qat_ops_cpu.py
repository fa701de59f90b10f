"""CPU: the QAT ops' contracts without a GPU: the fake (meta) implementations' shapes and dtypes (outputs, the packed
mask, the learnable gradients), named errors for bad input (device, dtype, shapes, grids, flags, state buffers),
the row layouts the learnable backward picks, tracing through make_fx with fake CUDA tensors, and QATLinear's
buffers."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels.qat import ops
from cute_kernels.qat import reference as R

C = torch.ops.cute_kernels


def _cuda(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_shapes():
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = _cuda(300, 1000)
        s, z = _cuda(1000, dtype=torch.float32), _cuda(1000, dtype=torch.int32)
        y, m = C.fake_quant(x, s, z, -128, 127, 1, None, "int", None, True)
        assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
        assert m.shape == (37500,) and m.dtype == torch.uint8
        y, m = C.fake_quant(x, _cuda(1, dtype=torch.float32), None, -128, 127, None, None, "int", None, False)
        assert m.numel() == 0
        y, m = C.fake_quant_scalar(_cuda(3, 5, 7, dtype=torch.float16), 0.1, 3, 0, 255, "int", True)
        assert y.shape == (3, 5, 7) and y.dtype == torch.float16 and m.shape == (14,)
        g = _cuda(300 * 1000 // 40, dtype=torch.float32)
        y = C.fake_quant_learnable(x, g, g.clone(), -8, 7, None, 40, 1.0)
        dx, ds, dz = C.fake_quant_learnable_backward(x, x, g, g.clone(), -8, 7, None, 40, 1.0)
        assert y.shape == dx.shape == x.shape and ds.shape == dz.shape == g.shape and ds.dtype == torch.float32
        dx = C.fake_quant_backward(_cuda(9, dtype=torch.float32), torch.empty(2, dtype=torch.uint8, device="cuda"))
        assert dx.shape == (9,) and dx.dtype == torch.float32
        sb = _cuda(1, dtype=torch.bfloat16)
        y = C.fake_quant_learnable(x, sb, sb.clone(), -128, 127, None, None, 1.0)
        _, ds, dz = C.fake_quant_learnable_backward(x, x, sb, sb.clone(), -128, 127, None, None, 1.0)
        assert ds.dtype == torch.bfloat16 and ds.shape == (1,)


def _obs_state(c, device="cuda"):
    return [
        torch.full((c,), float("inf"), device=device),
        torch.full((c,), float("-inf"), device=device),
        torch.ones(c, device=device),
        torch.zeros(c, dtype=torch.int32, device=device),
    ]


def test_observer_fake():
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = _cuda(64, 96)
        on = torch.ones(1, dtype=torch.long, device="cuda")
        C.qat_observe(x, on, on, *_obs_state(64), 0.01, -128, 127, True, True)
        C.qat_observe(x, on, on, *_obs_state(1), 0.01, 0, 255, False, False)


def test_cpu_tensors_get_the_device_error():
    x = torch.randn(8, 8)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.fake_quant(x, 0.1, 0, -128, 127)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.fake_quant(x, torch.ones(8), torch.zeros(8, dtype=torch.int32), -128, 127, axis=0)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.fake_quant_learnable(x, torch.ones(1), torch.zeros(1), -128, 127)
    on = torch.ones(1, dtype=torch.long)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.fake_quant_observed(x, on, on, *_obs_state(1, "cpu"), 0.01, 0, 255, 0)


def _errors(fn, match, exc=(ValueError, TypeError)):
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(exc, match=match):
            fn()


def test_named_errors():
    x = lambda: _cuda(16, 24)  # noqa: E731
    f32 = lambda *s: _cuda(*s, dtype=torch.float32)  # noqa: E731
    i32 = lambda *s: _cuda(*s, dtype=torch.int32)  # noqa: E731
    _errors(
        lambda: C.fake_quant(_cuda(4, dtype=torch.int32), f32(1), None, 0, 255, None, None, "int", None, True),
        "x has dtype int32",
    )
    _errors(lambda: C.fake_quant(x(), f32(3), None, 0, 255, None, None, "int", None, True), "scale must have 1")
    _errors(lambda: C.fake_quant(x(), f32(16), None, 0, 255, 1, None, "int", None, True), r"C = 24")
    _errors(lambda: C.fake_quant(x(), f32(4, 4), None, 0, 255, 0, None, "int", None, True), "must be 1-D")
    _errors(lambda: C.fake_quant(x(), f32(16), i32(15), 0, 255, 0, None, "int", None, True), "zero_point must have")
    _errors(
        lambda: C.fake_quant(x(), f32(16), _cuda(16, dtype=torch.bool), 0, 255, 0, None, "int", None, True),
        "zero_point has dtype bool",
    )
    _errors(lambda: C.fake_quant(x(), f32(1), None, 5, 4, None, None, "int", None, True), "quant_min")
    _errors(lambda: C.fake_quant(x(), f32(1), None, 0, 2**25, None, None, "int", None, True), "2\\^24")
    _errors(lambda: C.fake_quant(x(), f32(1), i32(1), -448, 448, None, None, "e4m3", None, True), "no zero point")
    _errors(lambda: C.fake_quant(x(), f32(1), None, -8, 7, None, None, "e4m3", None, True), "-448 / 448")
    _errors(lambda: C.fake_quant(x(), f32(1), None, -8, 7, None, None, "int8", None, True), "qtype")
    _errors(lambda: C.fake_quant(x(), f32(1), None, -8, 7, 2, None, "int", None, True), "axis")
    _errors(lambda: C.fake_quant(x(), f32(1), None, -8, 7, None, 5, "int", None, True), "group_size=5")
    _errors(lambda: C.fake_quant(x(), f32(1), None, -8, 7, None, None, "int", i32(1), True), "enabled")
    _errors(lambda: C.fake_quant_scalar(x(), -0.1, 0, -8, 7, "int", True), "scale must be a positive")
    _errors(lambda: C.fake_quant_scalar(x(), 0.1, 9, -8, 7, "int", True), "zero_point")
    _errors(lambda: C.fake_quant_learnable(x(), f32(1), i32(1), -8, 7, None, None, 1.0), "zero_point has dtype int32")
    _errors(lambda: C.fake_quant_learnable(x(), f32(1), f32(1), 1, 7, None, None, 1.0), "quant_min <= 0")
    _errors(lambda: C.fake_quant_backward(x(), _cuda(7, dtype=torch.uint8)), "mask has 7 bytes")
    _errors(lambda: C.fake_quant_backward(x(), _cuda(48, dtype=torch.bool)), "packed uint8")
    on = lambda: torch.ones(1, dtype=torch.long, device="cuda")  # noqa: E731
    _errors(lambda: C.qat_observe(x(), on().int(), on(), *_obs_state(1), 0.01, 0, 255, False, False), "observer_on")
    _errors(lambda: C.qat_observe(x(), on(), on(), *_obs_state(3), 0.01, 0, 255, False, False), "running_min")

    def float_zero_point():
        st = _obs_state(16)
        st[3] = f32(16)
        return C.qat_observe(x(), on(), on(), *st, 0.01, -128, 127, True, True)

    _errors(float_zero_point, "zero_point must be a int32")
    _errors(lambda: C.qat_observe(_cuda(0, 4), on(), on(), *_obs_state(1), 0.01, 0, 255, False, False), "empty")


def test_wrapper_errors():
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = _cuda(16, 24)
        with pytest.raises(ValueError, match="quant_min and quant_max are required"):
            ck.fake_quant(x, 0.1)
        with pytest.raises(ValueError, match="per-tensor"):
            ck.fake_quant(x, 0.1, 0, -128, 127, axis=0)
        on = torch.ones(1, dtype=torch.long, device="cuda")
        with pytest.raises(ValueError, match="ch_axis"):
            ck.fake_quant_observed(x, on, on, *_obs_state(24), 0.01, -128, 127, 1, True, True)


def test_make_fx_traces_the_ops():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, s, z, w, on, a, b, sc, zp):
        y = ck.fake_quant(x, s, z, -128, 127, axis=1)
        y2 = ck.fake_quant_learnable(x, w, w, -8, 7, group_size=8)
        y3 = ck.fake_quant_observed(x, on, on, a, b, sc, zp, 0.01, 0, 255, 0)
        return y + y2 + y3

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = (
            _cuda(16, 24),
            _cuda(24, dtype=torch.float32),
            _cuda(24, dtype=torch.int32),
            _cuda(48, dtype=torch.float32),
            torch.ones(1, dtype=torch.long, device="cuda"),
            *_obs_state(1),
        )
        gm = make_fx(f, tracing_mode="fake")(*args)
    names = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {
        "cute_kernels.fake_quant.default",
        "cute_kernels.fake_quant_learnable.default",
        "cute_kernels.qat_observe.default",
    } <= names


def test_rows_layout():
    assert ops._rows_layout(R.Layout("tensor", 1, 1, 1000)) == (1, 1000, 1, False)
    assert ops._rows_layout(R.Layout("channel", 1, 4096, 4096)) == (4096, 4096, 1, False)
    assert ops._rows_layout(R.Layout("channel", 32, 64, 3136)) == (2048, 3136, 32, False)
    assert ops._rows_layout(R.Layout("channel", 8192, 512, 1)) == (512, 8192, 1, True)  # channel-last: gathered
    assert ops._rows_layout(R.Layout("group", 1, 1024, 128)) == (1024, 128, 1, False)
    assert [ops.mask_numel(n) for n in (0, 1, 8, 9, 1000)] == [0, 1, 1, 2, 125]


def test_qat_linear_buffers_and_errors():
    from cute_kernels.qat import QATLinear

    lin = QATLinear(64, 32, device="meta")
    assert lin.weight.shape == (32, 64) and lin.weight.dtype == torch.bfloat16
    assert lin.act_min.shape == (1,) and lin.weight_min.shape == (32,) and lin.weight_zero_point.dtype == torch.int32
    assert "_observer_off" not in lin.state_dict() and "observer_enabled" in lin.state_dict()
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        QATLinear(4, 4, dtype=torch.float32, device="meta")
    with pytest.raises(TypeError, match="x has dtype"):
        lin.fake_quant_operands(torch.empty(2, 64, device="meta"))
    with pytest.raises(ValueError, match=r"\(\.\.\., 64\)"):
        lin.fake_quant_operands(torch.empty(2, 63, dtype=torch.bfloat16, device="meta"))
