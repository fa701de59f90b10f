"""GPU: the backward as PyTorch sees it: `torch.library.opcheck` of the forward op (its autograd, both outputs used,
and the fake impls under aot dispatch) and of the backward ops; a training step of a small transformer block under
`torch.compile(fullgraph=True)` against the same block on SDPA; the backward captured in a CUDA graph and replayed."""

import math

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def test_opcheck_forward_with_gradients():
    q = randn(2, 130, 4, 64).requires_grad_()
    k = randn(2, 130, 2, 64).requires_grad_()
    v = randn(2, 130, 2, 64).requires_grad_()
    torch.library.opcheck(torch.ops.cute_kernels.flash_attn.default, (q, k, v, True, -1, -1, None, 0.0, False))


def test_opcheck_varlen_with_gradients():
    cu = torch.tensor([0, 50, 50, 177], dtype=torch.int32, device="cuda")
    q = randn(177, 4, 128).requires_grad_()
    k = randn(177, 4, 128).requires_grad_()
    v = randn(177, 4, 128).requires_grad_()
    torch.library.opcheck(torch.ops.cute_kernels.flash_attn_varlen.default,
                          (q, k, v, cu, cu, 127, 127, False, -1, -1, None, 0.0, False))


def test_opcheck_backward_ops():
    q, k, v = (randn(1, 100, 2, 128) for _ in range(3))
    out, lse = ck.flash_attn(q, k, v, return_lse=True)
    do = randn(1, 100, 2, 128)
    torch.library.opcheck(torch.ops.cute_kernels.flash_attn_bwd.default,
                          (do, q, k, v, out, lse, None, False, -1, -1, None, 0.0, False))


class Block(torch.nn.Module):
    """Pre-norm attention + MLP block; `attn` is ck.flash_attn or SDPA (the reference)."""

    def __init__(self, dim=256, heads=4, use_ck=True):
        super().__init__()
        self.heads, self.use_ck = heads, use_ck
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, c // self.heads).unbind(2)
        if self.use_ck:
            a = ck.flash_attn(q, k, v, causal=True)
        else:
            a = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2), is_causal=True).transpose(1, 2)
        x = x + self.proj(a.reshape(b, s, c))
        return x + self.mlp(self.norm2(x))


def test_compiled_training_step_matches_sdpa():
    torch.manual_seed(0)
    ours = Block().cuda().to(torch.bfloat16)
    ref = Block(use_ck=False).cuda().to(torch.bfloat16)
    ref.load_state_dict(ours.state_dict())
    step = torch.compile(lambda m, x: m(x).float().square().mean(), fullgraph=True)
    x = randn(2, 300, 256)
    for model in (ours, ref):
        loss = step(model, x) if model is ours else model(x).float().square().mean()
        loss.backward()
    for (name, p), (_, r) in zip(ours.named_parameters(), ref.named_parameters()):
        err = (p.grad.float() - r.grad.float()).abs().max().item()
        scale = r.grad.float().abs().max().item()
        assert math.isfinite(err) and err <= 0.05 * scale + 1e-3, (name, err, scale)


def test_backward_in_cuda_graph():
    q, k, v = (randn(2, 257, 4, 128).requires_grad_() for _ in range(3))
    do = randn(2, 257, 4, 128)

    def run():
        out = ck.flash_attn(q, k, v, causal=True)
        return torch.autograd.grad(out, (q, k, v), do)

    eager = run()  # compiles the kernels outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b) or (a.float() - b.float()).abs().max().item() < 1e-2
