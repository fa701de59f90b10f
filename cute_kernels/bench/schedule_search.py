"""`cute-kernels schedules gemm --shape M N K` and `cute-kernels schedules attention --shape B S H D
[--causal]`: time the candidate schedules of one shape on the GPU and rank them (lesson 10's
"compare schedules"; the attention's FA2 vs FA3 comparison).

The candidates come from `schedules.gemm.candidates` / `schedules.attention.candidates` (at most ~32
and ~24, pruned by tile/smem/register rules), are compiled ahead in parallel worker processes (disk
cache), then timed with the harness in interleaved rounds, the torch reference among them (CUDA-event
medians, L2 flushed, randn bf16). Prints a ranked
table with TFLOP/s and the ratio to the torch reference (cuBLAS; SDPA) and writes
schedules_<shape>.{md,json,png} when --out is given.
"""

from __future__ import annotations

import json
import os

import torch

from cute_kernels.bench import harness as H


def _rank(title: str, shape_tag: str, shape: list, ref_name: str, t_ref: float, flops: int, timed: list, default,
          out_dir: str | None) -> None:
    """Print the ranked table of (schedule, ms) pairs; with `out_dir` also write .md/.json/.png."""
    rows = sorted(timed, key=lambda r: r[1])
    lines = [f"# {title}", "", str(H.environment()), "", f"{ref_name}: {flops / t_ref / 1e9:.1f} TFLOP/s", "",
             f"| rank | schedule | ms | TFLOP/s | x {ref_name} | default |", "|---|---|---|---|---|---|"]
    for r, (s, t) in enumerate(rows, 1):
        lines.append(f"| {r} | {s} | {t:.4f} | {flops / t / 1e9:.1f} | {t_ref / t:.3f} | {'*' if s == default else ''} |")
    text = "\n".join(lines)
    print(text)
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"schedules_{shape_tag}")
    with open(stem + ".md", "w") as f:
        f.write(text + "\n")
    with open(stem + ".json", "w") as f:
        json.dump({"shape": shape, "ref": ref_name, "ref_ms": t_ref,
                   "rows": [{"schedule": str(s), "ms": t} for s, t in rows]}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from cute_kernels.figures import save_png

        fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.5))
        ax.barh([str(s) for s, _ in rows][::-1], [flops / t / 1e9 for _, t in rows][::-1])
        ax.axvline(flops / t_ref / 1e9, color="k", ls=":", label=ref_name)
        ax.set_xlabel("TFLOP/s")
        ax.tick_params(axis="y", labelsize=7)
        ax.legend()
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        save_png(fig, stem + ".png", dpi=100)
    except ImportError as e:
        H.progress(f"plot skipped: {e}")


def _timed(ref_name: str, ref, cands, call, flops) -> tuple[float, list]:
    """(the reference's time, [(candidate, time)]): every candidate and the reference timed in the same
    interleaved rounds (`H.do_bench_interleaved`), so clock and power drift over the search lands on all alike.
    Timed one after another, a schedule's rank moved with the clock: the d128 causal attention default read 678
    and 627 TFLOP/s in two calls."""
    keys = [f"{i}:{c}" for i, c in enumerate(cands)]  # unique even if two candidates print alike
    fns = {ref_name: ref, **{key: (lambda c=c: call(c)) for key, c in zip(keys, cands)}}
    res = H.do_bench_interleaved(fns, rep_ms=80)
    timed = [(c, res[key]["median_ms"]) for key, c in zip(keys, cands)]
    for i, (c, t) in enumerate(timed):
        H.progress(f"  [{i + 1}/{len(cands)}] {c}: {flops / t / 1e9:.0f} TFLOP/s")
    return res[ref_name]["median_ms"], timed


def _compile_ahead(items, jobs: int | None) -> None:
    from cute_kernels.precompile import precompile

    H.progress(f"compiling {len(items)} candidate schedules ...")
    count, _, secs = precompile(items, jobs or min(16, os.cpu_count() or 1))
    H.progress(f"compiled {count} in {secs:.1f} s")


def search(m: int, n: int, k: int, out_dir: str | None = None, limit: int = 32, jobs: int | None = None) -> int:
    from cute_kernels.gemm import params_for
    from cute_kernels.gemm.ops import _gemm_cuda
    from cute_kernels.precompile import item
    from schedules.gemm import candidates, default_schedule

    cands = candidates(m, n, k, limit)
    _compile_ahead([item("gemm", params_for(s)) for s in cands], jobs)
    a, b = H.randn(m, k, seed=1), H.randn(k, n, seed=2)
    flops = 2 * m * n * k
    t_ref, timed = _timed("cuBLAS", lambda: torch.matmul(a, b), cands, lambda s: _gemm_cuda(a, b, schedule=s), flops)
    _rank(f"GEMM schedules for {m}x{n}x{k} (bf16)", f"{m}x{n}x{k}", [m, n, k], "cuBLAS", t_ref, flops, timed,
          default_schedule(m, n, k), out_dir)
    return 0


