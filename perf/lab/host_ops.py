"""Host time of one call of each op the Llama layer's prefill uses (the GPU kept busy by a spin queued first, so
no call waits on it), beside torch's own ops at the same shapes: what queueing a forward costs, op by op.

    python3 -m perf.lab.host_ops
"""

from __future__ import annotations

import time

import torch


def host_us(f, n=30):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return sorted(ts)[n // 2]


def main():
    import cute_kernels as ck
    from cute_kernels.rope.ops import rope_tables

    dev = "cuda"
    t, h = 4096, 4096
    x = torch.randn(t, h, device=dev).bfloat16()
    w = torch.randn(6144, h, device=dev).bfloat16()
    nw = torch.randn(h, device=dev).bfloat16()
    qkv = torch.randn(1, t, 48, 128, device=dev).bfloat16()
    q, k, v = qkv[:, :, :32], qkv[:, :, 32:40], qkv[:, :, 40:]
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    cos, sin = rope_tables(8192, 128, 500000.0, device=dev)
    gu = torch.randn(t, 2 * 1024, device=dev).bfloat16()
    small = torch.randn(64, device=dev).bfloat16()
    rows = {
        "ck.gemm 4096x6144x4096": lambda: ck.gemm(x, w.t()),
        "torch.mm same": lambda: torch.mm(x, w.t()),
        "ck.rms_norm": lambda: ck.rms_norm(x, nw, 1e-5),
        "ck.rope (views)": lambda: ck.rope(q, k, cos, sin),
        "ck.flash_attn": lambda: ck.flash_attn(qc, kc, vc, causal=True),
        "ck.swiglu halves": lambda: ck.swiglu(gu[:, :1024], gu[:, 1024:]),
        "ck.add": lambda: ck.add(x, x),
        "torch.add": lambda: torch.add(x, x),
        "ck.add tiny": lambda: ck.add(small, small),
        "torch.empty": lambda: torch.empty(t, h, device=dev, dtype=torch.bfloat16),
    }
    for name, f in rows.items():
        print(f"{name:28s} {host_us(f):8.1f} us", flush=True)
    from cute_kernels.gemm import ops as gops

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.cuda._sleep(100_000_000)
        for _ in range(10):
            gops._gemm_cuda(x, w.t())
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
