"""CPU: the cross-entropy backward (`kernels.softmax.CrossEntropyBwd`) under its plans
(HELD_TUNED["ce_bwd"] and `perf.tune_rows.ce_bwd_candidates`) compiles for sm_90a without spills;
bf16 rows keep the registers of 8+ CTAs of 128 threads per SM (<= 64), issue all their 128-bit
loads (and the row's target, lse, dloss) before the first exp, address them from one base with
constant offsets, and a long row's CTAs are launched without a cluster (no cluster barrier)."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import config_of
from schedules.row_tiling import plan_for_rows
from tests.helpers import sass_or_skip

CE = "cross_entropy.bwd"


def _params(plan, dtype="bf16", aligned=True, index64=False):
    return catalog.get(CE).resolve({**config_of(plan), "dtype": dtype, "aligned": aligned, "index64": index64})


def _compile(p, tmp_path):
    report, files = compile_with_artifacts(catalog.get(CE), p, str(tmp_path))
    k = report.kernels[0]
    assert k.registers and k.registers <= 65536 // p["threads"], report.format()
    assert not report.spills, report.format()
    return report, files


def _sass_lines(sass: str) -> list[str]:
    return [ln.split("*/", 1)[1].strip() for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]


@pytest.mark.parametrize("n", [4096, 16384, 65536, 262144])
def test_bf16_default_plans(n, tmp_path):
    plan = plan_for_rows("ce_bwd", n, 8)
    p = _params(plan)
    report, files = _compile(p, tmp_path)
    assert report.kernels[0].registers <= 64, report.format()  # 1024+ threads' loads in flight per SM
    s = report.sass_census
    vpt = plan.tiling.unroll
    if s is not None:
        assert s["LDG.128"] == vpt and s["STG.128"] == vpt
    ptx = files["ptx"].read_text()
    assert "barrier.cluster" not in ptx and "mapa" not in ptx  # grid y, no cluster, even where cluster_n > 1
    lines = _sass_lines(sass_or_skip(report, files))
    first_exp = next(i for i, ln in enumerate(lines) if "MUFU.EX2" in ln)
    loads = [i for i, ln in enumerate(lines) if "LDG" in ln]
    assert len(loads) == vpt + 4 and max(loads) < first_exp  # x's vectors + target (2 x 32 bit), lse, dloss
    # one base register for every vector of the row, the vectors at constant offsets from it
    bases = {re.search(r"\[(R\d+)\.64", ln).group(1) for ln in lines if "LDG.E.128" in ln}
    assert len(bases) == 1, bases


@pytest.mark.parametrize("dtype,aligned,n,index64", [
    ("fp16", True, 4096, False), ("fp32", True, 4096, False), ("fp32", True, 262144, False),
    ("bf16", True, 4096, True), ("bf16", False, 7, False), ("bf16", False, 769, False),
    ("bf16", False, 4097, False), ("fp32", False, 4097, False)])
def test_other_variants(dtype, aligned, n, index64, tmp_path):
    vec = (8 if dtype != "fp32" else 4) if aligned else 1
    report, _ = _compile(_params(plan_for_rows("ce_bwd", n, vec), dtype, aligned, index64), tmp_path)
    assert (report.ptx_census["ld.global.v4 (128-bit)"] > 0) == aligned


@pytest.mark.parametrize("n", [4096, 65536])
def test_tune_candidates_compile(n, tmp_path):
    from perf.tune_rows import ce_bwd_candidates

    cands = ce_bwd_candidates(n)
    assert plan_for_rows("ce_bwd", n, 8) in cands
    for i, plan in enumerate(cands):
        _compile(_params(plan), tmp_path / str(i))
