"""CPU: the streaming cross-entropy forward (`cross_entropy.fwd`) compiles for sm_90a in every pass
the op launches, under the tilings the op picks: no spills, 128-bit loads of aligned logits, 64-bit
loads of the (m, l) partials in the merge pass, registers low enough for 896 threads per SM (768
in 256-thread CTAs); each
thread's loads of a pass issued together, before its first exp (ptxas sank two of four behind the
exps of a per-vector fold), and the target gather after the scan's loads."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise.ops import ce_plan
from schedules.row_tiling import plan_rows


def _params(m, n, dtype="bf16", aligned=True, mode="rows", **extra):
    vec = (16 // {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]) if aligned else 1
    plan = ce_plan(m, n, vec, 132)
    if mode == "merge":  # x is only gathered at the target: the op compiles the unaligned variant
        plan, aligned = plan_rows(m, plan.splits, 132, max_splits=1), False
    t = plan.tiling
    return catalog.get("cross_entropy.fwd").resolve(
        {"dtype": dtype, "aligned": aligned, "mode": mode, "threads": t.threads,
         "threads_per_row": t.threads_per_row, "unroll": t.unroll, **extra})


def _compile(p, tmp_path):
    report, files = compile_with_artifacts(catalog.get("cross_entropy.fwd"), p, str(tmp_path))
    k = report.kernels[0]
    assert not report.spills, report.format()
    threads = p["threads"]
    resident = 65536 // (-(-k.registers // 8) * 8 * threads) * threads
    # 128-thread CTAs (rows < 32k): e.g. 7 per SM, 8 vectors each: 112 KiB in flight; 256-thread CTAs
    # (rows >= 32k): 3 per SM with 64-bit indexing (72 registers): 96 KiB
    assert resident >= (896 if threads == 128 else 768), report.format()
    return report, files["ptx"].read_text()


@pytest.mark.parametrize("m,n,mode", [(32768, 4096, "rows"), (2048, 65536, "rows"), (1, 1 << 24, "partial"),
                                      (4, 1 << 22, "partial")])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_streaming_passes_use_128bit_loads(m, n, mode, dtype, tmp_path):
    p = _params(m, n, dtype, mode=mode)
    if mode == "partial":
        assert ce_plan(m, n, 8, 132).splits > 1
    report, ptx = _compile(p, tmp_path)
    assert report.ptx_census["ld.global.v4 (128-bit)"] > 0
    assert "barrier.cluster" not in ptx and "ld.local" not in ptx


def test_merge_pass_reads_pairs(tmp_path):
    report, ptx = _compile(_params(1, 1 << 24, mode="merge"), tmp_path)
    assert "ld.global.v2.b32" in ptx or "ld.global.v2.f32" in ptx


@pytest.mark.parametrize("n", [769, 7])
def test_odd_rows_stream_scalars(n, tmp_path):
    report, _ = _compile(_params(300, n, aligned=False), tmp_path)
    assert report.ptx_census["ld.global.v4 (128-bit)"] == 0
    assert report.ptx_census["ld.global (all)"] > 0


def test_index64_compiles(tmp_path):
    _compile(_params(8, 1 << 20, index64=True), tmp_path)


@pytest.mark.parametrize("m,n", [(32768, 4096), (2048, 65536)])
def test_pass_loads_before_exps_and_gather_after(m, n, tmp_path):
    """In SASS: the target load first (predicated, no branch on it before the scan), a pass's 8
    128-bit loads issued back to back before the pass's first exp, the x[m, t] gather after them."""
    from tests.helpers import sass_or_skip

    p = _params(m, n)
    assert p["unroll"] == 8
    report, files = compile_with_artifacts(catalog.get("cross_entropy.fwd"), p, str(tmp_path))
    lines = [ln for ln in sass_or_skip(report, files).splitlines() if "/*" in ln and ";" in ln]
    ops = [ln.split("*/", 1)[1].strip() for ln in lines]
    first_v4 = next(i for i, op in enumerate(ops) if "LDG.E.128" in op)
    assert all("LDG.E.128" in op for op in ops[first_v4:first_v4 + 8]), ops[first_v4:first_v4 + 8]
    first_exp = next(i for i, op in enumerate(ops) if "MUFU.EX2" in op)
    assert first_exp > first_v4 + 7
    target = next(i for i, op in enumerate(ops) if "LDG.E.64" in op)
    reg = int(re.search(r"LDG\.E\.64 R(\d+)", ops[target]).group(1))
    uses = re.compile(rf"\bR({reg}|{reg + 1})\b")
    assert target < first_v4 and not any(uses.search(op) for op in ops[target + 1:first_v4 + 8])  # not waited for
    gather = next(i for i, op in enumerate(ops) if "LDG.E.U16" in op)
    assert gather > first_v4 + 7


def test_whole_passes():
    """Session 20: a row of 16-byte vectors is walked in whole passes (6144 at 128 threads: one pass of 6 vectors,
    not 8 with 2 masked off, whose partial pass had folded a vector at a time: 60 % of copy bandwidth); the planned
    unroll where it divides the row, on scalar rows, and where a caller sets it."""
    for n, u in ((6144, 6), (5120, 5), (7168, 7), (12288, 6), (14336, 7), (8192, 8), (4096, 8), (65536, 8)):
        plan = ce_plan(32768, n, 8, 132)
        per = -(-(n // 8) // plan.tiling.threads_per_row)
        assert plan.tiling.unroll == u and per % u == 0, (n, plan)
    assert ce_plan(32768, 6144, 1, 132).tiling.unroll == 8
    assert ce_plan(32768, 6144, 8, 132, unroll=8).tiling.unroll == 8
    # a sweep of settings (perf.tune_rows) asks for the rule even though it names the unroll
    assert ce_plan(32768, 6144, 8, 132, unroll=8, whole_passes=True).tiling.unroll == 6
