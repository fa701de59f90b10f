"""Decode at batch 1: the whole op at forced split counts, and at the model's split its two kernels apart (the split
kernel writing the fp32 partials, the merge), beside torch.sum over the same bytes; GPU times (CUDA events, L2
flushed, interleaved rounds).

    python -m perf.decode_split [B L ...]
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from cute_kernels.bench import harness as H


def main(cases):
    import cute_kernels as ck
    from cute_kernels.attention import mask_name
    from cute_kernels.attention.decode_ops import (
        _decode_compiled,
        _flash_attn_with_kvcache_cuda,
        _merge_compiled,
        _no_scale,
        _no_table,
    )
    from cute_kernels.attention.ops import _kernel_view, _scalars
    from schedules.decode import choose_splits, default_decode_schedule

    hq, hk, d = 32, 8, 128
    for b, n in cases:
        q = H.randn(b, 1, hq, d, seed=1)
        k, v = H.randn(b, n, hk, d, seed=2), H.randn(b, n, hk, d, seed=3)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        nbytes = 2 * b * n * hk * d * 2
        flat = H.randn(nbytes // 2, seed=4)
        sched = default_decode_schedule(d)
        model = choose_splits(b, hk, n, 1, hq // hk, sched)
        fns = {f"op splits={s}": (lambda s=s: ck.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, num_splits=s))
               for s in sorted({1, 4, 8, 12, 16, 24, 32, 48, 64, model})}
        two = dataclasses.replace(sched, fused_merge=False)
        fused = dataclasses.replace(sched, fused_merge=True)
        fns[f"op splits={model} fused merge"] = lambda: _flash_attn_with_kvcache_cuda(q, k, v, cache_seqlens=lens,
                                                                                       schedule=fused)
        fns[f"op splits={model} merge kernel"] = lambda: _flash_attn_with_kvcache_cuda(q, k, v, cache_seqlens=lens,
                                                                                        schedule=two)
        fns["torch.sum same bytes"] = lambda: torch.sum(flat)
        if model > 1:
            fn = _decode_compiled(q.dtype, d, 0, mask_name(-1, -1), False, True, two)
            o_part = torch.empty(model, b, 1, hq, d, dtype=torch.float32, device="cuda")
            l_part = torch.empty(model, b, hq, 1, dtype=torch.float32, device="cuda")
            out = torch.empty(b, 1, hq, d, dtype=q.dtype, device="cuda")
            lse = torch.empty(b, hq, 1, dtype=torch.float32, device="cuda")
            kv, vv, tb = _kernel_view(k), _kernel_view(v, True), _no_table(q.device)
            args = (*_scalars(d, None, 0.0), -1, -1)
            merge = _merge_compiled(torch.float32, q.dtype, d, model, b * hq)
            one = _no_scale(q.device)
            fns["split kernel only"] = lambda: fn(q, kv, vv, o_part, l_part, out, lse, tb[None], lens, tb, one, one, 0,
                                                  model, *args)
            fns["merge only"] = lambda: merge(o_part, l_part, out, lse)
        res = H.do_bench_interleaved(fns)
        print(f"B={b} L={n} (K+V {nbytes / 2**20:.0f} MiB; model: {model} splits)")
        for name, r in res.items():
            ms = r["median_ms"]
            print(f"  {name:24s} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:5.2f} TB/s")


if __name__ == "__main__":
    argv = [int(x) for x in sys.argv[1:]]
    main(list(zip(argv[::2], argv[1::2])) or [(1, 4096), (1, 32768), (1, 131072), (4, 16384)])
