"""Benchmark suites for lessons 3, 8, 9, 11, 12: gemv, transpose, swiglu, argmax.

Same conventions as `perf.suites`: ours vs torch eager vs torch.compile, TB/s over the bytes each op
must move, % of the ceiling measured in the same run, ratios (> 1: ours faster). QuACK (0.6.5) has
none of these as a standalone op (its SwiGLU lives in GEMM epilogues), so there is no peer column.
"""

from __future__ import annotations

import torch

from perf import harness as H

MiB = 1 << 20


def _name(dt):
    return str(dt).replace("torch.", "")


def _worst(rows, pred=lambda r: True):
    sel = [r for r in rows if pred(r)]
    return min(sel, key=lambda r: r.pct_ceiling) if sel else None


# ----------------------------------------------------------------------------------------------
# Lesson 3: GEMV (bytes counted: W only, as the target says; x and y are < 0.1% of them)
# ----------------------------------------------------------------------------------------------
GEMV_MMA = "ours tensor cores"  # kernels.gemv_mma where the op's default is the FMA kernel
GEMV_FMA = "ours FMA kernel"  # kernels.gemv where the default is the tensor-core one


def gemv(shapes=None, dtypes=(torch.bfloat16,), quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.ops.gemv import _gemv_cuda
    from schedules.gemv import use_tensor_cores
    from schedules.hardware import num_sms

    shapes = shapes or ([(4096, 4096), (16384, 16384)] if quick else
                        [(4096, 4096), (8192, 8192), (16384, 16384), (14336, 4096), (4096, 14336), (1024, 16384)])
    cols = (1, 8) if quick else (1, 2, 4, 8)
    copy_bw = ceilings["copy"]
    compiled = H.compiled(lambda w, x: w @ x)
    rows = []
    for dt in dtypes:
        for n, k in shapes:
            w = H.randn(n, k, dtype=dt, seed=11)
            for b in cols:
                x = H.randn(b, k, dtype=dt, seed=12).t()  # (K, B) with contiguous columns
                H.progress(f"  gemv {_name(dt)} {n}x{k} B={b}")
                t = H.do_bench(lambda: ck.gemv(w, x))["median_ms"]
                refs = {"torch": H.do_bench(lambda: w @ x)["median_ms"],
                        "torch.compile": H.do_bench(lambda: compiled(w, x))["median_ms"]}
                # the other kernel of the op at this B (decides `schedules.gemv.MMA_MIN_COLS`)
                alt = GEMV_FMA if use_tensor_cores(n, b, num_sms()) else GEMV_MMA
                refs[alt] = H.do_bench(lambda: _gemv_cuda(w, x, tensor_cores=alt == GEMV_MMA))["median_ms"]
                rows.append(H.Row("gemv", _name(dt), f"{n}x{k} B={b}", w.numel() * w.element_size(),
                                  2 * n * k * b, t, refs, "copy", copy_bw))
    checks = []
    square = _worst(rows, lambda r: r.shape.split(" ")[0] in ("4096x4096", "8192x8192", "16384x16384"))
    if square:
        checks.append({"target": ">= 90% of copy bandwidth (bytes of W), W 4096-16384 square",
                       "measured": f"min {square.pct_ceiling:.1f}% ({square.dtype} {square.shape})",
                       "ok": square.pct_ceiling >= 90.0})
    for alt in (GEMV_MMA, GEMV_FMA):
        geo, sel = H.option_speedup(rows, alt)
        if sel:
            checks.append({"target": f"{alt} faster than ours (geomean of {len(sel)}; decides use_tensor_cores)",
                           "measured": f"{geo:.3f}x", "ok": geo > 1.0})
    extra = ""
    if square:  # context for the 4096^2 rows: what a copy of W's bytes reaches at that size
        sel = [r for r in rows if r.shape.endswith("B=1")]
        extra = "## B = 1 beside a copy of the same bytes (W)\n\n" + H.same_bytes_copy(sel, lambda r: r.bytes, copy_bw)
    return rows, ["torch", "torch.compile", GEMV_MMA, GEMV_FMA], checks, extra, {}


# ----------------------------------------------------------------------------------------------
# Lessons 8-9: transpose, all four variants side by side, and the tile orders compared
# ----------------------------------------------------------------------------------------------
TRANSPOSE_VARIANTS = ("naive", "smem", "swizzle", "tma")
# tile orders (schedules/tile_order.py) against the default (grouped, 32 tile-rows): "row" is the
# plain 2-D grid the kernels used before; each runs in the same interleaved rounds as the defaults
TRANSPOSE_ORDERS = {
    "row": {"order": "row"}, "diagonal": {"order": "diagonal"},
    "g8": {"order": "grouped", "group": 8}, "g64": {"order": "grouped", "group": 64},
    # a CTA per 2 x 2 block of tiles (session 13: fp32 16384^2 ran 86 % of copy, 0.87x torch.compile, on
    # one 32 x 32 tile a CTA with 128-byte row runs; the block makes them 256 bytes on both sides)
    "sub2": {"sub": 2}, "sub1": {"sub": 1},  # sub1: one tile a CTA (the default below ~100 MiB a matrix)
    # persistent CTAs, the next block's TMA load under this one's transpose and stores (session 13 desk;
    # the swizzle column of this entry is skipped: TMA only)
    "persistent": {"persistent": True},
}
TRANSPOSE_ORDER_VARIANTS = ("swizzle", "tma")


def transpose(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    from cute_kernels.ops.transpose import _transpose_cuda

    shapes = shapes or ([(8192, 8192), (16, 2048, 2048)] if quick else
                        [(4096, 4096), (8192, 8192), (16384, 16384), (4096, 16384), (8000, 8000), (32, 2048, 2048),
                         (256, 512, 512)])
    copy_bw = ceilings["copy"]
    compiled = H.compiled(lambda x: x.transpose(-2, -1).contiguous())
    rows = []
    for dt in dtypes:
        for shape in shapes:
            x = H.randn(*shape, dtype=dt, seed=13)
            nbytes = 2 * x.numel() * x.element_size()
            fns = {"torch": lambda: x.transpose(-2, -1).contiguous(), "torch.compile": lambda: compiled(x)}
            for v in TRANSPOSE_VARIANTS:
                fns[f"transpose.{v}"] = lambda v=v: _transpose_cuda(x, v)
            for label, cfg in TRANSPOSE_ORDERS.items():
                for v in TRANSPOSE_ORDER_VARIANTS:
                    if "persistent" in cfg and v != "tma":
                        continue
                    fns[f"transpose.{v}[{label}]"] = lambda v=v, cfg=cfg: _transpose_cuda(x, v, cfg)
            H.progress(f"  transpose {_name(dt)} {shape}: {len(fns)} columns interleaved")
            times = {k: r["median_ms"] for k, r in H.do_bench_interleaved(fns).items()}
            refs = {k: times.pop(k) for k in ("torch", "torch.compile")}
            for case, t in times.items():
                order = case.partition("[")[2].rstrip("]") or "g32 (default)"
                rows.append(H.Row(case, _name(dt), "x".join(map(str, shape)), nbytes, 0, t, refs, "copy", copy_bw,
                                  note=f"order {order}"))
    checks = []
    big = [r for r in rows if r.bytes >= 2 * 64 * MiB and ("[" not in r.case or r.case.endswith(("[sub2]", "[persistent]")))]
    if big:
        best = {}
        for r in big:
            key = (r.dtype, r.shape)
            if key not in best or r.pct_ceiling > best[key].pct_ceiling:
                best[key] = r
        worst = min(best.values(), key=lambda r: r.pct_ceiling)
        checks.append({"target": ">= 95% of copy bandwidth, best variant (default tile order, 2x2 blocks or persistent), tensors >= 64 MiB",
                       "measured": f"min over shapes {worst.pct_ceiling:.1f}% ({worst.case} {worst.dtype} {worst.shape})",
                       "ok": worst.pct_ceiling >= 95.0})
    by = {}
    for r in rows:
        by.setdefault((r.dtype, r.shape), {})[r.case.split(".", 1)[1]] = r
    table = ["## Variants side by side (TB/s, default tile order: grouped, 32 tile-rows)", "",
             "| dtype | shape | naive | smem (padded) | swizzle | tma | torch | torch.compile |",
             "|---|---|---|---|---|---|---|---|"]
    for (d, s), vs in by.items():
        any_r = next(iter(vs.values()))
        ref = lambda k: any_r.rate(any_r.refs_ms[k])  # noqa: E731
        table.append(f"| {d} | {s} | " + " | ".join(f"{vs[v].ours_tbs:.3f}" if v in vs else "n/a"
                                                  for v in TRANSPOSE_VARIANTS)
                     + f" | {ref('torch'):.3f} | {ref('torch.compile'):.3f} |")
    cols = [f"{v}[{o}]" if o else v for v in TRANSPOSE_ORDER_VARIANTS for o in ("", *TRANSPOSE_ORDERS)]
    table += ["", "## Tile orders (% of copy bandwidth; plain name = default grouped g32, [row] = the old order)", "",
              "| dtype | shape | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for (d, s), vs in by.items():
        table.append(f"| {d} | {s} | " + " | ".join(f"{vs[c].pct_ceiling:.1f}" if c in vs else "n/a" for c in cols)
                     + " |")
    return rows, ["torch", "torch.compile"], checks, "\n".join(table), {}


# ----------------------------------------------------------------------------------------------
# Lesson 11: SiLU / SwiGLU forward and backward
# ----------------------------------------------------------------------------------------------
def swiglu(shapes=None, dtypes=(torch.bfloat16,), quick=False, ceilings=None):
    import torch.nn.functional as F

    import cute_kernels as ck

    shapes = shapes or ([(8192, 8192)] if quick else [(4096, 4096), (8192, 8192), (16384, 14336), (32768, 11008)])
    copy_bw = ceilings["copy"]

    def swiglu_bwd_eager(g, u, d):
        g = g.detach().requires_grad_()
        u = u.detach().requires_grad_()
        return torch.autograd.grad(F.silu(g) * u, (g, u), d)

    fwd_eager = lambda g, u: F.silu(g) * u  # noqa: E731
    fwd_compiled = H.compiled(fwd_eager)
    bwd_compiled = H.compiled(swiglu_bwd_eager)
    silu_compiled = H.compiled(F.silu)
    rows = []
    for dt in dtypes:
        for shape in shapes:
            g, u, d = (H.randn(*shape, dtype=dt, seed=s) for s in (14, 15, 16))
            e = g.numel() * g.element_size()
            cases = [
                ("silu.fwd", 2 * e, lambda: ck.silu(g), {"torch": lambda: F.silu(g), "torch.compile": lambda: silu_compiled(g)}),
                ("swiglu.fwd", 3 * e, lambda: ck.swiglu(g, u),
                 {"torch": lambda: fwd_eager(g, u), "torch.compile": lambda: fwd_compiled(g, u)}),
                ("swiglu.bwd", 5 * e, lambda: torch.ops.cute_kernels.swiglu_backward(g, u, d),
                 {"torch": lambda: swiglu_bwd_eager(g, u, d), "torch.compile": lambda: bwd_compiled(g, u, d)}),
            ]
            for case, nbytes, ours, refs in cases:
                H.progress(f"  {case} {_name(dt)} {shape}")
                t = H.do_bench(ours)["median_ms"]
                r = {k: H.do_bench(f)["median_ms"] for k, f in refs.items()}
                rows.append(H.Row(case, _name(dt), "x".join(map(str, shape)), nbytes, 0, t, r, "copy", copy_bw))
    checks = []
    big = lambda r: r.bytes >= 3 * 64 * MiB  # noqa: E731
    for case, target in (("swiglu.fwd", 95.0), ("silu.fwd", 95.0), ("swiglu.bwd", 85.0)):
        w = _worst(rows, lambda r: r.case == case and big(r))
        if w:
            checks.append({"target": f"{case} >= {target:.0f}% of copy bandwidth (>= 64 MiB per tensor)",
                           "measured": f"min {w.pct_ceiling:.1f}% ({w.dtype} {w.shape})", "ok": w.pct_ceiling >= target})
    w = min(rows, key=lambda r: r.ratio("torch.compile"))
    checks.append({"target": ">= 0.97x torch.compile", "measured": f"min {w.ratio('torch.compile'):.3f}x "
                   f"({w.case} {w.dtype} {w.shape})", "ok": w.ratio("torch.compile") >= 0.97})
    return rows, ["torch", "torch.compile"], checks, "", {}


# ----------------------------------------------------------------------------------------------
# Lesson 12: ArgMax
# ----------------------------------------------------------------------------------------------
# odd 16-bit rows: the default reads a scalar head, then 128-bit vectors (ops.argmax ROW_HEAD_DEFAULT, session 14);
# the column keeps the 2-byte scalar path it replaced beside it
ARGMAX_SCALAR = "ours scalar rows"


def argmax(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.ops.argmax import _argmax_rows

    shapes = shapes or ([(32768, 4096), (1, 1 << 28)] if quick else
                        [(32768, 4096), (4096, 32768), (256, 131072), (131072, 1024), (8, 1 << 24), (1, 1 << 28),
                         (16384, 50257)])
    read_bw = ceilings["read"]
    compiled = H.compiled(lambda x: torch.argmax(x, dim=-1))
    rows = []
    for dt in dtypes:
        for m, n in shapes:
            x = H.randn(m, n, dtype=dt, seed=17)
            H.progress(f"  argmax {_name(dt)} {m}x{n}")
            assert torch.equal(ck.argmax(x), torch.argmax(x, dim=-1)), "argmax differs from torch"
            t = H.do_bench(lambda: ck.argmax(x))["median_ms"]
            refs = {"torch": H.do_bench(lambda: torch.argmax(x, dim=-1))["median_ms"],
                    "torch.compile": H.do_bench(lambda: compiled(x))["median_ms"]}
            if x.element_size() == 2 and n % 8:  # odd rows: the scalar path the row head replaced
                out = torch.empty(m, dtype=torch.int64, device="cuda")
                scalar = lambda: _argmax_rows(x, out, row_head=False)  # noqa: E731
                scalar()
                assert torch.equal(out, torch.argmax(x, dim=-1)), "argmax scalar rows differ from torch"
                refs[ARGMAX_SCALAR] = H.do_bench(scalar)["median_ms"]
            rows.append(H.Row("argmax", _name(dt), f"{m}x{n}", x.numel() * x.element_size() + 8 * m, 0, t, refs,
                              "read", read_bw))
    checks = [{"target": "exact vs torch.argmax (every benchmarked case)", "measured": "equal", "ok": True}]
    w = _worst(rows, lambda r: r.bytes >= 256 * MiB)
    if w:
        checks.append({"target": ">= 95% of the read ceiling (inputs >= 256 MiB)",
                       "measured": f"min {w.pct_ceiling:.1f}% ({w.dtype} {w.shape})", "ok": w.pct_ceiling >= 95.0})
    geo, sel = H.option_speedup(rows, ARGMAX_SCALAR)
    if sel:
        checks.append({"target": f"ours (row head) faster than {ARGMAX_SCALAR} (geomean of {len(sel)}; keeps ROW_HEAD_DEFAULT)",
                       "measured": f"{1 / geo:.3f}x", "ok": geo < 1.0})
    return rows, ["torch", "torch.compile", ARGMAX_SCALAR], checks, "", {}


SUITES = {"gemv": gemv, "transpose": transpose, "swiglu": swiglu, "argmax": argmax}
PEERS: dict[str, tuple[str, ...]] = {k: () for k in SUITES}  # QuACK has no standalone op for these
