"""Lab: RoPE schedules at 131k tokens (32 / 8 heads, D 128, bf16), NeoX and GPT-J, timed interleaved against a
same-run copy: which GridStride (threads, unroll, grid cap, order) the op should default to."""

import itertools

import torch

import cute_kernels as ck
from cute_kernels import catalog
from cute_kernels.bench import harness as H
from schedules.grid_stride import GridStride

t, hq, hk, d = 131072, 32, 8, 128
q, k = H.randn(t, hq, d, seed=1)[None], H.randn(t, hk, d, seed=2)[None]
qo, ko = torch.empty_like(q), torch.empty_like(k)
cos, sin = ck.rope_tables(131072, d, 500000.0, device="cuda")
pos = torch.arange(t, device="cuda", dtype=torch.int32)[None]
nbytes = 2 * (q.numel() + k.numel()) * 2 + t * d * 4
src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
dst = torch.empty_like(src)
spec = catalog.get("rope.apply")
for inter in (False, True):
    fns = {"copy (same bytes)": lambda: dst.copy_(src)}
    for th, un, cap, order in itertools.product((128, 256), (1, 2, 4), (0, 8), ("cta", "grid")):
        if order == "grid" and cap == 0:
            continue
        sch = GridStride(th, un, cap, order)
        fn = spec.compiled(sch, interleaved=inter, positions="int32")
        c = sch.max_ctas(132)
        cq, ck_ = (2**31 - 1, 2**31 - 1) if cap == 0 else (max(1, c * 4 // 5), max(1, c - c * 4 // 5))
        fns[str(sch)] = (lambda f=fn, a=cq, b=ck_: f(q, k, qo, ko, cos, sin, pos, a, b))
    res = H.do_bench_interleaved(fns, rep_ms=100)
    base = res["copy (same bytes)"]["median_ms"]
    print(f"\n{'GPT-J' if inter else 'NeoX'}: {nbytes / 2**20:.0f} MiB; copy of the same bytes {base * 1e3:.1f} us")
    for name, r in sorted(res.items(), key=lambda kv: kv[1]["median_ms"]):
        ms = r["median_ms"]
        print(f"  {name:24s} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:6.3f} TB/s  {base / ms:6.3f}x copy")
