"""CPU: the FP8 quantizers (issue 5) and the norms' fused FP8 output (issue 3) compile for sm_90a
and do the rounding `collectives.quantize` documents: cvt.rn.satfinite.e4m3x2.f32, a correctly
rounded scale division (div.rn.f32) and reciprocal (rcp.rn.f32), no flush-to-zero, the
NaN-ignoring max.f32; 128-bit loads on aligned inputs, nothing in local memory, registers within
the occupancy the ops assume."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

QUANT = {
    "1x128": {},
    "1x128_fp32_ue8m0": {"dtype": "fp32", "ue8m0": True},
    "1x128_unaligned": {"aligned": False},
    "1x128_index64": {"index64": True},
    "128x128": {},
    "128x128_fp16_ue8m0": {"dtype": "fp16", "ue8m0": True},
    "128x128_unaligned": {"aligned": False},
}


def _compile(name, over, tmp_path):
    spec = catalog.get(name)
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    return spec.resolve(over), report, files["ptx"].read_text()


def check_rounding(ptx: str, ue8m0: bool = False):
    """The instructions that make the kernels bitwise equal to the torch reference."""
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert re.search(r"div\.rn\.f32\s+%r\d+, %r\d+, 0f43E00000;", ptx), "scale = amax / 448, IEEE"
    assert "rcp.rn.f32" in ptx and "rcp.approx" not in ptx.split("div.rn.f32")[1]
    assert "0f38D1B717" in ptx  # the 1e-4 amax floor
    assert ".ftz" not in ptx and "max.NaN" not in ptx
    if ue8m0:
        assert "8388607" in ptx  # the mantissa mask of the power-of-two round-up


@pytest.mark.parametrize("case", list(QUANT))
def test_quantizer_census(case, tmp_path):
    name = "quantize." + case.split("_")[0]
    p, report, ptx = _compile(name, QUANT[case], tmp_path)
    k = report.kernels[0]
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    assert k.registers <= 64, report.format()  # ops/fp8_gemm._QUANT_CTAS_PER_SM assumes it
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
