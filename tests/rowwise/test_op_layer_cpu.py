"""CPU: the row-wise torch ops (norms, softmax, cross-entropy) without a GPU: registration, fake
implementations (shapes, dtypes), named errors, tracing with make_fx."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck

OPS = ("rms_norm", "rms_norm_bwd", "layer_norm", "layer_norm_bwd", "softmax", "softmax_bwd", "log_softmax",
       "log_softmax_bwd", "cross_entropy", "cross_entropy_bwd")


def test_ops_are_registered():
    for name in OPS:
        assert hasattr(torch.ops.cute_kernels, name), name


def test_fake_shapes_and_dtypes():
    with FakeTensorMode():
        x = torch.empty(4, 6, 64, device="cuda", dtype=torch.bfloat16)
        w32 = torch.empty(64, device="cuda", dtype=torch.float32)
        assert ck.rms_norm(x).shape == (4, 6, 64)
        assert ck.rms_norm(x, w32).dtype == torch.bfloat16
        y, s = ck.rms_norm(x, w32, residual=x)
        assert y.shape == s.shape == x.shape and s.dtype == x.dtype
        assert ck.layer_norm(x, w32, w32).shape == x.shape
        y, s = ck.layer_norm(x, None, None, residual=x)
        assert s.shape == x.shape
        out, res, rstd = torch.ops.cute_kernels.rms_norm(x, w32, None, 1e-6)
        assert rstd.shape == (24,) and rstd.dtype == torch.float32 and res.numel() == 0
        out, res, mean, rstd = torch.ops.cute_kernels.layer_norm(x, w32, w32, None, 1e-5)
        assert mean.shape == rstd.shape == (24,)
        dx, dw, db = torch.ops.cute_kernels.layer_norm_bwd(x, w32, True, x, None, mean, rstd)
        assert dx.shape == x.shape and dw.dtype == db.dtype == torch.float32 and dw.shape == (64,)
        assert ck.softmax(x).shape == x.shape and ck.log_softmax(x).dtype == torch.bfloat16
        logits = torch.empty(5, 1000, device="cuda", dtype=torch.bfloat16)
        t = torch.empty(5, device="cuda", dtype=torch.int64)
        assert ck.cross_entropy(logits, t).shape == ()
        assert ck.cross_entropy(logits, t, reduction="none").dtype == torch.float32
        assert ck.cross_entropy(logits, t.int(), reduction="sum").shape == ()


def test_named_errors_on_cpu_tensors():
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.rms_norm(torch.randn(2, 8))
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.softmax(torch.randn(2, 8))
    with pytest.raises(ValueError, match="logits must be on a CUDA device"):
        ck.cross_entropy(torch.randn(2, 8), torch.zeros(2, dtype=torch.int64))


def test_named_errors_in_fake_mode():
    with FakeTensorMode():
        x = torch.empty(4, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
            ck.rms_norm(x, torch.empty(32, device="cuda"))
        with pytest.raises(TypeError, match="weight has dtype int32"):
            ck.layer_norm(x, torch.empty(64, device="cuda", dtype=torch.int32))
        with pytest.raises(TypeError, match="bias has dtype"):
            ck.layer_norm(x, torch.empty(64, device="cuda"), torch.empty(64, device="cuda", dtype=torch.float16))
        with pytest.raises(ValueError, match=r"residual has shape \(4, 32\) but x has \(4, 64\)"):
            ck.rms_norm(x, residual=torch.empty(4, 32, device="cuda", dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="residual has dtype"):
            ck.rms_norm(x, residual=x.float())
        with pytest.raises(ValueError, match="at least 1 dimension"):
            ck.rms_norm(torch.empty((), device="cuda"))
        with pytest.raises(ValueError, match="dim must be the last dim"):
            ck.softmax(x, dim=0)
        with pytest.raises(TypeError, match="x has dtype int64"):
            ck.log_softmax(x.long())
        with pytest.raises(ValueError, match=r"target must have shape \(4,\)"):
            ck.cross_entropy(x, torch.empty(3, device="cuda", dtype=torch.int64))
        with pytest.raises(TypeError, match="target has dtype float32"):
            ck.cross_entropy(x, torch.empty(4, device="cuda"))
        with pytest.raises(ValueError, match="logits must be 2-D"):
            ck.cross_entropy(torch.empty(2, 3, 4, device="cuda"), torch.empty(2, device="cuda", dtype=torch.int64))
        with pytest.raises(ValueError, match="reduction must be"):
            ck.cross_entropy(x, torch.empty(4, device="cuda", dtype=torch.int64), reduction="avg")


def test_make_fx_traces_forward_and_backward_ops():
    """The forward ops, and the backward ops the autograd formulas call (the autograd engine itself
    needs a CUDA device, so the backward graph is traced here by calling the backward ops)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    ops = torch.ops.cute_kernels

    def f(x, w, t):
        y, _, rstd = ops.rms_norm(x, w, None, 1e-6)
        z, _, mean, rstd2 = ops.layer_norm(y, w, w, None, 1e-5)
        p = ops.softmax(z)
        q = ops.log_softmax(p)
        loss, lse = ops.cross_entropy(q, t, -100)
        g = ops.cross_entropy_bwd(q, t, loss, lse, -100)
        g = ops.softmax_bwd(p, ops.log_softmax_bwd(q, g))
        g, _, _ = ops.layer_norm_bwd(y, w, True, g, None, mean, rstd2)
        return ops.rms_norm_bwd(x, w, g, None, rstd)

    with FakeTensorMode():
        x = torch.empty(8, 128, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(128, device="cuda", dtype=torch.bfloat16)
        t = torch.empty(8, device="cuda", dtype=torch.int64)
        gm = make_fx(f, tracing_mode="fake")(x, w, t)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    for op in OPS:
        assert f"cute_kernels.{op}.default" in targets, op
