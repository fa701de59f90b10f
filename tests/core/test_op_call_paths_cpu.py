"""CPU: how a public op reaches its implementation (`cute_kernels.torch_ops.call`, session 18).

A dummy op registered like ours (`register_op`, an implementation that computes for real on the CPU so every path
can run here) shows the three paths: the implementation itself when nothing needs gradients, the eager
`torch.autograd.Function` built from the registered `setup_context` / `backward` when gradients are needed on plain
CUDA tensors, and the registered op otherwise (torch.compile tracing, tensor subclasses, CPU tensors). The Function
must give the registered autograd's outputs and gradients."""

import pytest
import torch

from cute_kernels import torch_ops as C

Q = "cktest::scale_rows"
CALLS = {"impl": 0, "bwd_impl": 0}


def _impl(x, w, alpha):
    CALLS["impl"] += 1
    y = x * w * alpha
    return y, y.sum(-1)


def _bwd_impl(x, w, gy, alpha):
    CALLS["bwd_impl"] += 1
    return gy * w * alpha, (gy * x).sum(0) * alpha


def _setup(ctx, inputs, output):
    x, w, alpha = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.alpha = alpha
    ctx.save_for_backward(x, w)


def _backward(ctx, gy, _gs):
    x, w = ctx.saved_tensors
    dx, dw = C.call("cktest::scale_rows_bwd", x, w, gy.contiguous(), ctx.alpha)
    return dx, dw, None


C.register_op("cktest::scale_rows_bwd", "(Tensor x, Tensor w, Tensor gy, float alpha) -> (Tensor, Tensor)",
              _bwd_impl, _bwd_impl)
C.register_op(Q, "(Tensor x, Tensor w, float alpha) -> (Tensor, Tensor)", _impl, _impl, _backward, _setup)


def _inputs(grad=True):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 7, generator=g), torch.randn(7, generator=g)
    return x.requires_grad_(grad), w.requires_grad_(grad)


def _grads(run):
    x, w = _inputs()
    y, s = run(x, w)
    dy = torch.linspace(-1, 1, y.numel()).view_as(y)
    return (y, s) + torch.autograd.grad(y, (x, w), dy)


def test_function_matches_the_registered_autograd():
    fn = C._FUNCTIONS[Q]
    ours = _grads(lambda x, w: fn.apply(x, w, 0.5))
    ref = _grads(lambda x, w: torch.ops.cktest.scale_rows(x, w, 0.5))
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    y, s = fn.apply(*_inputs(), 0.5)
    assert y.requires_grad and not s.requires_grad  # the setup's mark_non_differentiable holds


def test_paths(monkeypatch):
    x, w = _inputs(grad=False)
    before = dict(CALLS)
    C.call(Q, x, w, 2.0)  # no gradients: the implementation, directly
    assert CALLS["impl"] == before["impl"] + 1
    used = []
    monkeypatch.setattr(C, "_FUNCTIONS", {Q: type("F", (), {"apply": staticmethod(lambda *a: used.append("fn"))})})
    xg, wg = _inputs()
    C.call(Q, xg, wg, 2.0)  # CPU tensors needing gradients: the registered op (the Function takes CUDA tensors)
    assert used == []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    C.call(Q, xg, wg, 2.0)  # "CUDA" tensors needing gradients: the eager Function
    assert used == ["fn"]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    C.call(Q, xg, wg, 2.0)  # being traced: the registered op
    assert used == ["fn"]


def test_backward_calls_its_op_directly():
    """Inside the backward grad mode is off: the backward op's implementation runs without the dispatcher."""
    before = CALLS["bwd_impl"]
    _grads(lambda x, w: torch.ops.cktest.scale_rows(x, w, 1.5))
    assert CALLS["bwd_impl"] == before + 1


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "softmax", "log_softmax", "cross_entropy", "silu",
                                  "swiglu"])
def test_the_training_ops_have_their_function(name):
    import cute_kernels  # noqa: F401  (registers the ops)

    assert f"cute_kernels::{name}" in C._FUNCTIONS and f"cute_kernels::{name}" in C._IMPLS


def _impl_two(x):
    return x * 2, x.sum(-1)


def _setup_two(ctx, inputs, output):
    pass


SEEN = []


def _backward_two(ctx, g0, g1):
    SEEN.append(g1)
    return g0 * 2


C.register_op("cktest::two_outputs", "(Tensor x) -> (Tensor, Tensor)", _impl_two, _impl_two, _backward_two,
              _setup_two, materialize_grads=False)


def test_unmaterialized_grads_reach_backward_as_none():
    """materialize_grads=False (the attention ops: no dLSE tensor to fill and read when the LSE is unused): the eager
    Function hands the backward None for the output without a gradient, a used output's gradient as it came."""
    x = torch.randn(3, 4, requires_grad=True)
    SEEN.clear()
    a, _ = C._FUNCTIONS["cktest::two_outputs"].apply(x)
    (gx,) = torch.autograd.grad(a.sum(), (x,))
    assert SEEN == [None] and torch.equal(gx, torch.full_like(x, 2.0))
    SEEN.clear()
    a, b = C._FUNCTIONS["cktest::two_outputs"].apply(x)
    torch.autograd.grad(a.sum() + b.sum(), (x,))
    assert SEEN[0] is not None and torch.equal(SEEN[0], torch.ones(3))
