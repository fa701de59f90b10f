"""Benchmark harness: CUDA-event medians with L2 flushed, ceilings measured in the same run,
results as JSON + markdown + plot stamped with GPU, date and commit.

Timing: each repetition first reads a buffer of twice the L2 size and spins the GPU ~100 us
(both outside the timed region, so the host has queued the call before the start event fires and
the figure is device time; host overhead is measured separately by `host_overhead_us`), then
records an event pair around one call; warm-up calls (compilation, autotuning, first-touch)
are excluded; the figure is the median. Inputs are randn: low-entropy data (zeros, small
integers) toggles fewer bits, runs at higher clocks and flatters a kernel.

Ceilings: `copy_bandwidth` is a device-to-device copy of 1 GiB counting bytes read + written (the
ceiling of memory-bound ops); `read_bandwidth` is the larger of that and torch.sum's read rate over
1 GiB (the ceiling of reductions, which only read); `compute_ceiling` is torch's dense GEMM at 8192^3
(bf16, or e4m3 through `_scaled_mm`) with the SM clock read under that load (the ceiling of
compute-bound rows, and the tensor cores' peak at that clock beside it).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

_flush_buf: torch.Tensor | None = None


def _flush_l2() -> None:
    """Evict the L2 by *reading* a buffer twice its size. Reading leaves clean lines behind;
    overwriting a buffer (the common `zero_()` flush) leaves up to a full L2 of dirty lines whose
    write-back then lands inside the next timed call and taxes whatever runs there (by ~60 MB of
    extra traffic on an H200: ~15% of a 256 MiB reduction)."""
    global _flush_buf
    if _flush_buf is None:
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        _flush_buf = torch.ones(2 * max(l2, 64 << 20) // 4, dtype=torch.float32, device="cuda")
    _flush_buf.sum()


def do_bench(fn: Callable[[], object], *, warmup_ms: float = 30.0, rep_ms: float = 150.0,
             min_reps: int = 10, max_reps: int = 500, flush: bool = True) -> dict:
    """Median time of `fn()` in ms over CUDA events, L2 flushed and the GPU spinning >= 100 us (twice the call's
    host time) before each repetition (so the call is queued before its start event fires): `do_bench_interleaved`
    with one column."""
    return do_bench_interleaved({"fn": fn}, warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps,
                                max_reps=max_reps, flush=flush)["fn"]


def do_bench_interleaved(fns: dict[str, Callable[[], object]], *, warmup_ms: float = 30.0, rep_ms: float = 150.0,
                         min_reps: int = 10, max_reps: int = 500, flush: bool = True) -> dict[str, dict]:
    """Median times (ms, CUDA events) of several columns, measured in rounds: each round times every
    column once, L2 flushed and the GPU spinning before each call, in an order rotated per round. Clock and thermal drift over the run then lands on every column alike, instead of on
    whichever was timed last: at a few microseconds per call (1-8 MiB elementwise) that drift is
    several % between two separate `do_bench` calls of the same kernel."""
    names = list(fns)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n_warm = 0
    while n_warm < 3 or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        for f in fns.values():
            f()
        n_warm += 1
        if n_warm % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    est_ms = max((time.perf_counter() - t0) * 1e3 / n_warm, 1e-3)
    reps = int(min(max_reps, max(min_reps, rep_ms * len(names) / est_ms)))
    # The GPU spins before each timed call so that the host has queued the call when `s` fires: at least 100 us,
    # else twice the slowest column's host time per call. The norm backwards at 1k (a ~200 us kernel behind an
    # autograd call of 165-330 us host time, QuACK's alike: `perf.host_time`) read 1.6-2x slow when
    # the host fell behind the 100 us spin: the event pair then timed the host.
    host_us = 0.0
    for f in fns.values():
        for _ in range(3):
            h0 = time.perf_counter()
            f()
            host_us = max(host_us, (time.perf_counter() - h0) * 1e6)
    torch.cuda.synchronize()
    spin = int(2000 * min(2000.0, max(100.0, 2 * host_us)))  # cycles (~2 GHz)
    events = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for k in names}
    for r in range(reps):
        for j in range(len(names)):
            k = names[(r + j) % len(names)]
            if flush:
                _flush_l2()
            torch.cuda._sleep(spin)  # (>= ~100 us of GPU spin: the call below is queued before `s` fires)
            s, e = events[k][r]
            s.record()
            fns[k]()
            e.record()
    torch.cuda.synchronize()
    out = {}
    for k in names:
        times = sorted(s.elapsed_time(e) for s, e in events[k])
        out[k] = {"median_ms": statistics.median(times), "p20_ms": times[int(0.2 * (len(times) - 1))],
                  "p80_ms": times[int(0.8 * (len(times) - 1))], "reps": reps}
    return out


def compiled(fn: Callable) -> Callable:
    """The suites' torch.compile column: `fn` compiled for each shape it meets (`dynamic=False`), what a user with
    fixed shapes gets. The default marks a dimension dynamic at its first recompile (automatic dynamic shapes) and a
    suite calls one function over many shapes: torch.compile's RMSNorm fwd at 8192x16384 measured 56 % of copy in
    the sweep and 98 % run alone (0.933x ours). The recompile limit is raised so that every shape (and
    grad mode) of a sweep gets its own graph instead of falling back to eager."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 1024))
    return torch.compile(fn, dynamic=False)


