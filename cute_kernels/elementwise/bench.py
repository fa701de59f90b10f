"""The benchmark suite of the elementwise family (lesson 1): copy, add, axpby against torch and torch.compile over
1 MiB-2 GiB, copy's TMA bulk variant beside it, and the host overhead of a call."""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


def elementwise(ops=("copy", "add", "axpby"), sizes_mib=None, dtypes=(torch.bfloat16, torch.float32),
                quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.elementwise.ops import _launch
    from schedules.bulk_chunks import BulkChunks

    sizes_mib = sizes_mib or ([1, 256] if quick else [1, 4, 16, 64, 256, 1024, 2048])
    copy_bw = ceilings["copy"]
    eager = {
        "copy": lambda x, y: x.clone(),
        "add": lambda x, y: torch.add(x, y),
        "axpby": lambda x, y: 2.0 * x + (-0.5) * y,
    }
    compiled = {op: H.compiled(f) for op, f in eager.items()}
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


SUITES = {"elementwise": elementwise}
PEERS: dict[str, tuple[str, ...]] = {"elementwise": ()}  # QuACK / FA4 have no such op
