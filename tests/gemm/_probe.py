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


@cute.jit
def glu_probe(tile_n: cutlass.Constexpr, atoms: cutlass.Constexpr, rows: cutlass.Constexpr):
    """The gated epilogue's maps (`epilogue.glu_pairs`) for a tile, and for several threads the (row, column) of each
    product's register in the half-width MMA beside those of its gate and up registers in the full one."""
    from collectives.epilogue import glu_pairs

    dt = cutlass.BFloat16
    full, half = (sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
                                                    atoms, tiler_mn=(64, n)) for n in (tile_n, tile_n // 2))
    gate, up = glu_pairs(full, half, rows, tile_n)
    res = []
    for t in (0, 1, 6, 37, 101, 127) + ((128, 200, 255) if atoms[0] == 2 else ()):
        cf = full.get_slice(t).partition_C(cute.make_identity_tensor((rows, tile_n)))
        ch = half.get_slice(t).partition_C(cute.make_identity_tensor((rows, tile_n // 2)))
        res.append((t, [tuple(ch[i]) for i in range(cute.size(ch))], [tuple(cf[g]) for g in gate],
                    [tuple(cf[u]) for u in up]))
    OUT[("glu", tile_n, atoms, rows)] = res
