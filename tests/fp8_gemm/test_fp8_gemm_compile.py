"""CPU: the FP8 block-scaled GEMM compiles for sm_90a and is what it claims to be: e4m3 WGMMA
(QGMMA in SASS), TMA loads of A, B and the A scales, the register hand-over (setmaxnreg), the
promotion on the CUDA cores (one FFMA per accumulator element per K-block, the A scales read from
shared memory), and nothing in local memory; the bf16 GEMM built from the same kernel body is
untouched by the FP8 mode."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "coop128x128": {},
    "pingpong64x128": {"schedule": "pingpong", "tile_m": 64},
    "coop128x64": {"tile_n": 64},
    "pingpong64x64": {"schedule": "pingpong", "tile_m": 64, "tile_n": 64},
    "cluster1x2": {"cluster_m": 1, "cluster_n": 2},
    "nonpersistent": {"cluster_m": 1, "persistent": False},
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = {}
    for name, over in CONFIGS.items():
        out[name] = compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_census(artifacts, name):
    report, files = artifacts[name]
    ptx = files["ptx"].read_text()
    assert not report.spills, report.format()
    census = report.ptx_census
    assert census["ld/st.local"] == 0 and census["setmaxnreg"] >= 2
    wgmma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k32)\.f32\.e4m3\.e4m3", ptx))
    assert wgmma, "no e4m3 x e4m3 -> f32 WGMMA in the PTX"
    assert "bf16" not in "".join(re.findall(r"wgmma\.mma_async[^ ]*", ptx))
    # A box, B box (multicast variant too when clustered), the A-scale box, and the TMA store.
    assert census["cp.async.bulk.tensor"] >= 4
    # Promotion: sa from the stage's shared memory (one ld.shared per distinct row of the thread),
    # sb from global, one FMA per accumulator element.
    tile_m = SPEC.resolve(CONFIGS[name])["tile_m"]
    tile_n = SPEC.resolve(CONFIGS[name])["tile_n"]
    acc = tile_m // (2 if tile_m == 128 else 1) * tile_n // 128
    assert len(re.findall(r"ld\.shared\.(?:b|f)32", ptx)) >= 2
    assert census["ld.global (all)"] >= 1
    assert len(re.findall(r"\bfma\.rn\.f32\b", ptx)) >= acc
    if report.sass_census is not None:
        sass = files["sass"].read_text()
        assert report.sass_census["HGMMA/QGMMA"] > 0 and "QGMMA" in sass and "HGMMA" not in sass
        assert report.sass_census["UTMALDG (TMA load)"] >= 3
        assert report.sass_census["UTMASTG (TMA store)"] > 0
        assert report.sass_census["LDL/STL (spills)"] == 0


def test_bf16_gemm_still_bf16(tmp_path):
    """The blockwise mode is a trace-time branch: the bf16 GEMM has no scale loads, no e4m3."""
    spec = catalog.get("gemm")
    report, files = compile_with_artifacts(spec, spec.resolve(), str(tmp_path))
    ptx = files["ptx"].read_text()
    assert "e4m3" not in ptx and ".bf16.bf16" in ptx
    assert report.ptx_census["ld.global (all)"] == 0 and not report.spills


def test_schedule_budget_errors():
    with pytest.raises(ValueError, match="accumulators per thread"):
        SPEC.resolve({"schedule": "pingpong", "tile_m": 128})
    with pytest.raises(ValueError, match="multiple of 128"):
        SPEC.resolve({"tile_m": 64})


@pytest.mark.parametrize("over", [{"schedule": "pingpong", "tile_m": 64, "cluster_m": 1, "split_k": 4},
                                  {"cluster_m": 1, "split_k": 2, "sb_smem": True}])
def test_split_k_one_launch(over, tmp_path):
    """FP8 split-K: one kernel (no summing pass), the promoted mainloop over the unit's K-blocks, the
    arrival atomic and the two GPU-scope fences of `split_fixup`, no local memory."""
    spec = catalog.get("fp8_gemm")
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    assert not report.spills and len(report.kernels) == 1, report.format()
    ptx = files["ptx"].read_text()
    assert ptx.count("atom.global.acq_rel.add") == 1 and ptx.count("fence.acq_rel.gpu") == 2
    assert report.ptx_census["wgmma.mma_async"] > 0 and "cp.async.bulk.tensor" in ptx
    # The arrival flags live in the storage's barrier pad, so the storage is still exactly the
    # accounting (at 64x128 the stages fill smem to within 8 bytes: a separate allocation overflowed
    # by 8 on the H200, session 12)
    from cute_kernels.fp8_gemm import schedule_of
    from cute_kernels.jit import compile_fn
    from cute_kernels.target import current_arch
    from schedules.fp8_gemm import smem_bytes
    from schedules.gemm import SMEM_BYTES

    fn, args = spec.build(p)
    compile_fn(fn, args, current_arch())
    s = schedule_of(p)
    assert fn.__self__.storage.size_in_bytes() == smem_bytes(s, sb_smem=p.get("sb_smem", False)) <= SMEM_BYTES
    with pytest.raises(ValueError, match="promote_halves"):
        spec.resolve({**over, "promote_halves": True})
