"""One FlashAttention backward shape, run a few times (for ncu / compute-sanitizer): B S H D [causal] [det] [prof].
`prof`: each kernel's mean GPU time over 10 backward calls (torch.profiler), ours and FA4's."""

import sys

import torch

import cute_kernels as ck

b, s, h, d = (int(x) for x in sys.argv[1:5])
causal = "causal" in sys.argv[5:]
det = "det" in sys.argv[5:]
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
do = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
graphs = {"ours": ck.flash_attn(q, k, v, causal=causal, deterministic=det)}
if "prof" in sys.argv[5:]:
    try:
        from flash_attn.cute.interface import flash_attn_func

        o = flash_attn_func(q, k, v, causal=causal, deterministic=det)
        graphs["FA4"] = o[0] if isinstance(o, tuple) else o
    except ImportError:
        pass
for out in graphs.values():
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
if "prof" in sys.argv[5:]:
    from torch.profiler import ProfilerActivity, profile

    for name, out in graphs.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / 10, e.count // 10) for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(t for _, t, _ in rows)
        print(f"{name}: {total:.1f} us per backward")
        for key, t, n in sorted(rows, key=lambda r: -r[1]):
            print(f"  {t:9.1f} us  x{n}  {key[:110]}")
print("ok")
