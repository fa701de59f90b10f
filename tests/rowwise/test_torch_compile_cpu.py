"""CPU: the row-wise ops under torch.compile(fullgraph=True), as
`test_rowwise_gpu.py::test_torch_compile_fullgraph` runs them, without a GPU.

The ops' CPU kernels are their fake implementations and their checks want CUDA tensors, so the
`cpu_rowwise_ops` fixture lets the checks accept CPU tensors and overrides the CPU kernels of the
forward ops with torch reference math (both restored afterwards). Dynamo, AOTAutograd and Inductor
then see the same custom ops, schemas, fake implementations and autograd registrations as on the GPU.

Regression: the GPU test failed inside Inductor ("a leaf Variable that requires grad is being used
in an in-place operation"). The cause was the GPU module's NaN-poisoning fixture, not the ops: it
replaced `torch.empty` with a version that fills every floating tensor in place, and a process's
first Inductor compile builds its pattern matcher's example inputs with
`torch.empty(..., requires_grad=True)` (`tests.helpers.poison_empty` now leaves those alone). The
chain runs in a fresh process with Inductor's caches off, so that first compile is the one tested.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from tests.helpers import poison_empty

ROOT = Path(__file__).resolve().parents[2]


# --- CPU reference kernels (fp32 math, one rounding to x's dtype, as the CUDA kernels) ---------------
def _rms_ref(x, weight, residual, eps):
    s = x + residual if residual is not None else x
    sf = s.float()
    rstd = torch.rsqrt(sf.square().mean(-1, keepdim=True) + eps)
    y = sf * rstd * (weight.float() if weight is not None else 1.0)
    return y.to(x.dtype), (s if residual is not None else x.new_empty(0)), rstd.reshape(-1)


def _ln_ref(x, weight, bias, residual, eps):
    s = x + residual if residual is not None else x
    sf = s.float()
    mean = sf.mean(-1, keepdim=True)
    rstd = torch.rsqrt((sf - mean).square().mean(-1, keepdim=True) + eps)
    y = (sf - mean) * rstd * (weight.float() if weight is not None else 1.0)
    if bias is not None:
        y = y + bias.float()
    return (y.to(x.dtype), (s if residual is not None else x.new_empty(0)), mean.reshape(-1),
            rstd.reshape(-1))


def _ce_ref(logits, target, ignore_index):
    xf = logits.float()
    lse = torch.logsumexp(xf, -1)
    keep = target != ignore_index
    picked = xf.gather(1, torch.where(keep, target, 0).long()[:, None])[:, 0]
    return torch.where(keep, lse - picked, 0.0), lse


CPU_REFS = {
    "rms_norm": _rms_ref,
    "layer_norm": _ln_ref,
    "softmax": lambda x: torch.softmax(x.float(), -1).to(x.dtype),
    "log_softmax": lambda x: torch.log_softmax(x.float(), -1).to(x.dtype),
    "cross_entropy": _ce_ref,
}


def _allow_cpu_tensors(monkeypatch):
    """The ops' argument checks, accepting CPU tensors (same dtype and rank rules), and the public
    wrappers always going through the registered ops (their eager fast path calls the CUDA kernels)."""
    checks = sys.modules["cute_kernels.torch_ops"]
    real = checks.check_tensor

    def check_tensor(name, t, *, allowed=checks.FLOAT_DTYPES, min_ndim=0):
        if not (isinstance(t, torch.Tensor) and t.device.type == "cpu"):
            return real(name, t, allowed=allowed, min_ndim=min_ndim)
        if t.dtype not in allowed:
            raise TypeError(f"{name} has dtype {t.dtype}")
        if t.dim() < min_ndim:
            raise ValueError(f"{name} must have at least {min_ndim} dimension(s)")

    for mod in ("cute_kernels.torch_ops", "cute_kernels.rowwise.ops", "cute_kernels.rowwise.ops"):
        monkeypatch.setattr(sys.modules[mod], "check_tensor", check_tensor)
    # (`_checks.call` decides the path: with CPU tensors it takes the registered op unless direct_call_ok)
    monkeypatch.setattr(checks, "direct_call_ok", lambda *ts: False)


def _override_cpu_kernels():
    lib = torch.library.Library("cute_kernels", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        for name, fn in CPU_REFS.items():
            lib.impl(name, fn, "CPU", allow_override=True)
    return lib


@pytest.fixture
def cpu_rowwise_ops(monkeypatch):
    _allow_cpu_tensors(monkeypatch)
    lib = _override_cpu_kernels()
    try:
        yield
    finally:
        lib._destroy()  # the fake implementations are the CPU kernels again
        torch._dynamo.reset()


def _inputs(m=64, n=4096):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, n, generator=g).bfloat16()
    w = torch.randn(n, generator=g).bfloat16()
    t = torch.randint(0, n, (m,), generator=g)
    return x, w, t


def _chain(x, w, t, reduction="mean"):
    return ck.cross_entropy(ck.softmax(ck.layer_norm(ck.rms_norm(x, w), w, w)), t, reduction=reduction)


# --- tests -----------------------------------------------------------------------------------------
def test_poison_empty_fills_plain_tensors_only(monkeypatch):
    poison_empty(monkeypatch)
    assert torch.empty(5).isnan().all()
    assert torch.empty(3, dtype=torch.bfloat16).isnan().all()
    leaf = torch.empty(4, requires_grad=True)  # the fill raised here before (in-place op on a grad leaf)
    assert leaf.is_leaf and leaf.requires_grad
    with FakeTensorMode():  # what Inductor's pattern matcher does on its first compile
        torch.empty((2, 4, 8, 16), requires_grad=True)


def test_reference_kernels_match_torch(cpu_rowwise_ops):
    x, w, t = _inputs(8, 256)
    ref_ln = torch.nn.functional.layer_norm(x.float(), (256,), w.float(), w.float(), 1e-5)
    assert torch.allclose(ck.layer_norm(x, w, w).float(), ref_ln, atol=0.05, rtol=0.02)
    ref_rms = torch.nn.functional.rms_norm(x.float(), (256,), w.float(), 1e-6)
    assert torch.allclose(ck.rms_norm(x, w).float(), ref_rms, atol=0.05, rtol=0.02)
    ref_ce = torch.nn.functional.cross_entropy(x.float(), t)
    assert torch.allclose(ck.cross_entropy(x, t), ref_ce, rtol=1e-5)
    t[3] = -100
    assert torch.allclose(ck.cross_entropy(x, t), torch.nn.functional.cross_entropy(x.float(), t), rtol=1e-5)


def test_overrides_are_undone():
    with pytest.MonkeyPatch.context() as mp:
        _allow_cpu_tensors(mp)
        lib = _override_cpu_kernels()
        assert torch.ops.cute_kernels.softmax(torch.zeros(2, 4)).eq(0.25).all()
        lib._destroy()
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        torch.ops.cute_kernels.softmax(torch.zeros(2, 4))


def test_compile_chain_with_grad_inputs_traces_autograd(cpu_rowwise_ops):
    """AOTAutograd traces the joint graph through each op's setup_context (outputs marked
    non-differentiable, integer target saved, weight and bias the same tensor)."""
    x, w, t = _inputs(16, 512)
    x.requires_grad_()
    w.requires_grad_()
    f = torch.compile(lambda x, w: _chain(x, w, t), fullgraph=True, backend="aot_eager")
    out = f(x, w)
    assert out.requires_grad and torch.equal(out.detach(), _chain(x, w, t).detach())


def run_chain_under_poison() -> None:
    """The GPU test's chain, compiled with Inductor under the poisoning fixture (run in a fresh process)."""
    with pytest.MonkeyPatch.context() as mp:
        _allow_cpu_tensors(mp)
        lib = _override_cpu_kernels()
        poison_empty(mp)
        x, w, t = _inputs()
        f = torch.compile(lambda x: (_chain(x, w, t, "none"), _chain(x, w, t)), fullgraph=True)
        rows, mean = f(x)
        assert torch.equal(rows, _chain(x, w, t, "none"))  # our ops: the same kernels compiled or eager
        torch.testing.assert_close(mean, _chain(x, w, t), rtol=1e-6, atol=0)  # Inductor's own sum
        lib._destroy()
    print("chain ok")


def test_compile_chain_inductor_first_compile_under_poison():
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    code = "import tests.rowwise.test_torch_compile_cpu as m; m.run_chain_under_poison()"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and "chain ok" in r.stdout, r.stderr[-4000:]
