"""An example velocity network for flow-matching robot policies: it maps a noisy action chunk (B, 50 actions,
32 dims) and the flow time t to a velocity of the same shape, conditioned on t's sinusoidal embedding. Sized like
the action expert of a small VLA policy: hidden 512, 4 pre-norm SwiGLU blocks of width 1024, bf16 weights.

`ActionFlowNet` runs on our ops (`timestep_embedding`, `gemm` with bias and SiLU, `addmm` with the time conditioning
broadcast over the chunk and with each block's residual, `rms_norm`, `gemm_swiglu`); `TorchActionFlowNet` is the
same network in plain `torch.nn` (the eager baseline of the sampler benchmark), built from the first's weights so
both compute the same function. Per sampler step ours launches `kernels_per_step` kernels (7 + 3 x blocks with the
update), all capturable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ActionFlowNet(nn.Module):
    """v = net(x, t): x (B, actions, action_dim) in any float dtype, t a 0-d or (B,) tensor; v in fp32."""

    def __init__(self, action_dim: int = 32, hidden: int = 512, blocks: int = 4, mlp: int = 1024, time_dim: int = 256,
                 dtype=torch.bfloat16, device="cuda", seed: int = 0):
        super().__init__()
        from cute_kernels.gemm.ops import pack_gate_up

        g = torch.Generator(device="cpu").manual_seed(seed)

        def w(n, k):  # an (n, k) Linear weight, uniform +-1/sqrt(k) like nn.Linear's default
            return ((torch.rand(n, k, generator=g) * 2 - 1) / k**0.5).to(dtype=dtype, device=device)

        def bias(n):
            return ((torch.rand(n, generator=g) * 2 - 1) * 0.1).to(dtype=dtype, device=device)

        self.action_dim, self.hidden, self.time_dim, self.eps = action_dim, hidden, time_dim, 1e-6
        self.w_t1, self.b_t1, self.w_t2, self.b_t2 = w(hidden, time_dim), bias(hidden), w(hidden, hidden), bias(hidden)
        self.w_in = w(hidden, action_dim)
        self.norms = [(1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype=dtype, device=device)
                      for _ in range(blocks + 1)]
        self.w_gate = [w(mlp, hidden) for _ in range(blocks)]
        self.w_up = [w(mlp, hidden) for _ in range(blocks)]
        self.w_down = [w(hidden, mlp) for _ in range(blocks)]
        self.w_out = w(action_dim, hidden)
        # ours reads every weight as the GEMM's (K, N) operand: transposed views, gate / up interleaved
        self._t1, self._t2, self._in, self._out = self.w_t1.t(), self.w_t2.t(), self.w_in.t(), self.w_out.t()
        self._gate_up = [pack_gate_up(a, b).t() for a, b in zip(self.w_gate, self.w_up)]
        self._down = [d.t() for d in self.w_down]
        self.dtype = dtype

    @staticmethod
    def kernels_per_step(blocks: int = 4, cast_input: bool = True) -> int:
        """Kernels of one Euler step: the embedding, the two time-MLP GEMMs, the input's cast (an fp32 state), the
        input projection, three per block (norm, gate / up GEMM with SwiGLU, down GEMM with the residual), the last
        norm and projection, the update."""
        return 1 + 2 + int(cast_input) + 1 + 3 * blocks + 2 + 1

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        import cute_kernels as ck

        b = x.shape[0]
        te = ck.timestep_embedding(t.reshape(-1).expand(b), self.time_dim, dtype=self.dtype)
        c = ck.gemm(ck.gemm(te, self._t1, bias=self.b_t1, activation="silu"), self._t2, bias=self.b_t2)
        h = ck.addmm(c.view(b, 1, self.hidden), x.to(self.dtype), self._in)  # time conditioning over the chunk
        for i in range(len(self._down)):
            a = ck.gemm_swiglu(ck.rms_norm(h, self.norms[i], self.eps), self._gate_up[i])
            h = ck.addmm(h, a, self._down[i])
        return ck.gemm(ck.rms_norm(h, self.norms[-1], self.eps), self._out, out_dtype=torch.float32)


class TorchActionFlowNet(nn.Module):
    """`ActionFlowNet` in plain torch.nn (nn.Linear, F.silu, F.rms_norm), with the same weights."""

    def __init__(self, net: ActionFlowNet):
        super().__init__()

        def linear(wt, b=None):
            m = nn.Linear(wt.shape[1], wt.shape[0], bias=b is not None, dtype=wt.dtype, device=wt.device)
            with torch.no_grad():
                m.weight.copy_(wt)
                if b is not None:
                    m.bias.copy_(b)
            return m

        self.time_dim, self.eps = net.time_dim, net.eps
        self.t1, self.t2 = linear(net.w_t1, net.b_t1), linear(net.w_t2, net.b_t2)
        self.inp = linear(net.w_in)
        self.gate = nn.ModuleList(linear(w) for w in net.w_gate)
        self.up = nn.ModuleList(linear(w) for w in net.w_up)
        self.down = nn.ModuleList(linear(w) for w in net.w_down)
        self.norms = nn.ParameterList(nn.Parameter(n.clone(), requires_grad=False) for n in net.norms)
        self.out = linear(net.w_out)
        self.dtype = net.dtype

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        from cute_kernels.flow.reference import timestep_embedding

        b = x.shape[0]
        te = timestep_embedding(t.reshape(-1).expand(b).float(), self.time_dim).to(self.dtype)
        c = self.t2(F.silu(self.t1(te)))
        h = self.inp(x.to(self.dtype)) + c[:, None, :]
        for i in range(len(self.down)):
            n = F.rms_norm(h, (h.shape[-1],), self.norms[i], self.eps)
            h = h + self.down[i](F.silu(self.gate[i](n)) * self.up[i](n))
        return self.out(F.rms_norm(h, (h.shape[-1],), self.norms[-1], self.eps)).float()
