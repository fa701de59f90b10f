"""Decode schedules side by side at GQA 32/8, D 128, q_len 1: rows in the WGMMA's M (64-row tiles) against swapped
operands (keys in M, the 4 packed rows in N = 8), for a bf16 cache and FP8 caches (per-head scales contiguous,
per-token scales on pages of 64), tile_n 128 and 64; beside torch.sum over the bf16 bytes. GPU times (CUDA events,
L2 flushed, interleaved rounds); TB/s over the bytes each variant reads.

    python -m perf.decode_swap [B L ...]
"""

from __future__ import annotations

import sys

import torch

from cute_kernels.bench import harness as H


def main(cases):
    from cute_kernels.attention.decode_ops import _flash_attn_with_kvcache_cuda, fp8_scale, to_fp8
    from schedules.decode import DecodeSchedule

    hq, hk, d = 32, 8, 128
    for b, n in cases:
        q = H.randn(b, 1, hq, d, seed=1)
        k, v = H.randn(b, n, hk, d, seed=2), H.randn(b, n, hk, d, seed=3)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        bf_bytes = 2 * b * n * hk * d * 2
        flat = H.randn(bf_bytes // 2, seed=4)
        sh = fp8_scale(torch.maximum(k.float().abs().amax((0, 1, 3)), v.float().abs().amax((0, 1, 3))))
        k8h, v8h = to_fp8(k, sh[None, None, :, None]), to_fp8(v, sh[None, None, :, None])
        page = 64
        pages = b * n // page
        table = torch.randperm(pages, device="cuda").int().view(b, n // page)
        kp = k.view(pages, page, hk, d)[table.flatten().argsort()]  # any pool order: the table maps it
        vp = v.view(pages, page, hk, d)[table.flatten().argsort()]
        skt, svt = fp8_scale(kp.float().abs().amax(-1)), fp8_scale(vp.float().abs().amax(-1))
        k8t, v8t = to_fp8(kp, skt[..., None]), to_fp8(vp, svt[..., None])

        def op(kc, vc, sched, tbl=None, **kw):
            return lambda: _flash_attn_with_kvcache_cuda(q, kc, vc, cache_seqlens=lens, block_table=tbl,
                                                         schedule=sched, **kw)

        m, s8, s8t64 = DecodeSchedule(), DecodeSchedule(swap_rows=8), DecodeSchedule(swap_rows=8, tile_n=64)
        s8f, mf = DecodeSchedule(swap_rows=8, fused_merge=True), DecodeSchedule(fused_merge=True)
        fns = {
            "bf16 rows-in-M": (op(k, v, m), bf_bytes),
            "bf16 swap8": (op(k, v, s8), bf_bytes),
            "fp8 head rows-in-M": (op(k8h, v8h, m, k_scale=sh, v_scale=sh), bf_bytes // 2),
            "fp8 head swap8": (op(k8h, v8h, s8, k_scale=sh, v_scale=sh), bf_bytes // 2),
            "fp8 head swap8 tile64": (op(k8h, v8h, s8t64, k_scale=sh, v_scale=sh), bf_bytes // 2),
            "fp8 head swap8 fused": (op(k8h, v8h, s8f, k_scale=sh, v_scale=sh), bf_bytes // 2),
            "bf16 rows-in-M fused": (op(k, v, mf), bf_bytes),
            "fp8 tok p64 rows-in-M": (op(k8t, v8t, m, table, k_scale=skt, v_scale=svt), bf_bytes // 2),
            "fp8 tok p64 swap8": (op(k8t, v8t, s8, table, k_scale=skt, v_scale=svt), bf_bytes // 2),
            "torch.sum bf16 bytes": (lambda: torch.sum(flat), bf_bytes),
        }
        res = H.do_bench_interleaved({name: f for name, (f, _) in fns.items()})
        print(f"B={b} L={n} (bf16 K+V {bf_bytes / 2**20:.0f} MiB)")
        base = res["bf16 rows-in-M"]["median_ms"]
        for name, r in res.items():
            ms = r["median_ms"]
            print(f"  {name:24s} {ms * 1e3:8.1f} us  {fns[name][1] / ms / 1e9:5.2f} TB/s  {ms / base:5.3f}x bf16")


if __name__ == "__main__":
    argv = [int(x) for x in sys.argv[1:]]
    main(list(zip(argv[::2], argv[1::2])) or [(1, 32768), (1, 131072), (4, 16384), (16, 8192), (64, 4096)])
