"""CPU: the QAT kernels compile for sm_90a without local memory and with the instructions their rules need:
128-bit accesses of x / dy, round-to-nearest-even (`cvt.rni`), max / min clamps, the fused rint(fma) of float zero
points, e4m3 conversions (`cvt.rn.satfinite`), one byte of STE mask per 8 elements, butterflies and the last-CTA
hand-off (one atomic add, no float atomics) in the reductions, NaN-propagating min / max in the observer and its
fp64 qparams without IEEE division subroutines."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

CASES = [
    ("qat.fake_quant", {}),
    ("qat.fake_quant", {"mode": "vector", "zp": "float"}),
    ("qat.fake_quant", {"qtype": "e4m3", "mode": "tensor", "dtype": "fp16"}),
    ("qat.fake_quant", {"mode": "element", "dtype": "fp32", "mask": False, "zp": "round", "gated": True}),
    ("qat.ste_bwd", {}),
    ("qat.learnable_bwd", {}),
    ("qat.learnable_bwd", {"merge": False, "zp": "round", "threads_per_row": 64}),
    ("qat.observe", {}),
    ("qat.observe", {"symmetric": True, "merge": False, "threads_per_row": 64, "dtype": "fp32"}),
    ("qat.learnable_bwd", {"aligned": False, "threads_per_row": 8}),
    ("qat.observe", {"aligned": False, "threads_per_row": 8, "index64": True}),
    ("qat.observe_rows", {}),
    (
        "qat.observe_rows",
        {"symmetric": False, "mask": False, "dtype": "fp16", "threads": 512, "threads_per_row": 512, "unroll": 8},
    ),
    ("qat.observe_rows", {"threads_per_row": 16, "unroll": 3}),
    ("qat.observe_rows", {"staging": "regs"}),
    ("qat.observe_rows", {"prefetch": False}),
    ("qat.observe_rows", {"staging": "regs", "prefetch": False}),
    ("qat.observe_rows", {"dtype": "fp32", "threads_per_row": 2, "unroll": 4}),
]


def _id(case):
    name, over = case
    return name + ("[" + ",".join(f"{k}={v}" for k, v in over.items()) + "]" if over else "")


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_compiles_with_its_instructions(case, tmp_path):
    name, over = case
    spec = catalog.get(name)
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    ptx = files["ptx"].read_text()
    census = report.ptx_census
    assert not report.spills, report.format()
    assert census["ld/st.local"] == 0 and ".local" not in ptx
    if p.get("staging") == "smem":  # the held row's loads are 16-byte cp.async copies into shared memory
        assert re.search(r"cp\.async\.cg\.shared\.global(\.L2::\w+)? \[[^\]]+\], \[[^\]]+\], 16", ptx)
    else:
        assert (census["ld.global.v4 (128-bit)"] > 0) == p.get("aligned", True)  # rows of odd length: scalar accesses
    assert not re.search(r"\b(div|rcp)\.rn\.f(32|64)\b", ptx), "IEEE division: a slow-path subroutine per call"
    assert "call" not in re.findall(r"^\s*(call)\b", ptx, re.M)
    assert "atom.global.add.f32" not in ptx and "red.global.add.f32" not in ptx  # deterministic: no float atomics
    if name == "qat.fake_quant":
        assert census["st.global.v4 (128-bit)"] > 0
        if p["qtype"] == "e4m3":
            assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") >= 4 and "cvt.rni.f32.f32" not in ptx
        else:
            assert ptx.count("cvt.rni.f32.f32") >= 8 and "max.f32" in ptx and "min.f32" in ptx
        if p["zp"] == "float":  # rint(fma(x, inv, zp)): one rounding before the rint
            assert re.search(r"fma\.rn\.f32\s+(%r\d+),[^\n]*\n\s*cvt\.rni\.f32\.f32\s+%r\d+, \1;", ptx)
        assert ("st.global.b8" in ptx) == p["mask"]
    if name == "qat.ste_bwd":
        assert "ld.global.b8" in ptx and census["st.global.v4 (128-bit)"] > 0
    if name in ("qat.learnable_bwd", "qat.observe", "qat.observe_rows"):
        assert census["shfl.sync"] > 0
    if name == "qat.observe_rows":  # the held row written back whole, its mask a byte a vector
        assert census["st.global.v4 (128-bit)"] == p["unroll"] and ("st.global.b8" in ptx) == p["mask"]
        assert "max.NaN.f32" in ptx and "min.NaN.f32" in ptx and "atom.global" not in ptx
        assert "rcp.approx.ftz.f64" in ptx and ptx.count("cvt.rni.f32.f32") >= 8
        if p["staging"] == "smem":  # prefetch: each row waits for its own copies, the next row's left in flight
            assert bool(re.search(r"cp\.async\.wait_group\s+1;", ptx)) == p["prefetch"]
    if name in ("qat.learnable_bwd", "qat.observe"):
        assert ("atom.global.add.u32" in ptx) == p["merge"]  # the last-CTA count (collectives.split_counter)
    if name == "qat.learnable_bwd":
        assert (census["st.global.v4 (128-bit)"] > 0) == p["aligned"] and "cvt.rni.f32.f32" in ptx
    if name == "qat.observe":
        assert "min.NaN.f32" in ptx and "max.NaN.f32" in ptx
        assert "rcp.approx.ftz.f64" in ptx and "cvt.rni.f64.f64" in ptx
