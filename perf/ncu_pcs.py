"""Where a kernel's warps wait, per SASS instruction: ncu's PC sampling (the SourceCounters section)
of one launch of a `perf.probe` target, reduced to the instructions that hold the most samples.

The aggregate stall metrics of `perf/device_session.sh ncu` say *that* warps wait at barriers (the
attention kernel: 22.7 % of its warps' cycles against FA4's 9.4 %); this says *which* barrier: the
top instructions by samples, each with its stall-reason columns and a few neighbours for context.

    python3 -m perf.ncu_pcs --probe "flash_attn bf16 2 8192 16 128" --kernel regex:kernel_cutlass --skip 2 \\
        --out /tmp/pcs [--top 25]
    python3 -m perf.ncu_pcs --csv saved.csv            (re-read an exported source page)

Writes `<out>/<name>.csv` (ncu's source page, SASS) and prints the summary. The CSV's column names
vary with the ncu version: every column whose name mentions samples or a stall reason is kept.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import subprocess
import sys


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def _columns(header: list[str]) -> tuple[str | None, str | None, str | None, list[str]]:
    """(address, source text, total-samples, stall columns) of a source-page header."""
    def find(*pats):
        for pat in pats:
            for h in header:
                if re.search(pat, h, re.I):
                    return h
        return None

    addr = find(r"^address$", r"address")
    src = find(r"^source$", r"sass", r"source")
    total = find(r"stall sampling \(all", r"all samples", r"samples")
    stalls = [h for h in header if h != total and re.search(r"stall|sampl|barrier", h, re.I)]
    return addr, src, total, stalls


def summarize(text: str, top: int = 25, context: int = 2) -> str:
    """The `top` instructions by total samples (with `context` neighbours each side, marked '  '),
    and the sum of each stall column over the kernel."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if any(re.search(r"address|source", c, re.I) for c in r)), None)
    if start is None:
        return "no source-page header found (is SourceCounters collected?)\n" + text[:2000]
    header, body = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    addr, src, total, stalls = _columns(header)
    if total is None:
        return f"no sample column in the header: {header}"
    ix = {h: i for i, h in enumerate(header)}
    tot = [_num(r[ix[total]]) for r in body]
    grand = sum(tot) or 1.0
    out = [f"{len(body)} SASS instructions, {grand:.0f} samples; columns: {', '.join(stalls) or '-'}", ""]
    sums = {h: sum(_num(r[ix[h]]) for r in body) for h in stalls}
    for h, v in sorted(sums.items(), key=lambda kv: -kv[1]):
        if v:
            out.append(f"  {h}: {v:.0f} ({100 * v / grand:.1f} %)")
    out.append("")
    order = sorted(range(len(body)), key=lambda i: -tot[i])[:top]
    for i in sorted(order, key=lambda i: -tot[i]):
        lo, hi = max(0, i - context), min(len(body), i + context + 1)
        out.append(f"--- {100 * tot[i] / grand:.1f} % of samples")
        for j in range(lo, hi):
            mark = ">>" if j == i else "  "
            detail = " ".join(f"{h.split('(')[0].strip()[:24]}={_num(body[j][ix[h]]):.0f}"
                              for h in stalls if _num(body[j][ix[h]]))
            a = body[j][ix[addr]] if addr else str(j)
            s = body[j][ix[src]] if src else ""
            out.append(f"{mark} {a:>8} {s[:90]:<90} {tot[j]:8.0f}  {detail}")
    return "\n".join(out)


def run(probe: str, kernel: str, skip: int, out: str, name: str) -> str:
    os.makedirs(out, exist_ok=True)
    rep = os.path.join(out, name)
    cmd = ["ncu", "--clock-control", "none", "--section", "SourceCounters", "--section", "WarpStateStats",
           "-k", kernel, "--launch-skip", str(skip), "--launch-count", "1", "-f", "-o", rep,
           sys.executable, "-m", "perf.probe", *probe.split()]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    text = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                          check=True, capture_output=True, text=True).stdout
    with open(rep + ".csv", "w") as f:
        f.write(text)
    os.remove(rep + ".ncu-rep")  # large; the CSV keeps what the summary needs
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", help="perf.probe arguments, e.g. 'flash_attn bf16 2 8192 16 128'")
    ap.add_argument("--kernel", default="regex:kernel_cutlass")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--out", default="/tmp/ncu_pcs")
    ap.add_argument("--name", default=None)
    ap.add_argument("--csv", help="summarize an exported source page instead of profiling")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    if a.csv:
        with open(a.csv) as f:
            text = f.read()
    elif a.probe:
        name = a.name or re.sub(r"[^A-Za-z0-9]+", "_", a.probe).strip("_")
        text = run(a.probe, a.kernel, a.skip, a.out, name)
    else:
        ap.error("give --probe or --csv")
    print(summarize(text, a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
