"""Trace-time probes for tests/attention/test_fp8_forward_cpu.py (cute.compile needs functions from a real file): the
(row, column) each register of P's FP8 A operand holds against the S accumulator's regrouping
(`acc_a_view_fp8`), and the byte offsets of V's and V^T's swizzled smem layouts with their closed forms."""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

from collectives.fp8_attention import E4M3, KMajorBytes, acc_a_view_fp8
from collectives.tma_pipeline import operand_smem_layout

OUT: dict = {}


@cute.jit
def p_probe(tile_n: cutlass.Constexpr, d: cutlass.Constexpr):
    k = OperandMajorMode.K
    qk = sm90_utils.make_trivial_tiled_mma(E4M3, E4M3, k, k, cutlass.Float32, (1, 1, 1), tiler_mn=(64, tile_n))
    pv = sm90_utils.make_trivial_tiled_mma(E4M3, E4M3, k, k, cutlass.Float32, (1, 1, 1), tiler_mn=(64, d),
                                           a_source=warpgroup.OperandSource.RMEM)
    res = []
    for t in cutlass.range_constexpr(128):
        c = qk.get_slice(t).partition_C(cute.make_identity_tensor((64, tile_n)))
        a = pv.get_slice(t).partition_A(cute.make_identity_tensor((64, tile_n)))
        cv = acc_a_view_fp8(c)
        res.append((t, [tuple(a[i]) for i in range(cute.size(a))], [tuple(cv[i]) for i in range(cute.size(cv))],
                    str(pv.get_slice(t).partition_shape_A((64, tile_n))), str(cv.shape)))
    OUT[("p", tile_n, d)] = res


@cute.jit
def smem_probe(tile_n: cutlass.Constexpr, d: cutlass.Constexpr):
    """Byte offsets of V (tile_n, D) and V^T (D, tile_n) as the kernel lays them out (stage 1 of 2), and their
    `KMajorBytes` (the closed forms the transposing step computes its addresses with)."""
    res = {}
    for name, rows, cols in (("v", tile_n, d), ("vt", d, tile_n)):
        lay = operand_smem_layout(LayoutEnum.ROW_MAJOR, E4M3, rows, cols, 2)
        byte = [[cute.crd2idx((r, c, 1), lay) for c in range(cols)] for r in range(rows)]
        res[name] = (byte, KMajorBytes.of(lay))
    OUT[("smem", tile_n, d)] = res
