"""The benchmark suite of ArgMax (lesson 12).

Same conventions as every suite (`cute_kernels.bench`): ours vs torch eager vs torch.compile, TB/s over the bytes
each op must move, % of the ceiling measured in the same run, ratios (> 1: ours faster). QuACK has none of
these as a standalone op, so there is no peer column.
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


# odd 16-bit rows: the default reads a scalar head, then 128-bit vectors (`cute_kernels.argmax.ops.ROW_HEAD_DEFAULT`);
# the column keeps the 2-byte scalar path it replaced beside it
ARGMAX_SCALAR = "ours scalar rows"


def argmax(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.argmax.ops import _argmax_rows

    shapes = shapes or ([(32768, 4096), (1, 1 << 28)] if quick else
                        [(32768, 4096), (4096, 32768), (256, 131072), (131072, 1024), (8, 1 << 24), (1, 1 << 28),
                         (16384, 50257)])
    read_bw = ceilings["read"]
    compiled = H.compiled(lambda x: torch.argmax(x, dim=-1))
    rows = []
    for dt in dtypes:
        for m, n in shapes:
            x = H.randn(m, n, dtype=dt, seed=17)
            H.progress(f"  argmax {H.dtype_name(dt)} {m}x{n}")
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
            rows.append(H.Row("argmax", H.dtype_name(dt), f"{m}x{n}", x.numel() * x.element_size() + 8 * m, 0, t, refs,
                              "read", read_bw))
    checks = [{"target": "exact vs torch.argmax (every benchmarked case)", "measured": "equal", "ok": True}]
    w = H.worst(rows, lambda r: r.bytes >= 256 * MiB)
    if w:
        checks.append({"target": ">= 95% of the read ceiling (inputs >= 256 MiB)",
                       "measured": f"min {w.pct_ceiling:.1f}% ({w.dtype} {w.shape})", "ok": w.pct_ceiling >= 95.0})
    geo, sel = H.option_speedup(rows, ARGMAX_SCALAR)
    if sel:
        checks.append({"target": f"ours (row head) faster than {ARGMAX_SCALAR} (geomean of {len(sel)}; keeps ROW_HEAD_DEFAULT)",
                       "measured": f"{1 / geo:.3f}x", "ok": geo < 1.0})
    return rows, ["torch", "torch.compile", ARGMAX_SCALAR], checks, "", {}


SUITES = {"argmax": argmax}
PEERS: dict[str, tuple[str, ...]] = {"argmax": ()}
