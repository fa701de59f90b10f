"""Trace-time probe for tests/gemm/test_pipeline_options_compile.py (cute.compile needs functions from a real
file): the (row, column) each accumulator register holds in the cooperative two-warpgroup MMA over a
128 x tile_n tile, and in the one-warpgroup MMA over 64 x tile_n that the `wg_epilogue` option stores
through, for threads of both warpgroups."""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode

OUT: dict = {}
THREADS = (0, 1, 5, 37, 127, 128, 129, 133, 165, 255)


@cute.jit
def probe(tile_n: cutlass.Constexpr, a_mn: cutlass.Constexpr):
    dt = cutlass.BFloat16
    a_mode = OperandMajorMode.MN if a_mn else OperandMajorMode.K
    two = sm90_utils.make_trivial_tiled_mma(dt, dt, a_mode, OperandMajorMode.K, cutlass.Float32, (2, 1, 1),
                                            tiler_mn=(64, tile_n))
    one = sm90_utils.make_trivial_tiled_mma(dt, dt, a_mode, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
                                            tiler_mn=(64, tile_n))
    res = []
    for t in THREADS:
        c2 = two.get_slice(t).partition_C(cute.make_identity_tensor((128, tile_n)))
        c1 = one.get_slice(t % 128).partition_C(cute.make_identity_tensor((64, tile_n)))
        res.append((t, str(c2.shape), str(c1.shape), [tuple(c2[i]) for i in range(cute.size(c2))],
                    [tuple(c1[i]) for i in range(cute.size(c1))]))
    OUT[(tile_n, a_mn)] = res