def search_attention(b: int, s: int, h: int, d: int, causal: bool = False, out_dir: str | None = None,
                     limit: int = 24, jobs: int | None = None) -> int:
    """FlashAttention forward, (B, S, H, D) bf16 self-attention: fa3 (ping-pong, overlap on/off, K/V
    block, stages, one or two consumer warpgroups) against fa2, ranked, beside torch's SDPA."""
    from cute_kernels.attention import params_for
    from cute_kernels.attention.ops import _flash_attn_cuda
    from cute_kernels.precompile import item
    from schedules.attention import candidates, default_schedule

    cands = candidates(d, causal, limit)
    mask = "causal" if causal else "none"
    _compile_ahead([item("flash_attn", params_for(c, head_dim=d, mask=mask))
                    for c in cands], jobs)
    q, k, v = (H.randn(b, s, h, d, seed=i) for i in range(3))
    flops = 4 * b * h * s * s * d // (2 if causal else 1)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2), is_causal=causal)

    t_ref, timed = _timed("SDPA", sdpa, cands, lambda c: _flash_attn_cuda(q, k, v, causal, schedule=c), flops)
    tag = f"attention_{b}x{s}x{h}x{d}" + ("_causal" if causal else "")
    _rank(f"FlashAttention schedules for B={b} S={s} H={h} D={d}{' causal' if causal else ''} (bf16)", tag,
          [b, s, h, d, causal], "SDPA", t_ref, flops, timed, default_schedule(d, causal), out_dir)
    return 0


def search_attention_fp8(b: int, s: int, h: int, d: int, causal: bool = False, out_dir: str | None = None,
                         limit: int = 24, jobs: int | None = None) -> int:
    """The FP8 forward (`flash_attn_fp8`, block scales from `quantize_attention_fp8` of bf16 randn inputs): its
    configs (`schedules.attention.fp8_candidates`: lazy rescale, K/V block, stages, exp2 on the FMA pipe) ranked
    beside our bf16 forward on the same inputs, TFLOP/s counted as the bf16 forward's."""
    import cute_kernels as ck
    from cute_kernels.attention.fp8_ops import _flash_attn_fp8_cuda
    from cute_kernels.precompile import item
    from schedules.attention import fp8_candidates

    cands = fp8_candidates(d, limit)
    base = {"head_dim": d, "out_dtype": "bf16", "mask": "causal" if causal else "none", "softcap": False,
            "scales": "block"}
    _compile_ahead([item("flash_attn_fp8", {**base, **c}) for c in cands], jobs)
    q, k, v = (H.randn(b, s, h, d, seed=i) for i in range(3))
    args = ck.quantize_attention_fp8(q, k, v, "block")
    flops = 4 * b * h * s * s * d // (2 if causal else 1)
    t_ref, timed = _timed("ours bf16", lambda: ck.flash_attn(q, k, v, causal=causal), cands,
                          lambda c: _flash_attn_fp8_cuda(*args, causal=causal, config=c), flops)
    tag = f"attention_fp8_{b}x{s}x{h}x{d}" + ("_causal" if causal else "")
    _rank(f"FP8 FlashAttention configs for B={b} S={s} H={h} D={d}{' causal' if causal else ''} (e4m3, block "
          "scales)", tag, [b, s, h, d, causal], "ours bf16", t_ref, flops, timed, cands[0], out_dir)
    return 0


