"""CPU: the W4A16 tensor-core kernel compiles for sm_90a: HMMA m16n8k16, 128-bit loads of the packed weight, the
int4 dequantized by LOP3 and packed 16-bit multiplies, no local memory; the dense GEMV mainloop it generalizes
keeps no such instructions."""

import pytest

CASES = [{}, {"cols": 16, "zeros": True, "group": 32}, {"cols": 4, "dtype": "fp16", "group": 0, "row_blocks": 1}]


@pytest.mark.parametrize("over", CASES, ids=[str(c) for c in CASES])
def test_census(over, tmp_path):
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get("w4a16.mma")
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    assert not report.spills, report.format()
    assert report.ptx_census["ld.global.v4 (128-bit)"] > 0
    if "sass" in files:
        sass = files["sass"].read_text()
        mul = "HMUL2.BF16" if over.get("dtype", "bf16") == "bf16" else "HMUL2"
        assert "HMMA.16816.F32" in sass and "LOP3.LUT" in sass and mul in sass
