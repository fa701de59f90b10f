"""One FlashAttention backward shape, run a few times (for ncu / compute-sanitizer): B S H D [causal] [det]."""

import sys

import torch

import cute_kernels as ck

b, s, h, d = (int(x) for x in sys.argv[1:5])
causal = "causal" in sys.argv[5:]
det = "det" in sys.argv[5:]
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
out = ck.flash_attn(q, k, v, causal=causal, deterministic=det)
do = torch.randn_like(out)
for _ in range(3):
    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
print("ok")
