"""The benchmark suite of the reduction family (lesson 2): row sums and full sums against torch and torch.compile,
as % of the read ceiling."""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


def reduction(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    import cute_kernels as ck

    if shapes is None:
        shapes = [(1, 1 << 27), (1, 1 << 29), (262144, 1024), (32768, 4096), (4096, 32768), (512, 262144),
                  (8, 1 << 25), (1 << 21, 128)]
        if quick:
            shapes = [(1, 1 << 27), (32768, 4096)]
    read_bw = ceilings["read"]
    compiled_rows = H.compiled(lambda x: x.sum(-1))
    compiled_all = H.compiled(lambda x: x.sum())
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


SUITES = {"reduction": reduction}
PEERS: dict[str, tuple[str, ...]] = {"reduction": ()}
