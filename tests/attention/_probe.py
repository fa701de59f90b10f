"""Trace-time probe for tests/attention/test_forward_compile.py (cute.compile needs functions from a real file):
the (row, column) each accumulator register of a 64 x tile_n WGMMA holds, seen through
`acc_rows_view`, and the A-operand coordinates of the P V WGMMA against `acc_as_a_operand`'s regrouping;
Q's operand per consumer warpgroup, the stage-indexed partition against `FlashAttnFwd.q_fragment`'s."""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

from collectives.online_softmax import acc_rows_view
from collectives.tma_pipeline import operand_smem_layout
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


@cute.jit
def q_probe(d: cutlass.Constexpr, wgs: cutlass.Constexpr):
    """Q's A-operand coordinates per consumer warpgroup, the old way (a one-warpgroup partition of (64, D, wgs),
    the stage indexed by the warpgroup) and `FlashAttnFwd.q_fragment`'s (one atom per warpgroup over
    ((64, wgs), D), sliced at the warpgroup's first thread)."""
    dt = cutlass.BFloat16
    qk = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
                                           tiler_mn=(64, 128))
    per_wg = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
                                               (wgs, 1, 1), tiler_mn=(64, 128))
    res = []
    for w in cutlass.range_constexpr(wgs):
        old = qk.get_slice(5).partition_A(cute.make_identity_tensor((64, d, wgs)))[(None, None, None, w)]
        new = per_wg.get_slice(w * 128).partition_A(cute.make_identity_tensor(((64, wgs), d)))
        res.append(([tuple(old[i]) for i in range(cute.size(old))], [new[i] for i in range(cute.size(new))],
                    str(old.layout), str(new.layout)))
    # ... and the smem offsets: the regrouped view of Q's layout maps ((r, w), c) where the staged one maps (r, c, w)
    staged = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, 64, d, wgs).outer
    regrouped = cute.group_modes(cute.select(staged, mode=[0, 2, 1]), 0, 2)
    offsets = [(cute.crd2idx((r, c, w), staged), cute.crd2idx(((r, w), c), regrouped))
               for r in (0, 1, 7, 8, 9, 63) for c in (0, 1, 15, 63, 64, d - 1) for w in range(wgs)]
    OUT[("q", d, wgs)] = res, offsets