def search_attention_bwd(b: int, s: int, h: int, d: int, causal: bool = False, out_dir: str | None = None,
                         limit: int = 24, jobs: int | None = None) -> int:
    """FlashAttention backward, (B, S, H, D) bf16 self-attention: the `schedules.attention_bwd.candidates_bwd` (tiles,
    stages, the dQ split, the dK / dV split), ranked, beside cuDNN's backward (SDPA), the backward op called on one
    forward's O and LSE."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cute_kernels as ck
    from cute_kernels.attention import FLASH_ATTN_BWD
    from cute_kernels.attention.ops import _flash_attn_bwd_cuda
    from cute_kernels.precompile import item
    from schedules.attention_bwd import candidates_bwd, default_bwd_schedule

    cands = candidates_bwd(d, causal)[:limit]
    mask = "causal" if causal else "none"
    _compile_ahead([item("flash_attn_bwd", {**FLASH_ATTN_BWD.config_of(c), "head_dim": d, "mask": mask})
                    for c in cands], jobs)
    q, k, v = (H.randn(b, s, h, d, seed=i).requires_grad_() for i in range(3))
    do = H.randn(b, s, h, d, seed=7)
    out, lse = ck.flash_attn(q, k, v, causal=causal, return_lse=True)
    flops = 10 * b * h * s * s * d // (2 if causal else 1)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref_out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                   v.transpose(1, 2), is_causal=causal)
    ref_do = do.transpose(1, 2)

    def cudnn():
        return torch.autograd.grad(ref_out, (q, k, v), ref_do, retain_graph=True)

    t_ref, timed = _timed("SDPA cuDNN", cudnn, cands,
                          lambda c: _flash_attn_bwd_cuda(do, q, k, v, out, lse, None, causal, schedule=c), flops)
    tag = f"attention_bwd_{b}x{s}x{h}x{d}" + ("_causal" if causal else "")
    _rank(f"FlashAttention backward schedules for B={b} S={s} H={h} D={d}{' causal' if causal else ''} (bf16)", tag,
          [b, s, h, d, causal], "SDPA cuDNN", t_ref, flops, timed, default_bwd_schedule(d, causal), out_dir)
    return 0


def search_decode(b: int, n: int, hq: int, hk: int, d: int, q_len: int = 1, page: int = 0, out_dir: str | None = None,
                  limit: int = 24) -> int:
    """Decode attention, every sequence at length n (bf16, contiguous or pages of `page`): the `decode_candidates`
    (tile width, stages, split granularity) at the split the model picks for each, and the default schedule at
    forced splits 1 to 64, beside cuDNN SDPA, ranked by the bytes read per second."""
    import json

    from cute_kernels.attention.decode_ops import _flash_attn_with_kvcache_cuda
    from schedules.decode import choose_splits, decode_candidates, default_decode_schedule

    q = H.randn(b, q_len, hq, d, seed=1)
    k, v = H.randn(b, n, hk, d, seed=2), H.randn(b, n, hk, d, seed=3)
    table = None
    if page:
        table = torch.arange(b * (n // page), dtype=torch.int32, device="cuda").view(b, -1)
        k, v = k.view(-1, page, hk, d), v.view(-1, page, hk, d)
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    base = default_decode_schedule(d)
    cands = [(s, choose_splits(b, hk, n, q_len, hq // hk, s)) for s in decode_candidates(d)]
    cands += [(base, sp) for sp in (1, 2, 4, 8, 16, 32, 64)]
    cands = cands[:limit]
    nbytes = 2 * b * n * hk * d * 2

    def run(c):
        s, sp = c
        return _flash_attn_with_kvcache_cuda(q, k, v, cache_seqlens=lens, block_table=table, num_splits=sp,
                                             schedule=s)

    for c in cands:
        run(c)
    fns = {f"{i}": (lambda c=c: run(c)) for i, c in enumerate(cands)}
    if not page:
        def cudnn():
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)

        fns["SDPA"] = cudnn
    res = H.do_bench_interleaved(fns, rep_ms=80)
    timed = sorted(((c, res[f"{i}"]["median_ms"]) for i, c in enumerate(cands)), key=lambda x: x[1])
    model = (base, choose_splits(b, hk, n, q_len, hq // hk, base))
    print(f"decode schedules for B={b} L={n} H_q={hq} H_kv={hk} D={d} q_len={q_len}"
          f"{f' pages of {page}' if page else ''} (bf16, K+V {nbytes / 2**20:.0f} MiB)")
    if "SDPA" in res:
        print(f"  SDPA cuDNN: {res['SDPA']['median_ms'] * 1e3:.1f} us, {nbytes / res['SDPA']['median_ms'] / 1e9:.2f} TB/s")
    for c, t in timed:
        mark = "  (default)" if c == model else ""
        print(f"  {t * 1e3:8.1f} us  {nbytes / t / 1e9:5.2f} TB/s  splits={c[1]:<3d} {c[0]}{mark}")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"decode_{b}x{n}x{hq}x{hk}x{d}x{q_len}_p{page}.json"), "w") as f:
            json.dump([{"schedule": str(c[0]), "splits": c[1], "ms": t} for c, t in timed], f, indent=1)
    return 0
