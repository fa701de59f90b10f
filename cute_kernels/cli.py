"""`cute-kernels` (or `python3 -m cute_kernels`): list, compile, bench, main.

  cute-kernels list                                  the catalogue, with configs and status
  cute-kernels compile KERNEL [--config k=v ...] [--arch sm_90a] [--dump DIR]
  cute-kernels compile --all [--jobs N]              fill the compile cache for every ready kernel
  cute-kernels bench KERNEL|FAMILY|all [--shape ...] [--out DIR] [--quick]   (GPU)
  cute-kernels schedules gemm --shape M N K [--out DIR]  rank candidate schedules (GPU)
  cute-kernels schedules attention --shape B S H D [--causal] [--backward | --fp8]   attention schedules (GPU)
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

from cute_kernels import target


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

        n, compiled, secs = precompile_all(jobs=args.jobs, sweep=args.sweep)
        print(f"{n} variants: {compiled} compiled, {n - compiled} found in the compile cache ({secs:.1f} s)")
        return 0
    if not args.kernel:
        raise SystemExit("compile: name a KERNEL (see `cute-kernels list`) or pass --all")
    if args.arch:
        target.check_arch(args.arch)  # before anything is built
    spec = catalog.get(args.kernel)
    if spec.status != "ready":
        raise SystemExit(f"{spec.name} is {spec.status}: not built yet")
    params = spec.resolve(_parse_kv(args.config))
    t0 = time.perf_counter()
    report, files = compile_with_artifacts(spec, params, args.dump, args.arch, cache=True)
    print(report.format())
    took = time.perf_counter() - t0
    print(f"  {'found in the compile cache' if report.from_cache else 'compiled'} in {took:.2f} s")
    for kind, path in files.items():
        print(f"  {kind}: {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    return 0


def cmd_bench(args) -> int:
    from cute_kernels import bench

    return bench.run(args.what, out_dir=args.out, shapes=args.shape, quick=args.quick)


def cmd_schedules(args) -> int:
    import torch

    want = {"gemm": ("M", "N", "K"), "attention": ("B", "S", "H", "D"),
            "decode": ("B", "L", "H_Q", "H_KV", "D", "[Q_LEN]", "[PAGE]")}[args.kernel]
    if args.kernel == "decode":
        return _schedules_decode(args, torch)
    if len(args.shape) != len(want):
        raise SystemExit(f"schedules {args.kernel}: --shape takes {len(want)} sizes {' '.join(want)}, "
                         f"got {len(args.shape)}")
    for flag in ("backward", "fp8"):
        if getattr(args, flag) and args.kernel != "attention":
            raise SystemExit(f"schedules: --{flag} is for attention")
    if args.backward and args.fp8:
        raise SystemExit("schedules attention: the FP8 forward has no backward (--fp8 without --backward)")
    if args.kernel == "attention":
        from schedules import attention, attention_bwd

        bwd = args.backward
        dims = attention_bwd.HEAD_DIMS_BWD if bwd else attention.FP8_HEAD_DIMS if args.fp8 else attention.HEAD_DIMS
        b, s, h, d = args.shape
        flag = " --backward" if bwd else " --fp8" if args.fp8 else ""
        if d not in dims:
            raise SystemExit(f"schedules attention{flag}: D must be one of {dims}, got {d}")
        limit = min(args.limit, 24)
        if not torch.cuda.is_available():
            what = f"B={b} S={s} H={h} D={d}{' causal' if args.causal else ''}"
            if args.fp8:
                print(f"no GPU here: the FP8 forward's configs that would be timed for {what} (default first):")
                for c in attention.fp8_candidates(d, limit):
                    print(f"  {c}")
                return 0
            if bwd:
                cands = attention_bwd.candidates_bwd(d, args.causal)[:limit]
                default = attention_bwd.default_bwd_schedule(d, args.causal)
            else:
                cands = attention.candidates(d, args.causal, limit)
                default = attention.default_schedule(d, args.causal)
            print(f"no GPU here: the {'backward ' if bwd else ''}candidates that would be timed for {what} (default "
                  "first):")
            for c in cands:
                print(f"  {c}{'  (default)' if c == default else ''}")
            return 0
        from cute_kernels.bench.schedule_search import search_attention, search_attention_bwd, search_attention_fp8

        search = search_attention_bwd if bwd else search_attention_fp8 if args.fp8 else search_attention
        return search(b, s, h, d, args.causal, out_dir=args.out, limit=limit)
    if not torch.cuda.is_available():
        from schedules.gemm import candidates, default_schedule

        m, n, k = args.shape
        print(f"no GPU here: the candidates that would be timed for {m}x{n}x{k} (default first):")
        for s in candidates(m, n, k):
            print(f"  {s}{'  (default)' if s == default_schedule(m, n, k) else ''}")
        return 0
    from cute_kernels.bench.schedule_search import search

    return search(*args.shape, out_dir=args.out, limit=args.limit)


def _schedules_decode(args, torch) -> int:
    """`schedules decode --shape B L H_Q H_KV D [Q_LEN] [PAGE]`: the split model's choice and the candidates; timed
    on a GPU."""
    from schedules.decode import (
        DECODE_HEAD_DIMS,
        choose_splits,
        decode_candidates,
        default_decode_schedule,
        split_table,
    )

    if not 5 <= len(args.shape) <= 7:
        raise SystemExit(f"schedules decode: --shape takes B L H_Q H_KV D [Q_LEN] [PAGE], got {len(args.shape)} sizes")
    b, n, hq, hk, d, q_len, page = list(args.shape) + [1, 0][len(args.shape) - 5:]  # q_len 1, contiguous
    if d not in DECODE_HEAD_DIMS or hk < 1 or hq % hk:
        raise SystemExit(f"schedules decode: D must be one of {DECODE_HEAD_DIMS} and H_Q a multiple of H_KV")
    if not torch.cuda.is_available():
        base = default_decode_schedule(d)
        row = split_table([(b, n, hk, q_len, hq // hk)], base)[0]
        print(f"no GPU here: the split model for B={b} L={n} H_q={hq} H_kv={hk} D={d} q_len={q_len} on 132 SMs: "
              f"{row['splits']} splits ({row['ctas']} CTAs, {row['tiles_per_split']} tiles of {base.tile_n} keys a "
              "split); the candidates that would be timed:")
        for s in decode_candidates(d)[:args.limit]:
            print(f"  {s}  splits={choose_splits(b, hk, n, q_len, hq // hk, s, sms=132)}"
                  f"{'  (default)' if s == base else ''}")
        return 0
    from cute_kernels.bench.schedule_search import search_decode

    return search_decode(b, n, hq, hk, d, q_len, page, out_dir=args.out, limit=args.limit)


def _variant(spec, params: dict) -> str:
    """A variant's short name: its parameters that differ from the catalogue's defaults ("default": none)."""
    base = spec.resolve()
    diff = [f"{k}={v}" for k, v in params.items() if base.get(k) != v]
    return " ".join(diff) or "default"


def cmd_main(args) -> int:
    """Compile and report every ready kernel's representative variants; with a GPU, also run the benchmarks."""
    import hashlib

    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    out = Path(args.out) if args.out else None
    rows, notes, compiled = [], [], 0
    t0 = time.perf_counter()
    for spec in catalog.ready():
        for params in spec.representative():
            key = spec.key(params)
            folder = None
            if out is not None:  # one folder per variant: <kernel>/<a digest of its config and signature>
                digest = hashlib.sha256(f"{key.config}|{key.signature}".encode()).hexdigest()[:10]
                folder = out / "artifacts" / spec.name / digest
            report, _ = compile_with_artifacts(spec, params, str(folder) if folder else None, cache=True)
            compiled += not report.from_cache
            if folder is not None:
                (folder / "report.txt").write_text(f"{key}\n\n{report.format()}\n")
            k = report.kernels[0]
            ptx, sass = report.ptx_census, report.sass_census or {}
            local = max(kr.local_bytes for kr in report.kernels)
            variant = _variant(spec, params)
            rows.append((spec.name, variant if len(variant) <= 44 else variant[:41] + "...", k.registers,
                         k.static_smem_bytes + (report.dynamic_smem_bytes or 0), local, ptx["wgmma.mma_async"],
                         ptx["cp.async.bulk.tensor"], ptx["ld.global.v4 (128-bit)"], ptx["st.global.v4 (128-bit)"],
                         sass.get("LDL/STL (spills)", "-")))
            if local or report.spills:
                why = spec.local_memory_note(params)
                notes.append(f"{spec.name} [{variant}]: {local} B of local memory" + (f" ({why})" if why else ""))
            print(f"{'cached  ' if report.from_cache else 'compiled'} {spec.name:<20} {variant[:70]}", flush=True)
    head = ("kernel", "variant (non-default parameters)", "regs", "smem B", "local B", "wgmma", "tma", "ld.v4",
            "st.v4", "LDL/STL")
    widths = (20, 44, 4, 7, 7, 5, 4, 5, 5, 7)
    print()
    print("  ".join(f"{h:<{w}}" if i < 2 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(head, widths))))
    for r in rows:
        print("  ".join(f"{str(v):<{w}}" if i < 2 else f"{str(v):>{w}}" for i, (v, w) in enumerate(zip(r, widths))))
    print(f"\n{len(rows)} variants of {len(catalog.ready())} kernels: {compiled} compiled, {len(rows) - compiled} "
          f"found in the compile cache ({time.perf_counter() - t0:.1f} s). smem: static + the dynamic bytes a spec declares; local: the "
          "frame of local memory (spills or local arrays); wgmma / tma / ld.v4 / st.v4: PTX instruction counts.")
    for n in notes:
        print(f"  note: {n}")
    if out is not None:
        print(f"artifacts (PTX, cubin, SASS and the report of each variant): {out / 'artifacts'}/<kernel>/<variant>/")
    import torch

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
    s.add_argument("kernel", choices=["gemm", "attention", "decode"])
    s.add_argument("--shape", nargs="+", type=int, required=True, metavar="SIZE",
                   help="gemm: M N K; attention: B S H D (self-attention, bf16); decode: B L H_Q H_KV D [Q_LEN] "
                        "[PAGE] (every sequence at L keys)")
    s.add_argument("--causal", action="store_true", help="attention: a causal mask")
    s.add_argument("--backward", action="store_true", help="attention: the backward's schedules")
    s.add_argument("--fp8", action="store_true", help="attention: the FP8 forward's configs (flash_attn_fp8)")
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
