"""GEMM benchmark suite (lesson 10): bf16 randn, ours (default schedule, and each schedule kind)
beside cuBLAS (torch.matmul) and QuACK's gemm, TFLOP/s and ratios; the issue's shape table.
Split-K: for M <= 256 "ours split-K" times the best-modelled split candidate, and where the default
splits, "ours no split-K" times the same tile unsplit (the default schedule table says which)."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from cute_kernels.bench import harness as H

PEAK_BF16_TFLOPS = 989.4  # H100/H200 SXM dense bf16, by spec: the ladder's tensor-core ceiling

SHAPES = [
    (8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048),
    (4096, 14336, 4096), (4096, 4096, 14336), (4096, 2112, 7168), (4096, 24576, 1536), (4096, 7168, 16384),
    (16384, 8192, 1024),
    (128, 7168, 2048), (64, 4096, 4096),
]
QUICK = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 2112, 7168), (128, 7168, 2048)]
# `gemm_small`: decode-sized M, where the small-grid defaults (`schedules.gemm.narrowed` / `deepened`) decide
# (16 and 8 rows: decode batches, where `GemmSchedule.a_rows` keeps A's box inside M)
SMALL_M = [(64, 4096, 4096), (64, 2048, 4096), (64, 4096, 1024), (128, 2112, 4096), (32, 4096, 4096),
           (64, 8192, 8192), (64, 7168, 2048), (128, 7168, 2048), (16, 4096, 4096), (8, 7168, 2048)]
# Pipeline options of the default schedule (`schedules.gemm.pipeline_variants`; docs/kernels/gemm.md, "How it got
# here", the pipeline options table), timed beside it where they apply, each checked bitwise against "ours".
OPTIONS = ["ours c2x2", "ours wg_epilogue", "ours c2x2 wg_epilogue", "ours 5 stages", "ours pingpong 128x192"]


def gemm(shapes=None, quick=False, ceilings=None, schedules=("cooperative", "pingpong"), with_ladder=True):
    from quack.gemm_interface import gemm as quack_gemm  # imported here: it patches CuTe classes

    import cute_kernels as ck
    from cute_kernels.gemm.ops import _gemm_cuda
    from schedules.gemm import GemmSchedule, candidates, deepened, default_schedule, pipeline_variants

    peak = H.compute_ceiling("bf16")  # the rows' "% ceiling": torch.matmul at 8192^3 in this run

    shapes = shapes or (QUICK if quick else SHAPES)
    rows, notes = [], []
    options = list(OPTIONS)
    for m, n, k in shapes:
        a, b = H.randn(m, k, seed=1), H.randn(k, n, seed=2)
        flops = 2 * m * n * k
        nbytes = (m * k + k * n + m * n) * 2
        H.progress(f"  gemm {m}x{n}x{k}")
        # every column timed in the same interleaved rounds (H.do_bench_interleaved): no column
        # gets the clock drift of a separate run
        fns = {"ours": lambda: ck.gemm(a, b), "cuBLAS": lambda: torch.matmul(a, b),
               "QuACK": lambda: quack_gemm(a, b)}
        for kind in schedules:
            fns[f"ours {kind}"] = functools.partial(_gemm_cuda, a, b, schedule=default_schedule(m, n, k, kind))
        d = default_schedule(m, n, k)
        if d.split_k > 1:
            fns["ours no split-K"] = functools.partial(_gemm_cuda, a, b, schedule=dataclasses.replace(d, split_k=1))
        same = ""

        def option(col, sched):  # an experiment column (its "faster than ours" check decides a default)
            if col not in options:
                options.append(col)
            fns[col] = functools.partial(_gemm_cuda, a, b, schedule=sched)

        split = d if d.split_k > 1 else next((c for c in candidates(m, n, k) if c.split_k > 1), None)
        if split is not None and m <= 256:
            fns["ours split-K"] = functools.partial(_gemm_cuda, a, b, schedule=split)
            # the same split in one launch: the last split of each tile sums the partials (`split_fixup`)
            fix = dataclasses.replace(split, split_fixup=True)
            fns["ours split-K fixup"] = functools.partial(_gemm_cuda, a, b, schedule=fix)
            eq = torch.equal(fns["ours split-K fixup"](), fns["ours split-K"]())
            same += f"; split-K fixup bitwise {'=' if eq else '!='} split-K"
        if m < 64:
            # A padded to a whole 64-row tile (randn rows, not zeros: zero data runs at higher clocks; the padding copy
            # made once, outside the timing): is M = 32
            # slower than M = 64 over the same bytes (20.7 vs 15.3 us; cuBLAS 16.5 vs 14.8) because
            # each A box is half out of bounds?
            a_pad = H.randn(64, k, seed=5)
            a_pad[:m] = a
            col = "ours A padded to 64 rows (M < 64)"
            if col not in options:
                options.append(col)
            fns[col] = functools.partial(_gemm_cuda, a_pad, b)
            same += f"; padded A bitwise {'=' if torch.equal(_gemm_cuda(a_pad, b)[:m], ck.gemm(a, b)) else '!='} ours"
            # A's TMA box cut to the M rows (`GemmSchedule.a_rows`; the default at M <= 32,
            # `schedules.gemm.shortened`): against the whole box, and the default's tile at the other width
            if d.a_rows:
                option("ours whole A box (M <= 32)", dataclasses.replace(d, a_rows=0))
                other = deepened(dataclasses.replace(d, tile_n=96 - d.tile_n, stages=0), m, n)
                option(f"ours 64x{other.tile_n} short A box (M <= 32)", other)
                eq = torch.equal(fns["ours whole A box (M <= 32)"](), ck.gemm(a, b))
                same += f"; whole A box bitwise {'=' if eq else '!='} ours"
        if m <= 256 and d.tile_m == 64 and d.tile_n == 32 and d.split_k == 1 and not d.a_rows:
            # the narrowed default (`schedules.gemm.narrowed`) against the 64x64 tile it replaced (with
            # that tile's deep ring) and against its own automatic depth
            option("ours 64x64 deep ring (small M)", deepened(dataclasses.replace(d, tile_n=64, stages=0), m, n))
            if d.stages:
                option("ours 64x32 8 stages (small M)", dataclasses.replace(d, stages=0))
            option("ours 64x32 k-interleave (small M)", dataclasses.replace(d, k_interleave=True))
        if m <= 256 and d.tile_m == 64 and d.tile_n == 64 and not d.a_rows:
            # a 64x32 tile on a grid 64x64 leaves below a wave (64x4096x4096: 64 tiles -> 128; the FP8 GEMM's
            # narrowing measured 1.09-1.18x on such grids)
            unsplit = dataclasses.replace(d, split_k=1, split_fixup=False)
            option("ours 64x32 (small M)", dataclasses.replace(unsplit, tile_n=32, stages=0))
            # the default's deep A/B ring (`schedules.gemm.deepened`: 12 stages of 64x64 1.06x the 8 of
            # `num_stages`) against the automatic depth, and on the 64x32 tile (16 stages of 12 KiB fit)
            if unsplit.stages:
                option("ours 8 stages (small M)", dataclasses.replace(unsplit, stages=0))
                same += f"; deep ring: {unsplit.stages} stages"
            narrow = deepened(dataclasses.replace(unsplit, tile_n=32, stages=0), m, n)
            if narrow.stages:
                option("ours 64x32 deep ring (small M)", narrow)
            # both ping-pong warpgroups on each tile, every other K-block (`k_interleave`): the other
            # warpgroup idles at one tile a CTA (PC sampling here: 61 % of samples waiting on the full barrier)
            option("ours k-interleave (small M)", dataclasses.replace(unsplit, k_interleave=True))
        if m >= 1024:  # ping-pong with QuACK's 128x192 tile (192 accumulators a thread; in the model too)
            pp192 = GemmSchedule(kind="pingpong", tile_m=128, tile_n=192, cluster_m=2)
            fns["ours pingpong 128x192"] = functools.partial(_gemm_cuda, a, b, schedule=pp192)
        if m >= 1024:  # the options where the square shapes' 740 and the weak shapes are decided
            out = ck.gemm(a, b)
            for name, sched in pipeline_variants(d, m, n).items():
                col = f"ours {name}"
                option(col, sched)
                same += f"; {col} bitwise {'=' if torch.equal(fns[col](), out) else '!='} ours"
        refs = {c: r["median_ms"] for c, r in H.do_bench_interleaved(fns).items()}
        t = refs.pop("ours")
        rows.append(H.Row("gemm", "bfloat16", f"{m}x{n}x{k}", nbytes, flops, t, refs, "tflops", peak.tflops,
                          note=str(default_schedule(m, n, k)) + same))
        notes.append(f"| {m}x{n}x{k} | {default_schedule(m, n, k)} |")
    geo = math.exp(sum(math.log(r.ratio("cuBLAS")) for r in rows) / len(rows))
    worst = min(rows, key=lambda r: r.ratio("cuBLAS"))
    worst_q = min(rows, key=lambda r: r.ratio("QuACK"))
    big = [r for r in rows if r.shape == "8192x8192x8192"]
    checks = [
        {"target": "geomean >= 1.05x cuBLAS", "measured": f"{geo:.3f}x", "ok": geo >= 1.05},
        {"target": "no shape below 0.95x cuBLAS", "measured": f"min {worst.ratio('cuBLAS'):.3f}x ({worst.shape})",
         "ok": worst.ratio("cuBLAS") >= 0.95},
        {"target": ">= 1.0x QuACK per shape", "measured": f"min {worst_q.ratio('QuACK'):.3f}x ({worst_q.shape})",
         "ok": worst_q.ratio("QuACK") >= 1.0},
    ]
    if big:
        checks.append({"target": ">= 740 TFLOP/s at 8192^3", "measured": f"{big[0].ours_tbs:.0f} TFLOP/s",
                       "ok": big[0].ours_tbs >= 740})
    for col in options:  # the experiment columns: does the option beat the default where it applies?
        geo, with_col = H.option_speedup(rows, col)
        if with_col:
            best = max(with_col, key=lambda r: 1 / r.ratio(col))
            checks.append({"target": f"{col} faster than ours (geomean of {len(with_col)}; decides the default)",
                           "measured": f"{geo:.3f}x (best {1 / best.ratio(col):.3f}x at {best.shape})",
                           "ok": geo > 1.0})
    extra = peak.line() + "\n\n## Default schedule per shape\n\n| shape | schedule |\n|---|---|\n" + "\n".join(notes)
    if with_ladder:
        extra += "\n\n" + ladder()
    cols = (["cuBLAS", "QuACK"] + [f"ours {k}" for k in schedules] + ["ours split-K", "ours split-K fixup", "ours no split-K"]
            + options)
    return rows, cols, checks, extra, peak.meta()


FMA_TFLOPS = 132 * 128 * 2 * 1.98e9 / 1e12  # fp32 FMA on the CUDA cores (~67 TFLOP/s)


def ladder(m: int = 4096, n: int = 4096, k: int = 4096) -> str:
    """Lesson 10's roofline steps on one shape: SIMT shared-memory tiled -> register tiled (CUDA
    cores) -> WGMMA (tensor cores), each against its own ceiling, beside cuBLAS."""
    import cute_kernels as ck
    from cute_kernels.gemm.ops import gemm_ladder

    a, b = H.randn(m, k, seed=1), H.randn(k, n, seed=2)
    flops = 2 * m * n * k
    steps = [("SIMT, shared-memory tiled (1 output/thread)", lambda: gemm_ladder(a, b, "smem"), FMA_TFLOPS),
             ("SIMT, register tiled (8x8 outputs/thread)", lambda: gemm_ladder(a, b, "register"), FMA_TFLOPS),
             ("WGMMA, TMA pipeline, warp-specialized", lambda: ck.gemm(a, b), PEAK_BF16_TFLOPS),
             ("cuBLAS (torch.matmul)", lambda: torch.matmul(a, b), PEAK_BF16_TFLOPS)]
    lines = [f"## The ladder at {m}x{n}x{k} (bf16 in, fp32 accumulation)", "",
             "| rung | ms | TFLOP/s | ceiling TFLOP/s | % of its ceiling |", "|---|---|---|---|---|"]
    for name, f, ceil in steps:
        H.progress(f"  ladder: {name}")
        t = H.do_bench(f, rep_ms=100)["median_ms"]
        tf = flops / t / 1e9
        lines.append(f"| {name} | {t:.3f} | {tf:.1f} | {ceil:.0f} | {100 * tf / ceil:.1f} |")
    return "\n".join(lines)


def _gemm(**kw):
    return gemm(**{k: v for k, v in kw.items() if k != "ceilings"})


def _gemm_small(**kw):
    kw = {k: v for k, v in kw.items() if k not in ("ceilings", "quick")}
    return gemm(**{"shapes": SMALL_M, **{k: v for k, v in kw.items() if v}}, with_ladder=False)


SUITES = {"gemm": _gemm, "gemm_small": _gemm_small}  # gemm_small: decode-sized M, the small-grid defaults
PEERS = {"gemm": ("quack",), "gemm_small": ("quack",)}
