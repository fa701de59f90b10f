"""CPU: the torch op layer without a GPU: registration, fake (meta) implementations, named errors,
and tracing through FakeTensorMode (what torch.compile does before it runs anything)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck


def test_ops_are_registered():
    for name in ("copy", "add", "axpby", "row_sum", "sum_all"):
        assert hasattr(torch.ops.cute_kernels, name)


def test_fake_impls_give_shapes_and_dtypes():
    with FakeTensorMode():
        x = torch.empty(4, 6, 8, device="cuda", dtype=torch.bfloat16)
        assert ck.add(x, x).shape == (4, 6, 8)
        assert ck.copy(x.transpose(0, 2)).is_contiguous()
        assert ck.axpby(2.0, x, 1.0, x).dtype == torch.bfloat16
        assert ck.sum(x, dim=-1).shape == (4, 6)
        assert ck.sum(x, dim=-1, out_dtype=torch.float32).dtype == torch.float32
        assert ck.sum(x).shape == ()


def test_named_errors_on_cpu_tensors():
    x = torch.randn(8)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.add(x, x)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.sum(x)


def test_named_errors_in_fake_mode():
    with FakeTensorMode():
        x = torch.empty(8, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="y has dtype torch.float32 but x has torch.bfloat16"):
            ck.add(x, x.float())
        with pytest.raises(ValueError, match=r"y has shape \(4,\) but x has \(8,\)"):
            ck.add(x, torch.empty(4, device="cuda", dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="x has dtype int32"):
            ck.copy(x.int())
        with pytest.raises(TypeError, match="out_dtype"):
            ck.sum(x, out_dtype=torch.int64)
        with pytest.raises(ValueError, match="dim must be None or the last dim"):
            ck.sum(torch.empty(2, 4, device="cuda"), dim=0)
    with pytest.raises(RuntimeError, match="for argument 'x'"):  # the dispatcher names it
        ck.copy(3)


def test_make_fx_traces_the_custom_ops():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        return ck.sum(ck.axpby(0.5, ck.add(x, y), 2.0, y), dim=-1)

    with FakeTensorMode():
        x = torch.empty(16, 32, device="cuda", dtype=torch.float16)
        gm = make_fx(f, tracing_mode="fake")(x, x)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"cute_kernels.add.default", "cute_kernels.axpby.default", "cute_kernels.row_sum.default"} <= targets


def test_fresh_copy_realigns_what_contiguous_hands_back():
    """A contiguous view with a misaligned base: `contiguous()` returns it as it is, `fresh_copy` a new aligned
    buffer with the same values (the ops copy misaligned operands with it before a 16-byte-aligned kernel)."""
    import torch

    from cute_kernels.torch_ops import fresh_copy

    flat = torch.arange(1 + 4 * 64, dtype=torch.bfloat16)
    odd = flat[1:].view(4, 64)
    row = flat[1:65].view(1, 64)
    for t in (odd, row):
        assert t.is_contiguous() and t.data_ptr() % 16 and t.contiguous().data_ptr() == t.data_ptr()
        c = fresh_copy(t)
        assert c.data_ptr() % 16 == 0 and c.is_contiguous() and torch.equal(c, t)
