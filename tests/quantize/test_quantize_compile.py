"""CPU: the FP8 quantizers (issue 5) and the norms' fused FP8 output (issue 3) compile for sm_90a
and do the rounding `collectives.quantize` documents: cvt.rn.satfinite.e4m3x2.f32, a correctly
rounded scale division (div.rn.f32) and reciprocal (rcp.rn.f32), no flush-to-zero, the
NaN-ignoring max.f32; 128-bit loads on aligned inputs, nothing in local memory, registers within
the occupancy the ops assume."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import loads_128_bits

QUANT = {
    "1x128": {},
    "1x128_fp32_ue8m0": {"dtype": "fp32", "ue8m0": True},
    "1x128_unaligned": {"aligned": False, "passes": 1},  # what the op runs
    "1x128_index64": {"index64": True},
    "128x128": {},
    "128x128_fp16_ue8m0": {"dtype": "fp16", "ue8m0": True},
    "128x128_unaligned": {"aligned": False},
}


def files_sass(tmp_path) -> str:
    return "".join(f.read_text() for f in tmp_path.glob("*.sass"))


def _compile(name, over, tmp_path):
    spec = catalog.get(name)
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    return spec.resolve(over), report, files["ptx"].read_text()


def check_rounding(ptx: str, ue8m0: bool = False, whole_kernel: bool = True):
    """The instructions that make the kernels bitwise equal to the torch reference: e4m3 by
    cvt.rn.satfinite; scale = amax / 448 by Markstein's fma sequence on RN(1/448) = 0f3B124925
    (correctly rounded, no div.rn.f32 and its slow-path call); 1 / scale by rcp.approx + one fma
    Newton step (rcp.rn.f32's fast path); the NaN-ignoring max.f32; no flush-to-zero in the
    quantization (`whole_kernel`: none anywhere but the rcp.approx seed; the norms keep their own
    approximate rcp/rsqrt)."""
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert re.search(r"fma\.rn\.f32\s+%r\d+, %r\d+, 0fC3E00000, %r\d+;", ptx), "remainder a - q0 * 448"
    assert re.search(r"fma\.rn\.f32\s+%r\d+, %r\d+, 0f3B124925, %r\d+;", ptx), "q0 + r * RN(1/448)"
    assert re.search(r"fma\.rn\.f32\s+%r\d+, %r\d+, %r\d+, 0f3F800000;", ptx), "Newton step 1 - s * y0"
    assert "div.rn.f32" not in ptx and "rcp.rn.f32" not in ptx
    assert "0f38D1B717" in ptx  # the 1e-4 amax floor
    assert "max.NaN" not in ptx and "max.ftz" not in ptx and "mul.ftz" not in ptx and "fma.rn.ftz" not in ptx
    if whole_kernel:
        assert ptx.count(".ftz") == ptx.count("rcp.approx.ftz.f32")
    if ue8m0:
        assert "8388607" in ptx  # the mantissa mask of the power-of-two round-up


@pytest.mark.parametrize("case", list(QUANT))
def test_quantizer_census(case, tmp_path):
    name = "quantize." + case.split("_")[0]
    p, report, ptx = _compile(name, QUANT[case], tmp_path)
    k = report.kernels[0]
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    assert k.registers <= 64, report.format()  # ops/fp8_gemm._QUANT_CTAS_PER_SM assumes it
    if report.sass_census is not None:
        assert "f32_slowpath" not in files_sass(tmp_path)  # no float division subroutine calls
    check_rounding(ptx, p["ue8m0"])
    loads = report.ptx_census["ld.global.v4 (128-bit)"]
    if p["aligned"]:
        assert loads > 0 and ("st.global.v2.b32" in ptx or p["dtype"] == "fp32")  # 8 e4m3 per store
    else:
        assert loads == 0
    if case.startswith("128x128"):
        assert "bar.sync" in ptx  # the CTA-wide amax
    else:
        assert "bar.sync" not in ptx and report.ptx_census["shfl.sync"] > 0  # 8-lane butterflies only


# --- the norms' fused FP8 output (issue 3) -------------------------------------------------------
def _norm_params(name, n, dtype="bf16", aligned=True, **extra):
    """The parameters the ops build for this signature (`ops._rowwise.kernel_params`: the production plan, without its
    register cap beside an FP8 output or a residual)."""
    import torch

    from cute_kernels.rowwise.launch import kernel_params

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    return catalog.get(name).resolve(kernel_params(name, dt, n, aligned, **extra))


NORMS = {  # (kernel, row length, overrides): one CTA, short rows (blocks across k), scalar rows, clusters
    "rms_token_4096": ("rmsnorm.fwd", 4096, {}),
    "rms_block_4096": ("rmsnorm.fwd", 4096, {}),
    "rms_block_256": ("rmsnorm.fwd", 256, {}),
    "rms_block_769_scalar": ("rmsnorm.fwd", 769, {"aligned": False}),
    "rms_token_131072_cluster": ("rmsnorm.fwd", 131072, {}),
    "rms_block_131072_cluster": ("rmsnorm.fwd", 131072, {}),
    "ln_token_8192_fp32": ("layernorm.fwd", 8192, {"dtype": "fp32"}),
    "ln_block_7168_residual": ("layernorm.fwd", 7168, {"residual": True}),
}


@pytest.mark.parametrize("case", list(NORMS))
def test_norm_fp8_census(case, tmp_path):
    name, n, over = NORMS[case]
    mode = "per_token" if "_token_" in case else "block128"
    p = _norm_params(name, n, **{**over, "fp8_out": mode})
    report, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    ptx = files["ptx"].read_text()
    k = report.kernels[0]
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    assert k.registers <= min(255, 65536 // p["threads"]), report.format()
    check_rounding(ptx, whole_kernel=False)
    assert "cvt.rn.bf16" in ptx or p["dtype"] != "bf16"  # y rounded to x's dtype before quantizing
    if p["aligned"]:
        assert loads_128_bits(report, ptx, p)
    if p["cluster_n"] > 1:  # remote stores into the cluster: plain, or st.async on the mbarrier-synced plans
        assert ("st.async" in ptx) if p.get("cluster_sync") == "mbarrier" else ("st.shared::cluster" in ptx)


def test_norm_without_fp8_is_unchanged(tmp_path):
    """fp8_out=none: no e4m3 conversion, y stored in x's dtype as before."""
    p = _norm_params("rmsnorm.fwd", 4096)
    report, files = compile_with_artifacts(catalog.get("rmsnorm.fwd"), p, str(tmp_path))
    ptx = files["ptx"].read_text()
    assert "e4m3" not in ptx and report.ptx_census["st.global.v4 (128-bit)"] > 0