def randn(*shape, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in TB/s, counting bytes read + written."""
    x = randn(nbytes // 2, dtype=torch.bfloat16, seed=1)
    y = torch.empty_like(x)
    t = do_bench(lambda: y.copy_(x))["median_ms"]
    return 2 * nbytes / (t * 1e-3) / 1e12


def same_bytes_copy(rows, moved, copy_tbs: float) -> str:
    """A markdown table putting each row's rate beside a device copy that moves the same bytes, measured now: for
    inputs of tens of MiB a copy itself falls well short of the 1 GiB copy rate the ceilings use (the
    elementwise suite: 32 MiB moved 68.5 %, 128 MiB 95.2 %), so this is the floor such a size
    allows. `moved(row)`: the bytes the row's kernel must move (a GEMV's or a small-M GEMM's weights)."""
    lines = ["| shape | MiB | ours TB/s | same-bytes copy TB/s | copy % of the 1 GiB copy | ours / same-bytes copy |",
             "|---|---|---|---|---|---|"]
    seen = {}
    for r in rows:
        b = moved(r)
        if b not in seen:
            seen[b] = copy_bandwidth(max(2, b // 2))  # reads b / 2 and writes b / 2: b bytes moved
        ours = b / (r.ours_ms * 1e-3) / 1e12
        lines.append(f"| {r.shape} | {b / 2**20:.1f} | {ours:.3f} | {seen[b]:.3f} | {seen[b] / copy_tbs:.1%} | "
                     f"{ours / seen[b]:.3f} |")
    return "\n".join(lines)


def read_bandwidth(nbytes: int = 1 << 30) -> float:
    """torch.sum's read rate over `nbytes` of bf16, in TB/s."""
    x = randn(nbytes // 2, dtype=torch.bfloat16, seed=2)
    t = do_bench(lambda: torch.sum(x))["median_ms"]
    return nbytes / (t * 1e-3) / 1e12


# Dense tensor-core FLOP a clock an SM on the H100 / H200 (SXM): 989.4 (bf16) and 1978.9 (e4m3) TFLOP/s by spec are
# these at the 1830 MHz boost clock on 132 SMs. Under load the 700 W cap holds the clock lower (1.35-1.75 GHz).
TENSOR_FLOP_PER_CLOCK = {"bf16": 4096, "fp8": 8192}
MATMUL_CEILING_N = 8192


@dataclass(frozen=True)
class ComputeCeiling:
    """A same-run compute ceiling: torch's dense GEMM at 8192^3 (`torch.matmul` bf16, or `torch._scaled_mm` e4m3 with
    per-tensor scales), its TFLOP/s, the SM clock read while it ran (MHz; None without NVML) and the SM count."""

    dtype: str
    tflops: float
    clock_mhz: float | None
    sms: int

    @property
    def peak_at_clock(self) -> float | None:
        """TFLOP/s of the tensor cores' dense peak at the measured clock (None without a clock)."""
        if not self.clock_mhz:
            return None
        return self.sms * TENSOR_FLOP_PER_CLOCK[self.dtype] * self.clock_mhz * 1e6 / 1e12

    def meta(self) -> dict:
        """The suite metadata of the ceiling."""
        out = {f"{self.dtype}_gemm_8192_tflops": round(self.tflops, 1), "sm_clock_mhz": self.clock_mhz}
        if self.peak_at_clock:
            out[f"{self.dtype}_peak_at_clock_tflops"] = round(self.peak_at_clock, 1)
        return out

    def line(self) -> str:
        """One markdown line saying what the compute ceiling of a suite's rows is."""
        what = "torch.matmul bf16" if self.dtype == "bf16" else "torch._scaled_mm e4m3 (per-tensor scales)"
        s = f"Compute ceiling (the % ceiling column): {what} at {MATMUL_CEILING_N}^3 in this run, {self.tflops:.0f} TFLOP/s"
        if self.peak_at_clock:
            s += (f"; the SM clock read under that load {self.clock_mhz:.0f} MHz, where the dense {self.dtype} peak is "
                  f"{self.peak_at_clock:.0f} TFLOP/s ({100 * self.tflops / self.peak_at_clock:.1f} % of it reached)")
        return s + "."


def compute_ceiling(dtype: str = "bf16") -> ComputeCeiling:
    """Measure the compute ceiling of `dtype` ("bf16" or "fp8") in this run (`ComputeCeiling`). The clock
    (`torch.cuda.clock_rate`: NVML's average over its last sample period, 1/6 to 1 s) is read 0.3 s into ~0.4 s of
    back-to-back calls queued at once, so that period saw the GPU under this load only."""
    if dtype not in TENSOR_FLOP_PER_CLOCK:
        raise ValueError(f"dtype must be one of {tuple(TENSOR_FLOP_PER_CLOCK)}, got {dtype!r}")
    n = MATMUL_CEILING_N
    a, b = randn(n, n, seed=71), randn(n, n, seed=72)
    if dtype == "fp8":
        a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        fn = lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        fn = lambda: a @ b  # noqa: E731
    ms = do_bench(fn)["median_ms"]
    clock = None
    try:
        for _ in range(max(20, math.ceil(400 / ms))):
            fn()
        time.sleep(0.3)
        clock = float(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001  (no NVML: no clock)
        pass
    torch.cuda.synchronize()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return ComputeCeiling(dtype, 2 * n**3 / (ms * 1e-3) / 1e12, clock, sms)


def host_overhead_us(fn: Callable[[], object], calls: int = 3000) -> float:
    """Wall-clock microseconds per call of `fn` on a tiny input (GPU work is negligible, so the
    loop is bound by the host: argument conversion, dispatch, launch)."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def commit() -> str:
    c = os.environ.get("CK_COMMIT")
    if c:
        return c
    try:
        root = Path(__file__).resolve().parent.parent
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
        return h.stdout.strip() + ("-dirty" if dirty else "") if h.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def environment() -> dict:
    import cutlass

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "torch": torch.__version__,
        "cutlass_dsl": cutlass.__version__,
        "python": platform.python_version(),
    }


def peer_versions(required: tuple[str, ...]) -> dict:
    """Versions of the peers a suite compares against; a missing one fails the run loudly."""
    out = {}
    for mod in required:
        try:
            m = __import__(mod)
        except Exception as e:  # a peer that does not import must not silently drop its column
            raise SystemExit(f"peer {mod!r} failed to import ({e}); carry it (shared/device/prepare --peers)")
        out[mod] = getattr(m, "__version__", "?")
    return out


@dataclass
class Row:
    case: str
    dtype: str
    shape: str
    bytes: int
    flops: int
    ours_ms: float
    refs_ms: dict = field(default_factory=dict)
    ceiling: str = "copy"
    ceiling_tbs: float = 0.0
    note: str = ""

    @property
    def ours_tbs(self) -> float:
        """TB/s, or TFLOP/s for compute-bound rows (ceiling "tflops")."""
        return self.rate(self.ours_ms)

    def rate(self, ms: float) -> float:
        work = self.flops if self.ceiling == "tflops" else self.bytes
        return work / (ms * 1e-3) / 1e12

    @property
    def pct_ceiling(self) -> float:
        return 100.0 * self.ours_tbs / self.ceiling_tbs if self.ceiling_tbs else float("nan")

    def ratio(self, ref: str) -> float:
        """Speed relative to a reference: > 1 means ours is faster."""
        return self.refs_ms[ref] / self.ours_ms


def option_speedup(rows: list[Row], name: str) -> tuple[float | None, list[Row]]:
    """An experiment column's verdict: (the geomean over the rows that time column `name` of our time /
    its time (> 1: the option is faster than ours), those rows); (None, []) where no row has it."""
    sel = [r for r in rows if name in r.refs_ms]
    if not sel:
        return None, sel
    return math.exp(sum(math.log(1 / r.ratio(name)) for r in sel) / len(sel)), sel


def dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def worst(rows, pred=lambda r: True):
    """The row of the lowest % of its ceiling among those `pred` accepts (None: no such row)."""
    sel = [r for r in rows if pred(r)]
    return min(sel, key=lambda r: r.pct_ceiling) if sel else None


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def markdown_table(rows: list[Row], refs: list[str]) -> str:
    unit = "TFLOP/s" if rows and rows[0].ceiling == "tflops" else "TB/s"
    head = ["case", "dtype", "shape", "MiB moved", "ours ms", f"ours {unit}", "% ceiling"]
    head += [f"{r} {unit}" for r in refs] + [f"x {r}" for r in refs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.case, r.dtype, r.shape, f"{r.bytes / 2**20:.1f}", f"{r.ours_ms:.4f}", f"{r.ours_tbs:.3f}",
                 f"{r.pct_ceiling:.1f}"]
        cells += [f"{r.rate(r.refs_ms[k]):.3f}" if k in r.refs_ms else "n/a" for k in refs]
        cells += [f"{r.ratio(k):.3f}" if k in r.refs_ms else "n/a" for k in refs]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(name: str, out_dir: str | os.PathLike, meta: dict, rows: list[Row], refs: list[str],
                  checks: list[dict], extra_md: str = "") -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": name,
        "meta": meta,
        "rows": [dict(asdict(r), ours_tbs=r.ours_tbs, pct_ceiling=r.pct_ceiling) for r in rows],
        "checks": checks,
    }
    files = {"json": out / f"{name}.json", "md": out / f"{name}.md"}
    files["json"].write_text(json.dumps(payload, indent=1))
    env = ", ".join(f"{k} {v}" for k, v in meta.items() if k not in ("ceilings",))
    ceil = ", ".join(f"{k} {v:.3f} TB/s" for k, v in meta.get("ceilings", {}).items())
    md = [f"# {name}", "", f"{env}", "", f"Ceilings measured in this run: {ceil}.", "",
          "CUDA-event medians, L2 flushed before each repetition, randn inputs. `x ref` = ref time / our time "
          "(> 1: ours faster).", "", markdown_table(rows, refs), ""]
    if checks:
        md += ["## Targets", "", "| target | measured | pass |", "|---|---|---|"]
        md += [f"| {c['target']} | {c['measured']} | {'PASS' if c['ok'] else 'FAIL'} |" for c in checks]
        md.append("")
    if extra_md:
        md += [extra_md, ""]
    files["md"].write_text("\n".join(md))
    try:
        files["png"] = plot(name, out / f"{name}.png", rows, refs, meta)
    except Exception as e:  # a missing matplotlib must not lose the numbers
        progress(f"plot skipped: {e}")
    return files


def plot(name: str, path: Path, rows: list[Row], refs: list[str], meta: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cute_kernels.figures import save_png

    if rows and rows[0].ceiling == "tflops":
        return _plot_bars(name, path, rows, refs, meta, plt)
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(f"{r.case} {r.dtype}", []).append(r)
    n = len(groups)
    cols = min(3, n)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, (g, rs) in zip(axes.flat, groups.items()):
        xs = [r.bytes / 2**20 for r in rs]
        ax.plot(xs, [r.ours_tbs for r in rs], "o-", label="cute-kernels", lw=2)
        for ref in refs:
            ys = [r.bytes / (r.refs_ms[ref] * 1e-3) / 1e12 if ref in r.refs_ms else float("nan") for r in rs]
            ax.plot(xs, ys, "s--", label=ref, alpha=0.8)
        ax.axhline(rs[0].ceiling_tbs, color="k", lw=0.8, ls=":", label=f"ceiling ({rs[0].ceiling})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("MiB moved")
        ax.set_ylabel("TB/s")
        ax.set_title(g, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{name} on {meta.get('gpu')} ({meta.get('date')}, {meta.get('commit')})", fontsize=11)
    fig.tight_layout()
    save_png(fig, path)
    return path


def _plot_bars(name, path, rows, refs, meta, plt):
    """Compute-bound suites: TFLOP/s per case, ours beside each reference."""
    import numpy as np

    from cute_kernels.figures import save_png

    labels = [f"{r.case}\n{r.shape}" for r in rows]
    series = [("cute-kernels", [r.ours_tbs for r in rows])]
    series += [(ref, [r.rate(r.refs_ms[ref]) if ref in r.refs_ms else 0.0 for r in rows]) for ref in refs]
    x = np.arange(len(rows))
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows) * len(series) / 2), 4.5))
    for i, (lab, ys) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * w, ys, w, label=lab)
    ax.axhline(rows[0].ceiling_tbs, color="k", lw=0.8, ls=":", label="dense bf16 peak (spec)")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{name} on {meta.get('gpu')} ({meta.get('date')}, {meta.get('commit')})", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)
    return path
