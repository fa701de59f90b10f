"""CPU: `addmm` (beta c + alpha a @ b, c added in the epilogue): shapes under fake tensors, named errors, the
broadcast gradient's reduction, and the streaming kernel's source variant compiled clean (c read once per output
element, no local memory)."""

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.gemm.ops import _addmm_backward, _addmm_fake


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_shapes():
    with FakeTensorMode(allow_non_fake_inputs=True):
        assert _addmm_fake(_t(5, 7), _t(5, 3), _t(3, 7)).shape == (5, 7)
        assert _addmm_fake(_t(7), _t(5, 3), _t(3, 7)).shape == (5, 7)  # a bias-like row
        assert _addmm_fake(_t(5, 1), _t(5, 3), _t(3, 7)).shape == (5, 7)  # a column
        assert _addmm_fake(_t(2, 5, 7), _t(2, 5, 3), _t(3, 7)).shape == (2, 5, 7)
        assert _addmm_fake(_t(5, 7), _t(2, 5, 3), _t(2, 3, 7)).shape == (2, 5, 7)


@pytest.mark.parametrize("c,a,b,exc,match", [
    ((5, 8), (5, 3), (3, 7), ValueError, r"c \(5, 8\) must broadcast to the output's shape \(5, 7\)"),
    ((2, 5, 7), (5, 3), (3, 7), ValueError, "must broadcast"),
    ("fp16", (5, 3), (3, 7), TypeError, "c has dtype torch.float16 but a has torch.bfloat16"),
    ((5, 7), (5, 3), (4, 7), ValueError, "inner dims differ"),
])
def test_named_errors(c, a, b, exc, match):
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
        _addmm_fake(_t(5, 7, dtype=torch.float16) if c == "fp16" else _t(*c), _t(*a), _t(*b))


def test_cpu_tensor_is_named():
    import cute_kernels as ck

    with pytest.raises(ValueError, match="c"):
        ck.addmm(torch.zeros(5, 7, dtype=torch.bfloat16), torch.zeros(5, 3, dtype=torch.bfloat16),
                 torch.zeros(3, 7, dtype=torch.bfloat16))


def test_broadcast_gradient_reduces(monkeypatch):
    """dc is beta g summed to c's shape; da / db get alpha g (the operand-gradient helper recorded)."""
    from cute_kernels.gemm import ops

    seen = {}

    def record(a, b, g, needs):
        seen["g"] = g
        return None, None

    monkeypatch.setattr(ops, "_operand_grads", record)

    class Ctx:
        saved_tensors = (torch.ones(4, 3), torch.ones(3, 6))
        c_shape, beta, alpha = (6,), 2.0, 0.5
        needs_input_grad = (True, True, True, False, False)

    g = torch.arange(24.0).reshape(4, 6)
    gc, *_ = _addmm_backward(Ctx, g)
    assert torch.equal(gc, 2.0 * g.sum(0)) and torch.equal(seen["g"], 0.5 * g)


def test_stream_source_compiles(tmp_path):
    """gemv.stream with `source`: y = alpha sum + beta c, c loaded once for each element the kernel writes (the
    unsplit store and the last split's sum), no local memory."""
    spec = catalog.get("gemv.stream")
    plain, _ = compile_with_artifacts(spec, spec.resolve({}), str(tmp_path / "plain"))
    report, files = compile_with_artifacts(spec, spec.resolve({"source": True}), str(tmp_path / "source"))
    assert not report.spills and not plain.spills
    ptx = files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    loads = len(re.findall(r"ld\.global(\.\w+)*\.(b16|u16)", ptx))
    plain_loads = len(re.findall(r"ld\.global(\.\w+)*\.(b16|u16)", (tmp_path / "plain").joinpath(
        next(p.name for p in (tmp_path / "plain").iterdir() if p.suffix == ".ptx")).read_text()))
    assert loads > plain_loads


def test_decode_shape_reaches_the_stream_kernel_with_c(monkeypatch):
    """addmm at a decode shape (M <= 16, K >= 12288) on CPU tensors with a recording gemv.stream spec: the source
    variant, c as the kernel's src, alpha and beta passed."""
    import importlib

    import cute_kernels.torch_ops as tops
    from cute_kernels.gemm import ops
    from cute_kernels.gemv import ops as gv

    class Recorder:
        name = "gemv.stream"

        def compiled(self, plan, **signature):
            self.signature = signature
            return lambda *args: setattr(self, "args", args)

    r = Recorder()
    gfam = importlib.import_module("cute_kernels.gemv")  # (the package: `cute_kernels.gemv` the attribute is the op)
    monkeypatch.setattr(gfam, "GEMV_STREAM", r)
    monkeypatch.setattr(gv, "num_sms", lambda *_: 132)
    from cute_kernels.w4a16 import ops as w4ops

    monkeypatch.setattr(w4ops, "split_counters", lambda dev, n: torch.zeros(n, dtype=torch.int32))
    for mod in (tops, ops):
        monkeypatch.setattr(mod, "check_tensor", lambda *a, **kw: None)  # (CPU tensors stand in for CUDA ones)
    x, w = torch.randn(1, 14336, dtype=torch.bfloat16), torch.randn(4096, 14336, dtype=torch.bfloat16)
    c = torch.randn(1, 4096, dtype=torch.bfloat16)
    y = ops._addmm_cuda(c, x, w.t(), 0.5, 2.0)
    assert y.shape == (1, 4096) and r.signature["source"] is True
    assert r.args[9].data_ptr() == c.data_ptr() and (r.args[10], r.args[11]) == (2.0, 0.5)  # src, alpha, beta
