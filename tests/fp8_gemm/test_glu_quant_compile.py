"""CPU: the FP8 GEMM's SwiGLU + 1x128 quantization epilogue (`glu_quant`) compiles for sm_90a, dense and grouped
contiguous, without spills and within the consumers' registers; its exchange is 16-byte `st.async` stores into the
peer CTA (four a thread) and one fp32 amax half a row ("full": eight, no amax, a warp's arrival when it has read;
"local": a 128 x 256 tile a CTA, nothing exchanged), its output two-byte global stores straight from registers (no
staging, no CTA barrier) and fp32 scales; the schedule rules name what they refuse; the op's fake gives
`quantize_1x128`'s layouts."""

import pytest
import torch

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.fp8_gemm import fp8_schedule, glu_quant_bytes, glu_quant_error
from tests.helpers import assert_within_registers, sass_instructions, sass_or_skip

SPEC = catalog.get("fp8_gemm")
BASE = {"cluster_m": 1, "cluster_n": 2, "glu_quant": True, "epi_stages": 3}
CONFIGS = {"contiguous": {**BASE, "grouping": "contiguous"}, "contiguous_sb_smem": {**BASE, "grouping": "contiguous",
                                                                                  "sb_smem": True},
           "dense": BASE, "contiguous_full": {**BASE, "grouping": "contiguous", "glu_exchange": "full",
                                              "epi_stages": 4},
           "contiguous_local": {"cluster_m": 1, "cluster_n": 1, "tile_n": 256, "glu_quant": True,
                                "glu_exchange": "local", "promote_halves": True, "epi_stages": 2,
                                "grouping": "contiguous"}}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
            for name, over in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_exchange_in_ptx(artifacts, name):
    report, files = artifacts[name]
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    full = CONFIGS[name].get("glu_exchange") == "full"
    local = CONFIGS[name].get("glu_exchange") == "local"
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32") == (
        0 if local else 8 if full else 4)
    # "halves": a thread's two rows' amax halves; "full": none, a warp's "read" arrival in the peer instead
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32") == (0 if full or local else 2)
    assert ("mbarrier.arrive.release.cluster.shared::cluster" in ptx) == full
    outputs = 64 if local else 32  # a thread's outputs ("local": 128 of a row's columns over its quad)
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == outputs // 2
    assert ptx.count("st.global.v2.b8") == outputs // 2  # a column pair a store
    if not local:
        assert "bar.sync" not in ptx.split("st.async")[-1], "a CTA barrier after the exchange"
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sass_wgmma_and_registers(artifacts, name):
    report, files = artifacts[name]
    sass = sass_or_skip(report, files)
    ops = sass_instructions(sass)
    assert {op for op, _ in ops if op.startswith("QGMMA")} == {"QGMMA.64x128x32.F32.E4M3.E4M3"}  # ("local": halves)
    assert_within_registers(report, sass, 232)


def test_schedule_rules():
    ok = fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2, epi_stages=3)
    assert glu_quant_error(ok, True, "contiguous") is None
    assert "1x2 clusters" in glu_quant_error(fp8_schedule("cooperative", 128, 128, cluster_m=2), True, "contiguous")
    assert "1x2 clusters" in glu_quant_error(fp8_schedule("cooperative", 128, 192, cluster_m=1, cluster_n=2))
    assert "dense or grouped contiguous" in glu_quant_error(ok, True, "masked")
    assert "epi_stages=4" in glu_quant_error(ok, exchange="full")
    assert glu_quant_error(fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2), exchange="full") is None
    small = fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2, epi_stages=2)
    assert "epilogue buffers" in glu_quant_error(small)
    assert glu_quant_bytes()[1] <= ok.epi_bytes(2)
    wide = fp8_schedule("cooperative", 128, 256, cluster_m=1, cluster_n=1, epi_stages=2)
    assert glu_quant_error(wide, exchange="local", promote_halves=True) is None
    assert "promote_halves=True" in glu_quant_error(wide, exchange="local")
    assert "128x256 tiles" in glu_quant_error(ok, exchange="local", promote_halves=True)
    assert "for glu_exchange='local'" in glu_quant_error(ok, promote_halves=True)
    with pytest.raises(ValueError, match="needs promote_halves"):
        SPEC.resolve({"tile_n": 256, "cluster_m": 1})  # the plain promotion: 2 x 128 registers
    with pytest.raises(ValueError, match="glu_quant"):
        SPEC.resolve({"glu_quant": True})  # the default 2x1 cluster


def test_fake_layouts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cute_kernels as ck

    ck.load_ops()
    with FakeTensorMode():
        a = torch.empty(258, 512, dtype=torch.float8_e4m3fn, device="cuda")
        sa = torch.empty_strided((258, 4), (1, 260), dtype=torch.float32, device="cuda")
        b = torch.empty(3, 512, 512, dtype=torch.float8_e4m3fn, device="cuda")
        sb = torch.empty(3, 4, 4, dtype=torch.float32, device="cuda")
        idx = torch.empty(258, dtype=torch.int32, device="cuda")
        q, s = torch.ops.cute_kernels.fp8_gemm_grouped_contiguous_swiglu(a, sa, b, sb, idx)
        assert q.shape == (258, 256) and q.dtype == torch.float8_e4m3fn
        assert s.shape == (258, 2) and s.stride() == (1, 260)
        with pytest.raises(ValueError, match="even"):
            torch.ops.cute_kernels.fp8_gemm_grouped_contiguous_swiglu(
                a, sa, torch.empty(3, 510 + 1, 512, dtype=torch.float8_e4m3fn, device="cuda"), sb, idx)
