"""CPU: the tensor-core GEMV compiles for sm_90a without spills for its plan shapes; the SASS runs
HMMA.16816.F32.BF16 / HMMA.16816.F32 (fp16) and reads W and x only with 128-bit loads; `plan_gemv_mma` picks one or two
row blocks and 4-16 warps as documented."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.gemv import plan_gemv_mma
from tests.helpers import sass_or_skip

SPEC = catalog.get("gemv.mma")


@pytest.mark.parametrize("over", [{}, {"cols": 3, "dtype": "fp16", "row_blocks": 1, "warps": 16},
                                  {"cols": 8, "row_blocks": 4, "unroll": 4, "index64": True}], ids=str)
def test_gemv_mma_compiles(over, tmp_path):
    report, files = compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path))
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    assert report.ptx_census["ld.global (all)"] == report.ptx_census["ld.global.v4 (128-bit)"]
    sass = sass_or_skip(report, files)
    assert ("HMMA.16816.F32 " if over.get("dtype") == "fp16" else "HMMA.16816.F32.BF16 ") in sass


def test_plan_gemv_mma():
    p = plan_gemv_mma(16384, 16384, 132)
    assert (p.row_blocks, p.warps, p.unroll) == (2, 4, 4)  # 1024 CTAs
    p = plan_gemv_mma(4096, 4096, 132)
    assert (p.row_blocks, p.warps, p.unroll) == (2, 16, 2)  # 256 CTAs
    p = plan_gemv_mma(1024, 16384, 132)
    assert (p.row_blocks, p.warps) == (1, 16)  # 128 CTAs
    p = plan_gemv_mma(1, 64, 132)
    assert p.warps == 4  # two chunks: no more warps than work


def test_use_tensor_cores():
    from schedules.gemv import use_tensor_cores

    assert not use_tensor_cores(16384, 1, 132)
    assert use_tensor_cores(16384, 2, 132) and use_tensor_cores(2112, 2, 132)
    assert not use_tensor_cores(1024, 2, 132) and not use_tensor_cores(1024, 4, 132)
    assert use_tensor_cores(1024, 5, 132) and use_tensor_cores(1024, 8, 132)



def test_chunk_slots_match_the_mma_fragments():
    """`chunk_slot` (the K permutation the kernel's register moves implement) against the DSL's own
    m16n8k16 fragment layouts (layout algebra, traced on the CPU): B value e of lane 4g+c is W row g at the
    MMA's k slot chunk_slot(...)[0]; A values 0, 1, 4, 5 (x) are row g at the same slots, 2, 3, 6, 7 row
    g+8 (the zero half); and over the chunk's two MMAs each lane's memory k is 8c..8c+7, once each."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32
    from cutlass.cute.nvgpu import warp

    from cute_kernels.gemv.mma import chunk_slot

    seen = {}

    @cute.jit
    def probe():
        tiled = cute.make_tiled_mma(warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)))
        la, lb = tiled.tv_layout_A, tiled.tv_layout_B
        for lane in cutlass.range_constexpr(32):  # static: the layouts evaluate to Python ints
            seen[lane] = ([int(la((lane, v))) for v in range(8)], [int(lb((lane, v))) for v in range(4)])

    probe()
    for lane, (a_idx, b_idx) in seen.items():
        g, c = lane // 4, lane % 4
        for e in range(4):
            slot = chunk_slot(lane, 0, e)[0]
            assert (b_idx[e] % 8, b_idx[e] // 8) == (g, slot), (lane, e)  # B: (n, k) of an 8 x 16 tile
            va = (0, 1, 4, 5)[e]
            assert (a_idx[va] % 16, a_idx[va] // 16) == (g, slot), (lane, e)  # A: (m, k) of 16 x 16
            vz = (2, 3, 6, 7)[e]
            assert (a_idx[vz] % 16, a_idx[vz] // 16) == (g + 8, slot), (lane, e)
        mem = sorted(chunk_slot(lane, t, e)[1] for t in range(2) for e in range(4))
        assert mem == list(range(8 * c, 8 * c + 8))
