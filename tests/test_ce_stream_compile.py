"""CPU: the streaming cross-entropy forward (`cross_entropy.fwd`) compiles for sm_90a in every pass
the op launches, under the tilings the op picks: no spills, 128-bit loads of aligned logits, 64-bit
loads of the (m, l) partials in the merge pass, registers low enough for two 512-thread CTAs per SM."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.row_tiling import plan_rows


def _params(m, n, dtype="bf16", aligned=True, mode="rows", **extra):
    vec = (16 // {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]) if aligned else 1
    plan = plan_rows(m, n // vec, 132, unroll=4)
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
    assert k.registers <= 64, report.format()  # two 512-thread CTAs per SM
    return report, files["ptx"].read_text()


@pytest.mark.parametrize("m,n,mode", [(32768, 4096, "rows"), (2048, 65536, "rows"), (1, 1 << 24, "partial"),
                                      (4, 1 << 22, "partial")])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_streaming_passes_use_128bit_loads(m, n, mode, dtype, tmp_path):
    p = _params(m, n, dtype, mode=mode)
    if mode == "partial":
        assert plan_rows(m, n // 8, 132, unroll=4).splits > 1
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
