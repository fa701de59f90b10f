"""Benchmark suites for the catalogue: which cases, which references, which targets.

`run(what)` with what = a kernel name (`elementwise.add`), a family (`elementwise`, `reduction`) or
`all`. Each family writes `<family>.json`, `.md` and `.png` into the output folder.
"""

from __future__ import annotations

import math

import torch

from perf import harness as H

MiB = 1 << 20


def _compiled(fn):
    return H.compiled(fn)


# ----------------------------------------------------------------------------------------------
# Lesson 1: elementwise
# ----------------------------------------------------------------------------------------------
def elementwise(ops=("copy", "add", "axpby"), sizes_mib=None, dtypes=(torch.bfloat16, torch.float32),
                quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.ops.elementwise import _launch
    from schedules.bulk_chunks import BulkChunks

    sizes_mib = sizes_mib or ([1, 256] if quick else [1, 4, 16, 64, 256, 1024, 2048])
    copy_bw = ceilings["copy"]
    eager = {
        "copy": lambda x, y: x.clone(),
        "add": lambda x, y: torch.add(x, y),
        "axpby": lambda x, y: 2.0 * x + (-0.5) * y,
    }
    compiled = {op: _compiled(f) for op, f in eager.items()}
    ours = {
        "copy": lambda x, y: ck.copy(x),
        "add": lambda x, y: ck.add(x, y),
        "axpby": lambda x, y: ck.axpby(2.0, x, -0.5, y),
    }
    # copy's TMA bulk variant (not the op's default: schedules/bulk_chunks.py), called like the op's
    # eager path (allocate, launch): column "ours bulk", whose `x ours bulk` < 1 means bulk is faster
    bulk = BulkChunks()

    def bulk_copy(x):
        out = torch.empty_like(x)
        _launch("copy", x, x, out, 1.0, 0.0, schedule=bulk)
        return out

    rows = []
    for op in ops:
        for dt in dtypes:
            for mib in sizes_mib:
                n = mib * MiB // torch.tensor([], dtype=dt).element_size()
                x, y = H.randn(n, dtype=dt, seed=3), H.randn(n, dtype=dt, seed=4)
                nbytes = (2 if op == "copy" else 3) * n * x.element_size()
                H.progress(f"  elementwise.{op} {dt} {mib} MiB")
                # the columns timed in interleaved rounds (H.do_bench_interleaved): at 1-16 MiB a
                # call is a few microseconds and clock drift between separate runs is several %
                fns = {"ours": lambda: ours[op](x, y), "torch": lambda: eager[op](x, y),
                       "torch.compile": lambda: compiled[op](x, y)}
                if op == "copy":
                    fns["ours bulk"] = lambda: bulk_copy(x)
                res = H.do_bench_interleaved(fns)
                t = res.pop("ours")["median_ms"]
                refs = {k: v["median_ms"] for k, v in res.items()}
                rows.append(H.Row(f"elementwise.{op}", str(dt).replace("torch.", ""), f"{n}", nbytes, 0, t, refs,
                                  "copy", copy_bw))
                del x, y
    checks = []
    big = [r for r in rows if r.bytes / (2 if r.case.endswith("copy") else 3) >= 256 * MiB]
    if big:
        worst = min(big, key=lambda r: r.pct_ceiling)
        checks.append({"target": ">= 92% of copy bandwidth, tensors >= 256 MiB",
                       "measured": f"min {worst.pct_ceiling:.1f}% ({worst.case} {worst.dtype} {worst.shape})",
                       "ok": worst.pct_ceiling >= 92.0})
    worst = min(rows, key=lambda r: r.ratio("torch"))
    checks.append({"target": ">= 0.97x torch at every size >= 1 MiB",
                   "measured": f"min {worst.ratio('torch'):.3f}x ({worst.case} {worst.dtype} {worst.shape})",
                   "ok": worst.ratio("torch") >= 0.97})

    # Host overhead per call, tiny input.
    x = H.randn(1024, dtype=torch.bfloat16, seed=5)
    y = H.randn(1024, dtype=torch.bfloat16, seed=6)
    out = torch.empty_like(x)
    from cute_kernels import catalog

    fn = catalog.get("elementwise.add").compiled(dtype="bf16")
    direct = H.host_overhead_us(lambda: fn(x, y, out, 1.0, 1.0, 1056))
    op = H.host_overhead_us(lambda: ck.add(x, y))
    tmul = H.host_overhead_us(lambda: torch.mul(x, y))
    overhead = {"compiled kernel, direct (TVM-FFI)": direct, "public op ck.add, eager": op, "torch.mul": tmul}
    checks.append({"target": "host overhead: compiled kernel called directly <= 10 us",
                   "measured": f"{direct:.1f} us", "ok": direct <= 10.0})
    checks.append({"target": "host overhead: public torch op in eager <= 20 us",
                   "measured": f"{op:.1f} us", "ok": op <= 20.0})
    extra = "## Host overhead per call (1024 bf16 elements)\n\n| path | us/call |\n|---|---|\n" + "\n".join(
        f"| {k} | {v:.1f} |" for k, v in overhead.items())
    bulk_rows = [r for r in rows if "ours bulk" in r.refs_ms]
    if bulk_rows:
        extra += (f"\n\n## Copy: the TMA bulk variant ({bulk}) against torch\n\n"
                  "| dtype | MiB per tensor | ours x torch | ours bulk x torch |\n|---|---|---|---|\n")
        extra += "\n".join(f"| {r.dtype} | {r.bytes // 2 // MiB} | {r.ratio('torch'):.3f} | "
                            f"{r.refs_ms['torch'] / r.refs_ms['ours bulk']:.3f} |" for r in bulk_rows)
    cols = ["torch", "torch.compile"] + (["ours bulk"] if bulk_rows else [])
    return rows, cols, checks, extra, {"overhead_us": overhead}


# ----------------------------------------------------------------------------------------------
# Lesson 2: reduction
# ----------------------------------------------------------------------------------------------
def reduction(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    import cute_kernels as ck

    if shapes is None:
        shapes = [(1, 1 << 27), (1, 1 << 29), (262144, 1024), (32768, 4096), (4096, 32768), (512, 262144),
                  (8, 1 << 25), (1 << 21, 128)]
        if quick:
            shapes = [(1, 1 << 27), (32768, 4096)]
    read_bw = ceilings["read"]
    compiled_rows = _compiled(lambda x: x.sum(-1))
    compiled_all = _compiled(lambda x: x.sum())
    rows = []
    for dt in dtypes:
        for m, n in shapes:
            x = H.randn(m, n, dtype=dt, seed=7)
            nbytes = x.numel() * x.element_size() + m * x.element_size()
            full = m == 1
            H.progress(f"  reduction {'sum_all' if full else 'row_sum'} {dt} {m}x{n}")
            if full:
                t = H.do_bench(lambda x=x: ck.sum(x))["median_ms"]
                refs = {"torch": H.do_bench(lambda x=x: torch.sum(x))["median_ms"],
                        "torch.compile": H.do_bench(lambda x=x: compiled_all(x))["median_ms"]}
            else:
                t = H.do_bench(lambda x=x: ck.sum(x, dim=-1))["median_ms"]
                refs = {"torch": H.do_bench(lambda x=x: torch.sum(x, dim=-1))["median_ms"],
                        "torch.compile": H.do_bench(lambda x=x: compiled_rows(x))["median_ms"]}
            rows.append(H.Row("reduction.sum_all" if full else "reduction.row_sum", str(dt).replace("torch.", ""),
                              f"{m}x{n}", nbytes, 0, t, refs, "read", read_bw))
            del x
    big = [r for r in rows if r.bytes >= 256 * MiB]
    checks = []
    if big:
        worst = min(big, key=lambda r: r.pct_ceiling)
        checks.append({"target": ">= 90% of the read ceiling (inputs >= 256 MiB)",
                       "measured": f"min {worst.pct_ceiling:.1f}% ({worst.case} {worst.dtype} {worst.shape})",
                       "ok": worst.pct_ceiling >= 90.0})
    return rows, ["torch", "torch.compile"], checks, "", {}


SUITES = {"elementwise": elementwise, "reduction": reduction}
PEERS: dict[str, tuple[str, ...]] = {"elementwise": (), "reduction": ()}  # QuACK/FA4 have no such op


def _gemm(**kw):
    from perf.suite_gemm import gemm

    return gemm(**{k: v for k, v in kw.items() if k != "ceilings"})


def _gemm_small(**kw):
    from perf.suite_gemm import SMALL_M, gemm

    kw = {k: v for k, v in kw.items() if k not in ("ceilings", "quick")}
    return gemm(**{"shapes": SMALL_M, **{k: v for k, v in kw.items() if v}}, with_ladder=False)


SUITES["gemm"] = _gemm
PEERS["gemm"] = ("quack",)
SUITES["gemm_small"] = _gemm_small  # decode-sized M: the small-grid defaults
PEERS["gemm_small"] = ("quack",)


# Lessons 3, 8, 9, 11, 12: gemv, transpose, swiglu, argmax.
from perf import suite_misc3 as _misc3  # noqa: E402

SUITES.update(_misc3.SUITES)
PEERS.update(_misc3.PEERS)

# Lessons 4-7: norms, softmax, cross-entropy.
from perf import suite_rowwise as _rowwise  # noqa: E402

SUITES.update(_rowwise.SUITES)
PEERS.update(_rowwise.PEERS)

# Lesson 13: FP8 block-scaled GEMM.
from perf import suite_fp8 as _fp8  # noqa: E402

SUITES.update(_fp8.SUITES)
PEERS.update(_fp8.PEERS)

# Issue 5: FP8 quantizers (and the norms' fused FP8 output).
from perf import suite_quant as _quant  # noqa: E402

SUITES.update(_quant.SUITES)
PEERS.update(_quant.PEERS)

# Issue 6: FlashAttention forward.
from perf.suite_attention import attention as _attention  # noqa: E402

SUITES["attention"] = _attention
PEERS["attention"] = ("flash_attn",)


def run(what: str, out_dir=None, shapes=None, quick=False) -> int:
    """Run suite(s) `what`; `shapes`: a list of shapes (each a list of ints) instead of the suites' own, or one shape
    (a list of ints, as before)."""
    if shapes and not isinstance(shapes[0], (list, tuple)):
        shapes = [shapes]

    if not torch.cuda.is_available():
        raise SystemExit("bench needs a CUDA GPU")
    family = what.split(".")[0]
    families = list(SUITES) if what == "all" else [family]
    for f in families:
        if f not in SUITES:
            raise SystemExit(f"no benchmark suite for {what!r}; suites: {list(SUITES)} or 'all'")
    meta = H.environment()
    H.progress("measuring ceilings (1 GiB d2d copy, 1 GiB torch.sum)")
    copy_bw = H.copy_bandwidth()
    ceilings = {"copy": copy_bw, "read": max(copy_bw, H.read_bandwidth())}
    meta["ceilings"] = ceilings
    failed = 0
    for f in families:
        kwargs = {"quick": quick, "ceilings": ceilings}
        if f == "elementwise" and "." in what:
            kwargs["ops"] = (what.split(".")[1],)
        if shapes:
            if f == "elementwise":
                kwargs["sizes_mib"] = [max(1, math.prod(s) * 2 // MiB) for s in shapes]
            else:
                kwargs["shapes"] = [tuple(s) for s in shapes]
        H.progress(f"suite {f}")
        m = dict(meta)
        m["peers"] = H.peer_versions(PEERS[f]) or "none has this op"
        rows, refs, checks, extra, more = SUITES[f](**kwargs)
        m.update(more)
        print(f"\n## {f}  ({meta['gpu']}, {meta['date']}, commit {meta['commit']})")
        print(f"ceilings: copy {ceilings['copy']:.3f} TB/s, read {ceilings['read']:.3f} TB/s")
        print(H.markdown_table(rows, refs))
        for c in checks:
            print(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['target']}: {c['measured']}")
            failed += not c["ok"]
        if extra:
            print(extra)
        if out_dir:
            files = H.write_results(f, out_dir, m, rows, refs, checks, extra)
            print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0 if failed == 0 else 1
