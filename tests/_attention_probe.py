"""Trace-time probe for tests/test_attention_compile.py (cute.compile needs functions from a real file):
the (row, column) each accumulator register of a 64 x tile_n WGMMA holds, seen through
`acc_rows_view`, and the A-operand coordinates of the P V WGMMA against `acc_as_a_operand`'s regrouping."""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

from collectives.online_softmax import acc_rows_view
from collectives.wgmma_mainloop import acc_a_view

OUT: dict = {}


@cute.jit
def probe(tile_n: cutlass.Constexpr, d: cutlass.Constexpr):
    dt = cutlass.BFloat16
    qk = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
                                           tiler_mn=(64, tile_n))
    pv = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32,
                                           (1, 1, 1), tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)
    res = []
    for t in (0, 1, 2, 3, 5, 37, 64, 127):
        c = qk.get_slice(t).partition_C(cute.make_identity_tensor((64, tile_n)))
        a = pv.get_slice(t).partition_A(cute.make_identity_tensor((64, tile_n)))
        rows = acc_rows_view(c)
        cv = acc_a_view(c)
        rr = [[tuple(rows[i, j]) for j in range(cute.size(rows, mode=[1]))] for i in range(cute.size(rows, mode=[0]))]
        res.append((t, rr, [tuple(a[i]) for i in range(cute.size(a))], [tuple(cv[i]) for i in range(cute.size(cv))]))
    OUT[(tile_n, d)] = res
