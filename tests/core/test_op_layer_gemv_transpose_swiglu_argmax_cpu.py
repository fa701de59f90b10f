"""CPU: the gemv, silu/swiglu, argmax and transpose ops without a GPU: registration, fake (meta)
implementations (shapes, dtypes), named errors, and tracing through FakeTensorMode."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, device="cuda", dtype=dtype)


def test_ops_are_registered():
    for name in ("gemv", "silu", "silu_backward", "swiglu", "swiglu_backward", "argmax", "transpose"):
        assert hasattr(torch.ops.cute_kernels, name)


def test_fake_shapes_and_dtypes():
    with FakeTensorMode():
        x = _t(4, 6, 64)
        assert ck.silu(x).shape == (4, 6, 64) and ck.swiglu(x, x).dtype == torch.bfloat16
        dg, du = torch.ops.cute_kernels.swiglu_backward(x, x, x)
        assert dg.shape == du.shape == (4, 6, 64)
        a = ck.argmax(x)
        assert a.shape == (4, 6) and a.dtype == torch.int64
        assert ck.argmax(x, keepdim=True).shape == (4, 6, 1)
        for v in ("naive", "smem", "swizzle", "tma"):
            assert ck.transpose(x, variant=v).shape == (4, 64, 6)
        assert ck.transpose(_t(5, 7, dtype=torch.float32)).shape == (7, 5)
        w = _t(128, 64)
        assert ck.gemv(w, _t(64)).shape == (128,)
        assert ck.gemv(w, _t(64, 8)).shape == (128, 8)


def test_named_errors_on_cpu_tensors():
    x = torch.randn(8, 8)
    for f in (lambda: ck.silu(x), lambda: ck.swiglu(x, x), lambda: ck.argmax(x), lambda: ck.transpose(x),
              lambda: ck.gemv(x, x[0])):
        with pytest.raises(ValueError, match="must be on a CUDA device"):
            f()


def test_named_errors_in_fake_mode():
    with FakeTensorMode():
        x = _t(8, 16)
        with pytest.raises(TypeError, match="up has dtype torch.float32 but gate has torch.bfloat16"):
            ck.swiglu(x, x.float())
        with pytest.raises(ValueError, match=r"up has shape \(4, 16\) but gate has \(8, 16\)"):
            ck.swiglu(x, _t(4, 16))
        with pytest.raises(TypeError, match="x has dtype int32"):
            ck.silu(x.int())
        with pytest.raises(ValueError, match="dim must be the last dim"):
            ck.argmax(x, dim=0)
        with pytest.raises(ValueError, match="empty last dim"):
            ck.argmax(_t(3, 0))
        with pytest.raises(ValueError, match="at least 1 dimension"):
            ck.argmax(_t())
        with pytest.raises(ValueError, match="variant must be one of"):
            ck.transpose(x, variant="fast")
        with pytest.raises(ValueError, match="2-D .* or batched 3-D"):
            ck.transpose(_t(2, 2, 2, 2))
        w = _t(32, 16)
        with pytest.raises(ValueError, match="x has 8 rows but w has 16 columns"):
            ck.gemv(w, _t(8))
        with pytest.raises(ValueError, match="1 to 8 columns"):
            ck.gemv(w, _t(16, 9))
        with pytest.raises(TypeError, match="x has dtype torch.float16 but w has torch.bfloat16"):
            ck.gemv(w, _t(16, dtype=torch.float16))
        with pytest.raises(ValueError, match="w must be 2-D"):
            ck.gemv(_t(16), _t(16))


def test_make_fx_traces_the_ops():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f2(g, u, w, x):
        return ck.argmax(ck.transpose(ck.swiglu(g, u), variant="swizzle")), ck.gemv(w, ck.silu(x))

    with FakeTensorMode():
        g = _t(16, 32)
        gm = make_fx(f2, tracing_mode="fake")(g, g, _t(64, 32), _t(32))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"cute_kernels.swiglu.default", "cute_kernels.transpose.default", "cute_kernels.argmax.default",
            "cute_kernels.gemv.default", "cute_kernels.silu.default"} <= targets
