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


STREAM_CASES = [{}, {"col_tiles": 2, "zeros": True, "group": 32, "consumer_warps": 4, "m_tiles": 2, "stages": 3},
                {"col_tiles": 8, "dtype": "fp16", "group": 0, "consumer_warps": 8, "m_tiles": 1, "stages": 3}]


@pytest.mark.parametrize("over", STREAM_CASES, ids=[str(c) for c in STREAM_CASES])
def test_stream_census(over, tmp_path):
    """The streaming kernel: W and x by TMA (UTMALDG), 128-bit shared-memory reads of the units and of x, HMMA on the
    dequantized weight, no local memory; groups of 128+ scale the fp32 sums (FFMA, no packed multiply), smaller groups
    multiply the weight pairs (HMUL2)."""
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get("w4a16.stream")
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    assert not report.spills, report.format()
    assert report.ptx_census["cp.async.bulk.tensor"] == 5  # one W box and four x boxes a stage
    if "sass" in files:
        sass = files["sass"].read_text()
        assert "UTMALDG" in sass and "LDS.128" in sass and "HMMA.16816.F32" in sass and "LOP3.LUT" in sass
        mul = "HMUL2.BF16" if p["dtype"] == "bf16" else "HMUL2"
        assert (mul in sass) == (p["group"] in (32, 64))


@pytest.mark.parametrize("name,over", [("w4a16.stream", {"gated": True, "consumer_warps": 4, "m_tiles": 2,
                                                         "stages": 3}),
                                       ("w4a16.stream", {"source": True}), ("gemv.stream", {"gated": True}),
                                       ("gemv.stream", {"source": True, "col_tiles": 2})])
def test_stream_epilogue_options(name, over, tmp_path):
    """The streaming kernels' epilogue options compile clean: the gated one takes the fast sigmoid (ex2 and the
    hardware reciprocal, no IEEE division), the source one reads src (16-bit global loads the plain variant has
    not); no local memory either way."""
    import re

    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get(name)
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path / "opt"))
    plain, plain_files = compile_with_artifacts(spec, spec.resolve({k: v for k, v in over.items()
                                                                    if k not in ("gated", "source")}),
                                                str(tmp_path / "plain"))
    assert not report.spills and not plain.spills, report.format()
    ptx, plain_ptx = files["ptx"].read_text(), plain_files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    if over.get("gated"):
        assert "rcp.approx" in ptx and "ex2.approx" in ptx and "div.rn.f32" not in ptx
    else:
        def loads(t):
            return len(re.findall(r"ld\.global(\.\w+)*\.(b16|u16)", t))
        assert loads(ptx) > loads(plain_ptx)


def test_spec_refuses_gated_with_source():
    from cute_kernels import catalog

    for name in ("w4a16.stream", "gemv.stream"):
        with pytest.raises(ValueError, match="gated epilogue takes no source"):
            catalog.get(name).resolve({"gated": True, "source": True})
