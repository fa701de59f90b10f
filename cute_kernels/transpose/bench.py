"""The benchmark suite of transposes (lessons 8-9).

Same conventions as every suite (`cute_kernels.bench`): ours vs torch eager vs torch.compile, TB/s over the bytes
each op must move, % of the ceiling measured in the same run, ratios (> 1: ours faster). QuACK has none of
these as a standalone op, so there is no peer column.
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


TRANSPOSE_VARIANTS = ("naive", "smem", "swizzle", "tma")
# tile orders (schedules/tile_order.py) against the default (grouped, 32 tile-rows): "row" is the
# plain 2-D grid the kernels used before; each runs in the same interleaved rounds as the defaults
TRANSPOSE_ORDERS = {
    "row": {"order": "row"}, "diagonal": {"order": "diagonal"},
    "g8": {"order": "grouped", "group": 8}, "g64": {"order": "grouped", "group": 64},
    # a CTA per 2 x 2 block of tiles (fp32 16384^2 ran 86 % of copy, 0.87x torch.compile, on
    # one 32 x 32 tile a CTA with 128-byte row runs; the block makes them 256 bytes on both sides)
    "sub2": {"sub": 2}, "sub1": {"sub": 1},  # sub1: one tile a CTA (the default below ~100 MiB a matrix)
    # persistent CTAs, the next block's TMA load under this one's transpose and stores (the swizzle column of this
    # entry is skipped: TMA only)
    "persistent": {"persistent": True},
}
TRANSPOSE_ORDER_VARIANTS = ("swizzle", "tma")


def transpose(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    from cute_kernels.transpose.ops import _transpose_cuda

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
            H.progress(f"  transpose {H.dtype_name(dt)} {shape}: {len(fns)} columns interleaved")
            times = {k: r["median_ms"] for k, r in H.do_bench_interleaved(fns).items()}
            refs = {k: times.pop(k) for k in ("torch", "torch.compile")}
            for case, t in times.items():
                order = case.partition("[")[2].rstrip("]") or "g32 (default)"
                rows.append(H.Row(case, H.dtype_name(dt), "x".join(map(str, shape)), nbytes, 0, t, refs, "copy", copy_bw,
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


SUITES = {"transpose": transpose}
PEERS: dict[str, tuple[str, ...]] = {"transpose": ()}
