"""Instruction census of every compiled configuration: the identity check for a change that must not move
any kernel (a restructuring, a rename, a refactor of shared code).

    python3 -m perf.census record-ops --out ops.json          # GPU: the fixed grid of op calls below, with the
                                                              # compile step intercepted: which configs each resolves
    python3 -m perf.census compile --ops ops.json --jobs 16 --out census.json
                                                              # CPU: compile every sweep config plus the recorded ones
    python3 -m perf.census diff before.json after.json        # exit 1 on any difference

A config is named by its kernel and its resolved catalogue parameters (sorted), so the census survives moves of
modules and classes. Each entry holds the registers, shared and local memory and threads of every kernel in the
cubin, the opcode histograms of the PTX and the SASS, and a hash of the SASS instruction stream (opcodes and
operands; symbol names, addresses and comments left out). The op grid records, per call, the configs it compiled
(its own derivations: default schedules, stage and split-K clamps, row plans) or the error it raised.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def _load(path: str) -> dict:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def _save(path: str, doc: dict) -> None:
    with (gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w")) as f:
        json.dump(doc, f, indent=None if path.endswith(".gz") else 0, sort_keys=True)


def config_id(name: str, params: dict) -> str:
    return name + "|" + ",".join(f"{k}={params[k]}" for k in sorted(params))


def _parse_id(cid: str) -> tuple[str, dict]:
    name, _, rest = cid.partition("|")
    out = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        out[k] = v
    return name, out


# --- the census of one compiled config ----------------------------------------------------------------------------
_PTX_OP = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)", re.M)
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", re.M)


def _ptx_ops(ptx: str) -> dict:
    ops = Counter()
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "{", "}", "$", "(", ")")) or s.endswith(":"):
            continue
        m = _PTX_OP.match(s)
        if m:
            ops[m.group(1)] += 1
    return dict(sorted(ops.items()))


def _sass(sass: str) -> tuple[dict, str]:
    ops, h = Counter(), hashlib.sha256()
    for m in _SASS_LINE.finditer(sass):
        ins = re.sub(r"`\([^)]*\)", "`()", m.group(1))  # branch / call targets by symbol name
        ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
        op = ins.split()[0] if ins.split() else ""
        ops[op] += 1
        h.update(ins.encode())
        h.update(b"\n")
    return dict(sorted(ops.items())), h.hexdigest()[:24]


def census_one(cid: str) -> tuple[str, dict]:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    name, raw = _parse_id(cid)
    try:
        spec = catalog.get(name)
        p = spec.resolve(raw)
        with tempfile.TemporaryDirectory(prefix="ck_census_") as d:
            report, files = compile_with_artifacts(spec, p, d)
            ptx = files["ptx"].read_text()
            sass = files["sass"].read_text() if "sass" in files else None
        out = {
            "kernels": sorted(([k.registers, k.max_registers, k.static_smem_bytes, k.local_bytes, k.max_stack_bytes,
                                list(k.threads) if k.threads else None] for k in report.kernels), key=str),
            "dynamic_smem": report.dynamic_smem_bytes,
            "ptx_ops": _ptx_ops(ptx),
        }
        if sass is not None:
            out["sass_ops"], out["sass_hash"] = _sass(sass)
        return cid, out
    except Exception as e:  # a refused or failing config is part of the census too
        return cid, {"error": f"{type(e).__name__}: {e}"}


def sweep_ids() -> list[str]:
    from cute_kernels import catalog

    ids = []
    for spec in catalog.ready():
        for p in spec.sweep():
            ids.append(config_id(spec.name, p))
    return list(dict.fromkeys(ids))


def cmd_compile(args) -> int:
    ids = sweep_ids() if not args.no_sweep else []
    if args.ops:
        rec = _load(args.ops)
        for calls in rec["calls"].values():
            ids += calls.get("configs", [])
    ids = sorted(dict.fromkeys(ids))
    if args.limit:
        ids = ids[: args.limit]
    print(f"census: {len(ids)} configs, {args.jobs} jobs", flush=True)
    t0, res = time.time(), {}
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as ex:
        for i, (cid, out) in enumerate(ex.map(census_one, ids, chunksize=1)):
            res[cid] = out
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{len(ids)} {time.time() - t0:.0f} s", flush=True)
    errors = sum("error" in v for v in res.values())
    no_sass = sum("sass_hash" not in v and "error" not in v for v in res.values())
    doc = {"configs": res, "meta": {"n": len(res), "errors": errors, "no_sass": no_sass,
                                    "commit": os.environ.get("CK_COMMIT", ""), "seconds": round(time.time() - t0)}}
    _save(args.out, doc)
    print(f"census: {len(res)} configs ({errors} refused or failed, {no_sass} without SASS) in "
          f"{time.time() - t0:.0f} s -> {args.out}")
    return 0


# --- the op grid ------------------------------------------------------------------------------------------------
def _grid():
    """(label, thunk) of each op call. Sizes: the bench suites' shapes, off-tile and tiny sizes, awkward layouts."""
    import torch

    import cute_kernels as ck

    dev = "cuda"
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32

    def r(*s, dt=bf):
        return torch.randn(*s, device=dev, dtype=dt)

    calls = []

    def add(label, fn):
        calls.append((label, fn))

    # elementwise
    for dt in (bf, f16, f32):
        for n in (1, 1000, 1 << 20, 1 << 28):
            add(f"copy {dt} {n}", lambda n=n, dt=dt: ck.copy(r(n, dt=dt)))
            add(f"add {dt} {n}", lambda n=n, dt=dt: ck.add(r(n, dt=dt), r(n, dt=dt)))
            add(f"axpby {dt} {n}", lambda n=n, dt=dt: ck.axpby(2.0, r(n, dt=dt), -0.5, r(n, dt=dt)))
        add(f"add misaligned {dt}", lambda dt=dt: ck.add(r(1001, dt=dt)[1:], r(1000, dt=dt)))
    add("add 2^31+", lambda: ck.add(torch.empty((1 << 31) + 8, device=dev, dtype=bf),
                                    torch.empty((1 << 31) + 8, device=dev, dtype=bf)))
    # reduction
    for dt in (bf, f16, f32):
        for shape in ((4096, 4096), (8, 1 << 20), (1 << 20, 8), (3, 769), (1, 1)):
            add(f"sum rows {dt} {shape}", lambda s=shape, dt=dt: ck.sum(r(*s, dt=dt), dim=-1))
            add(f"sum rows fp32 {dt} {shape}", lambda s=shape, dt=dt: ck.sum(r(*s, dt=dt), dim=-1, out_dtype=f32))
        add(f"sum all {dt}", lambda dt=dt: ck.sum(r(1 << 22, dt=dt), out_dtype=f32))
        add(f"sum misaligned {dt}", lambda dt=dt: ck.sum(r(64, 1001, dt=dt)[:, 1:], dim=-1))
    # gemv
    for n, k in ((4096, 4096), (16384, 16384), (14336, 4096), (1024, 16384), (100, 72), (5125, 769)):
        for b in (1, 2, 4, 8):
            add(f"gemv {n}x{k} b{b}", lambda n=n, k=k, b=b: ck.gemv(r(n, k), r(b, k).t() if b > 1 else r(k)))
    add("gemv fp32", lambda: ck.gemv(r(4096, 4096, dt=f32), r(4096, dt=f32)))
    add("gemv row-major x", lambda: ck.gemv(r(4096, 4096), r(4096, 4)))
    # transpose
    for dt in (bf, f32):
        for shape in ((4096, 4096), (8192, 8192), (16384, 16384), (8000, 8000), (32, 2048, 2048), (256, 512, 512),
                      (769, 5125), (1, 1)):
            for v in ("naive", "smem", "swizzle", "tma"):
                add(f"transpose {v} {dt} {shape}", lambda s=shape, dt=dt, v=v: ck.transpose(r(*s, dt=dt), v))
    # swiglu / silu, forward and backward
    for dt in (bf, f16, f32):
        for shape in ((4096, 4096), (32768, 11008), (3, 769)):
            def sw(s=shape, dt=dt):
                g, u = r(*s, dt=dt).requires_grad_(), r(*s, dt=dt).requires_grad_()
                ck.swiglu(g, u).sum().backward()
            add(f"swiglu fwd+bwd {dt} {shape}", sw)

            def si(s=shape, dt=dt):
                x = r(*s, dt=dt).requires_grad_()
                ck.silu(x).sum().backward()
            add(f"silu fwd+bwd {dt} {shape}", si)
    # argmax
    for dt in (bf, f32):
        for shape in ((32768, 4096), (4096, 32768), (256, 131072), (131072, 1024), (8, 1 << 24), (1, 1 << 28),
                      (16384, 50257), (3, 769)):
            add(f"argmax {dt} {shape}", lambda s=shape, dt=dt: ck.argmax(r(*s, dt=dt), dim=-1))
    # row-wise family, forward and backward
    ns = (1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 769, 5125, 2112)
    for dt in (bf, f16, f32):
        for n in ns:
            m = max(1, min(4096, (64 << 20) // n))

            def rms(m=m, n=n, dt=dt):
                x, w = r(m, n, dt=dt).requires_grad_(), r(n, dt=dt).requires_grad_()
                ck.rms_norm(x, w).sum().backward()

            def rms_res(m=m, n=n, dt=dt):
                x, w, res = r(m, n, dt=dt), r(n, dt=dt), r(m, n, dt=dt)
                ck.rms_norm(x, w, residual=res)

            def ln(m=m, n=n, dt=dt):
                x, w, b = r(m, n, dt=dt).requires_grad_(), r(n, dt=dt).requires_grad_(), r(n, dt=dt).requires_grad_()
                ck.layer_norm(x, w, b).sum().backward()

            def ln_now(m=m, n=n, dt=dt):
                ck.layer_norm(r(m, n, dt=dt))

            def sm(m=m, n=n, dt=dt):
                x = r(m, n, dt=dt).requires_grad_()
                ck.softmax(x).sum().backward()

            def lsm(m=m, n=n, dt=dt):
                x = r(m, n, dt=dt).requires_grad_()
                ck.log_softmax(x).sum().backward()

            def ce(m=m, n=n, dt=dt):
                x = r(m, n, dt=dt).requires_grad_()
                t = torch.randint(0, n, (m,), device=dev)
                ck.cross_entropy(x, t).backward()

            for nm, fn in (("rms_norm", rms), ("rms_norm residual", rms_res), ("layer_norm", ln),
                           ("layer_norm no weight", ln_now), ("softmax", sm), ("log_softmax", lsm),
                           ("cross_entropy", ce)):
                add(f"{nm} {dt} {m}x{n}", fn)
        for n in (4096, 7168):
            for mode in ("per_token", "block128"):
                add(f"rms_norm fp8 {mode} {dt} {n}", lambda n=n, dt=dt, mode=mode:
                    ck.rms_norm(r(256, n, dt=dt), r(n, dt=dt), fp8_out=mode))
                add(f"layer_norm fp8 {mode} {dt} {n}", lambda n=n, dt=dt, mode=mode:
                    ck.layer_norm(r(256, n, dt=dt), r(n, dt=dt), r(n, dt=dt), fp8_out=mode))
    add("softmax misaligned", lambda: ck.softmax(r(64, 1001)[:, 1:]))
    # GEMM
    gemm_shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (4096, 14336, 4096),
                   (4096, 4096, 14336), (4096, 2112, 7168), (4096, 24576, 1536), (4096, 7168, 16384),
                   (16384, 8192, 1024), (128, 7168, 2048), (64, 4096, 4096), (64, 2048, 4096), (64, 4096, 1024),
                   (128, 2112, 4096), (32, 4096, 4096), (64, 8192, 8192), (64, 7168, 2048), (16, 4096, 4096),
                   (8, 7168, 2048), (1, 4096, 4096), (769, 5125, 2112), (1, 1, 1), (100, 200, 16), (4096, 4096, 64)]
    for m, n, k in gemm_shapes:
        add(f"gemm {m}x{n}x{k}", lambda m=m, n=n, k=k: ck.gemm(r(m, k), r(k, n)))
    for m, n, k in ((4096, 4096, 4096), (64, 4096, 4096), (769, 5125, 2112)):
        add(f"gemm fp32 out {m}x{n}x{k}", lambda m=m, n=n, k=k: ck.gemm(r(m, k), r(k, n), out_dtype=f32))
        add(f"gemm fp16 {m}x{n}x{k}", lambda m=m, n=n, k=k: ck.gemm(r(m, k, dt=f16), r(k, n, dt=f16)))
        add(f"gemm a.t b.t {m}x{n}x{k}", lambda m=m, n=n, k=k: ck.gemm(r(k, m).t(), r(n, k).t()))
        for act in ("relu", "gelu", "silu"):
            add(f"gemm {act} bias {m}x{n}x{k}", lambda m=m, n=n, k=k, act=act:
                ck.gemm(r(m, k), r(k, n), bias=r(n), activation=act))
        add(f"gemm batched {m}x{n}x{k}", lambda m=m, n=n, k=k: ck.gemm(r(4, m, k), r(4, k, n)))
        add(f"gemm batched shared b {m}x{n}x{k}", lambda m=m, n=n, k=k: ck.gemm(r(4, m, k), r(k, n)))

        def gb(m=m, n=n, k=k):
            a, b = r(m, k).requires_grad_(), r(k, n).requires_grad_()
            ck.gemm(a, b, activation="gelu").sum().backward()
        add(f"gemm gelu fwd+bwd {m}x{n}x{k}", gb)
    add("gemm odd K", lambda: ck.gemm(r(1000, 1001), r(1001, 300)))
    from cute_kernels.gemm.ops import gemm_ladder

    for rung in ("smem", "register"):
        add(f"gemm_ladder {rung}", lambda rung=rung: gemm_ladder(r(1024, 1024), r(1024, 1024), rung=rung))
    # FP8
    fp8_nk = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
    for m in (1, 16, 32, 64, 128, 4096, 769):
        for n, k in fp8_nk + [(5125, 2112)]:
            def f8(m=m, n=n, k=k):
                xq, sx = ck.quantize_1x128(r(m, k))
                wq, sw = ck.quantize_128x128(r(n, k))
                ck.fp8_gemm(xq, sx, wq, sw)
            add(f"fp8_gemm {m}x{n}x{k}", f8)
    for dt in (bf, f16, f32):
        for ue in (False, True):
            add(f"quantize_1x128 {dt} ue8m0={ue}", lambda dt=dt, ue=ue: ck.quantize_1x128(r(513, 4096, dt=dt), ue))
            add(f"quantize_128x128 {dt} ue8m0={ue}", lambda dt=dt, ue=ue: ck.quantize_128x128(r(777, 2112, dt=dt), ue))
    add("fp8_gemm fp32 out", lambda: ck.fp8_gemm(*ck.quantize_1x128(r(256, 2048)), *ck.quantize_128x128(r(512, 2048)),
                                                out_dtype=f32))
    from cute_kernels.fp8_gemm.ops import contiguous_layout

    for e, rows, n, k in ((8, 512, 4096, 7168), (4, 128, 7168, 2048), (32, 256, 2048, 7168)):
        def gc(e=e, rows=rows, n=n, k=k):
            idx, _ = contiguous_layout([rows] * e)
            idx = idx.to(dev)
            a = ck.quantize_1x128(r(idx.shape[0], k))
            bq = [ck.quantize_128x128(r(n, k)) for _ in range(e)]
            b = torch.stack([q for q, _ in bq]), torch.stack([s for _, s in bq])
            ck.fp8_gemm_grouped_contiguous(a[0], a[1], b[0], b[1], idx)
        add(f"fp8 grouped contiguous e{e} {rows} {n}x{k}", gc)

        def gm(e=e, rows=rows, n=n, k=k):
            aq = [ck.quantize_1x128(r(rows, k)) for _ in range(e)]
            bq = [ck.quantize_128x128(r(n, k)) for _ in range(e)]
            a = torch.stack([q for q, _ in aq]), torch.stack([s for _, s in aq])
            b = torch.stack([q for q, _ in bq]), torch.stack([s for _, s in bq])
            mm = torch.full((e,), rows // 2, dtype=torch.int32, device=dev)
            ck.fp8_gemm_grouped_masked(a[0], a[1], b[0], b[1], mm, expected_m=rows // 2)
        add(f"fp8 grouped masked e{e} {rows} {n}x{k}", gm)
    # attention
    for d in (64, 96, 128, 192, 256):
        for s in (1, 17, 512, 1024, 2048, 4096, 8192, 16384):
            b, h = max(1, 16384 // s), max(1, 2048 // d)
            for causal in (False, True):
                add(f"flash_attn d{d} s{s} causal={causal}", lambda b=b, s=s, h=h, d=d, causal=causal:
                    ck.flash_attn(r(b, s, h, d), r(b, s, h, d), r(b, s, h, d), causal=causal))
        add(f"flash_attn d{d} window", lambda d=d: ck.flash_attn(r(2, 2048, 8, d), r(2, 2048, 8, d), r(2, 2048, 8, d),
                                                                 window=(256, 0)))
        add(f"flash_attn d{d} softcap", lambda d=d: ck.flash_attn(r(2, 2048, 8, d), r(2, 2048, 8, d),
                                                                  r(2, 2048, 8, d), softcap=30.0))
        add(f"flash_attn d{d} gqa", lambda d=d: ck.flash_attn(r(2, 2048, 16, d), r(2, 2048, 2, d), r(2, 2048, 2, d),
                                                              causal=True))
        add(f"flash_attn d{d} sq != sk", lambda d=d: ck.flash_attn(r(2, 1000, 8, d), r(2, 3000, 8, d),
                                                                   r(2, 3000, 8, d), causal=True))
        add(f"flash_attn d{d} fp16", lambda d=d: ck.flash_attn(r(2, 2048, 8, d, dt=f16), r(2, 2048, 8, d, dt=f16),
                                                               r(2, 2048, 8, d, dt=f16)))

        def vl(d=d, causal=False):
            lens = [1000, 17, 0, 4096]
            cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32, device=dev)
            t = int(cu[-1])
            ck.flash_attn_varlen(r(t, 8, d), r(t, 8, d), r(t, 8, d), cu, cu, max(lens), max(lens), causal=causal)
        add(f"flash_attn_varlen d{d}", vl)
        add(f"flash_attn_varlen d{d} causal", lambda d=d: vl(d, True))
    # named errors are part of what the ops derive
    add("error gemm dtype", lambda: ck.gemm(r(8, 8, dt=f32), r(8, 8, dt=f32)))
    add("error flash_attn head dim", lambda: ck.flash_attn(r(1, 8, 1, 80), r(1, 8, 1, 80), r(1, 8, 1, 80)))
    return calls


def cmd_record_ops(args) -> int:
    import torch

    from cute_kernels import catalog

    seen: list[str] = []

    def compiled(self, schedule=None, **overrides):
        p = self.params_of_call(schedule, **overrides)
        seen.append(config_id(self.name, p))
        return lambda *a, **k: None  # nothing runs: only the derivation is recorded

    catalog.KernelSpec.compiled = compiled

    def clear_op_caches():
        for mod in list(sys.modules.values()):
            if not getattr(mod, "__name__", "").startswith("cute_kernels"):
                continue
            for nm, v in list(vars(mod).items()):
                if isinstance(v, dict) and nm.startswith("_") and "fns" in nm:
                    v.clear()
            for nm in dir(mod):  # lru_caches over compiled functions
                f = getattr(mod, nm, None)
                if hasattr(f, "cache_clear") and getattr(f, "__module__", "") == mod.__name__ and "compiled" in nm:
                    f.cache_clear()

    grid = _grid()
    out = {}
    t0 = time.time()
    for label, fn in grid:
        clear_op_caches()
        seen.clear()
        torch.manual_seed(0)
        try:
            fn()
            torch.cuda.synchronize()
            out[label] = {"configs": sorted(dict.fromkeys(seen))}
        except Exception as e:
            out[label] = {"configs": sorted(dict.fromkeys(seen)), "error": f"{type(e).__name__}: {e}"[:400]}
        torch.cuda.empty_cache()
    n_cfg = len({c for v in out.values() for c in v["configs"]})
    errs = sum("error" in v for v in out.values())
    with open(args.out, "w") as f:
        json.dump({"calls": out, "meta": {"calls": len(out), "configs": n_cfg, "errors": errs,
                                          "commit": os.environ.get("CK_COMMIT", "")}}, f, indent=1, sort_keys=True)
    print(f"record-ops: {len(out)} calls, {n_cfg} distinct configs, {errs} errors, {time.time() - t0:.0f} s -> {args.out}")
    return 0


def cmd_diff(args) -> int:
    a, b = _load(args.a), _load(args.b)
    bad = 0
    for section in ("configs", "calls"):
        if section not in a and section not in b:
            continue
        sa, sb = a.get(section, {}), b.get(section, {})
        for k in sorted(set(sa) | set(sb)):
            if sa.get(k) != sb.get(k):
                bad += 1
                if bad <= args.show:
                    print(f"{section} {k}:\n  before {json.dumps(sa.get(k))[:600]}\n  after  {json.dumps(sb.get(k))[:600]}")
    print(f"diff: {bad} differences")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="perf.census", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--ops", help="record-ops JSON: its configs join the sweep's")
    c.add_argument("--no-sweep", action="store_true")
    c.add_argument("--jobs", type=int, default=os.cpu_count())
    c.add_argument("--limit", type=int, default=0)
    c.add_argument("--out", required=True)
    r = sub.add_parser("record-ops")
    r.add_argument("--out", required=True)
    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--show", type=int, default=40)
    args = ap.parse_args(argv)
    return {"compile": cmd_compile, "record-ops": cmd_record_ops, "diff": cmd_diff}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
