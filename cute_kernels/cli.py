"""`cute-kernels` (or `python3 -m cute_kernels`): list, compile, bench, main.

  cute-kernels list                                  the catalogue, with configs and status
  cute-kernels compile KERNEL [--config k=v ...] [--arch sm_90a] [--dump DIR]
  cute-kernels compile --all [--jobs N]              fill the compile cache for every ready kernel
  cute-kernels bench KERNEL|FAMILY|all [--shape ...] [--out DIR] [--quick]   (GPU)
  cute-kernels schedules gemm --shape M N K [--out DIR]  rank candidate schedules (GPU)
  cute-kernels schedules attention --shape B S H D [--causal]   fa3/fa2 attention schedules (GPU)
  cute-kernels main [--out DIR]                      compile + report everything; on a GPU also bench
  cute-kernels layout|algebra|swizzle|atoms ...      study CuTe layouts, swizzles and banks (CPU; see study/cli.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from cute_kernels import target  # noqa: F401


def _parse_kv(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--config expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def cmd_list(args) -> int:
    from cute_kernels import catalog

    print(f"{'kernel':<20} {'lesson':>6}  {'status':<8} {'torch ops':<14} summary")
    for spec in sorted(catalog.KERNELS.values(), key=lambda s: (s.lesson or 99, s.name)):
        ops = ",".join(spec.ops) or "-"
        print(f"{spec.name:<20} {spec.lesson or '-':>6}  {spec.status:<8} {ops:<14} {spec.summary}")
        if args.verbose and spec.params:
            for k, p in spec.params.items():
                ch = f" {list(p.choices)}" if p.choices else ""
                print(f"{'':<30}{k}={p.default} ({p.role}){ch}  {p.help}")
    return 0


def cmd_compile(args) -> int:
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    if args.all:
        from cute_kernels.precompile import precompile_all

        n, secs = precompile_all(jobs=args.jobs, sweep=args.sweep)
        print(f"compiled {n} variants into the cache in {secs:.1f} s")
        return 0
    if not args.kernel:
        raise SystemExit("compile: name a KERNEL (see `cute-kernels list`) or pass --all")
    spec = catalog.get(args.kernel)
    if spec.status != "ready":
        raise SystemExit(f"{spec.name} is {spec.status}: not built yet")
    params = spec.resolve(_parse_kv(args.config))
    t0 = time.perf_counter()
    report, files = compile_with_artifacts(spec, params, args.dump, args.arch)
    print(report.format())
    print(f"  compile time {time.perf_counter() - t0:.2f} s")
    for kind, path in files.items():
        print(f"  wrote {kind}: {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    return 0


def cmd_bench(args) -> int:
    from cute_kernels import bench

    return bench.run(args.what, out_dir=args.out, shapes=args.shape, quick=args.quick)


def cmd_schedules(args) -> int:
    import torch

    want = {"gemm": ("M", "N", "K"), "attention": ("B", "S", "H", "D")}[args.kernel]
    if len(args.shape) != len(want):
        raise SystemExit(f"schedules {args.kernel}: --shape takes {len(want)} sizes {' '.join(want)}, "
                         f"got {len(args.shape)}")
    if args.kernel == "attention":
        from schedules.attention import HEAD_DIMS, candidates, default_schedule

        b, s, h, d = args.shape
        if d not in HEAD_DIMS:
            raise SystemExit(f"schedules attention: D must be one of {HEAD_DIMS}, got {d}")
        limit = min(args.limit, 24)
        if not torch.cuda.is_available():
            what = f"B={b} S={s} H={h} D={d}{' causal' if args.causal else ''}"
            print(f"no GPU here: the candidates that would be timed for {what} (default first):")
            for c in candidates(d, args.causal, limit):
                print(f"  {c}{'  (default)' if c == default_schedule(d, args.causal) else ''}")
            return 0
        from cute_kernels.bench.schedule_search import search_attention

        return search_attention(b, s, h, d, args.causal, out_dir=args.out, limit=limit)
    if not torch.cuda.is_available():
        from schedules.gemm import candidates, default_schedule

        m, n, k = args.shape
        print(f"no GPU here: the candidates that would be timed for {m}x{n}x{k} (default first):")
        for s in candidates(m, n, k):
            print(f"  {s}{'  (default)' if s == default_schedule(m, n, k) else ''}")
        return 0
    from cute_kernels.bench.schedule_search import search

    return search(*args.shape, out_dir=args.out, limit=args.limit)


def cmd_main(args) -> int:
    """Compile and report every ready kernel; with a GPU, also run the benchmarks."""
    import torch

    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    rows = []
    for spec in catalog.ready():
        for params in spec.representative():
            report, _ = compile_with_artifacts(spec, params, os.path.join(args.out, "artifacts") if args.out else None)
            k = report.kernels[0]
            rows.append((spec.name, spec.key(params).signature, k.registers, report.spills,
                         report.ptx_census["ld.global.v4 (128-bit)"], report.ptx_census["st.global.v4 (128-bit)"]))
            print(f"compiled {spec.name:<20} {spec.key(params).config:<40} regs {k.registers:>3}", flush=True)
    print(f"\n{'kernel':<20} {'signature':<44} {'regs':>4} {'spills':>6} {'ld.v4':>5} {'st.v4':>5}")
    for r in rows:
        print(f"{r[0]:<20} {r[1]:<44} {r[2]:>4} {str(r[3]):>6} {r[4]:>5} {r[5]:>5}")
    if not torch.cuda.is_available():
        print("\nno GPU here: compiled and reported only (run on an H200 to benchmark)")
        return 0
    from cute_kernels import bench

    return bench.run("all", out_dir=args.out, shapes=None, quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cute-kernels", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("list", help="the catalogue of kernels")
    s.add_argument("-v", "--verbose", action="store_true", help="show every parameter")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("compile", help="compile a kernel; print its resource report and census")
    s.add_argument("kernel", nargs="?")
    s.add_argument("--config", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    s.add_argument("--arch", default=None, help="target (default: sm_90a)")
    s.add_argument("--dump", default=None, metavar="DIR", help="write .ptx/.cubin/.sass here")
    s.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    s.add_argument("--all", action="store_true", help="fill the compile cache for every ready kernel")
    s.add_argument("--sweep", action="store_true", help="with --all: every config of the sweep")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="with --all: parallel compiles")
    s.set_defaults(fn=cmd_compile)

    s = sub.add_parser("bench", help="benchmark on the GPU against torch and the peers")
    s.add_argument("what", help="kernel, family or 'all'")
    s.add_argument("--shape", nargs="+", type=int, action="append", default=None,
                   help="a shape instead of the suite's (repeat the flag for several: one table)")
    s.add_argument("--out", default=None, metavar="DIR", help="write <suite>.json/.md/.png here")
    s.add_argument("--quick", action="store_true", help="fewer sizes (smoke run)")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("schedules", help="time the candidate schedules of a kernel on one shape (GPU)")
    s.add_argument("kernel", choices=["gemm", "attention"])
    s.add_argument("--shape", nargs="+", type=int, required=True, metavar="SIZE",
                   help="gemm: M N K; attention: B S H D (self-attention, bf16)")
    s.add_argument("--causal", action="store_true", help="attention: a causal mask")
    s.add_argument("--out", default=None, metavar="DIR")
    s.add_argument("--limit", type=int, default=32, help="at most this many candidates (attention: 24)")
    s.set_defaults(fn=cmd_schedules)

    s = sub.add_parser("main", help="compile and report everything; on a GPU also benchmark")
    s.add_argument("--out", default=None, metavar="DIR")
    s.add_argument("--quick", action="store_true")
    s.set_defaults(fn=cmd_main)

    from cute_kernels.study.cli import add_parsers as add_study_parsers

    add_study_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, KeyError) as e:  # a bad kernel name, parameter, value or combination: one line, exit 1
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"cute-kernels {args.cmd}: error: {msg}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `cute-kernels ... | head`
        sys.stderr.close()
        return 0
