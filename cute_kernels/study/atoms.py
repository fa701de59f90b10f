"""The layouts Hopper kernels are built from, taken from the DSL objects themselves.

Nothing here is drawn by hand: each function asks the DSL for the object a kernel builds (the
WGMMA shared-memory layout atoms of `cute.nvgpu.warpgroup.make_smem_layout_atom`, the staged
operand layouts of `cutlass.utils.hopper_helpers.make_smem_layout_a/b`, the tiled MMA of
`make_trivial_tiled_mma` and its accumulator thread-value layout, the TMA copy atom of
`cpasync.make_tiled_tma_atom`) and converts it to this package's plain records. When a kernel's
configuration changes (tile, dtype, major-ness, warpgroups), the pictures change with it.

Where the project's GEMM collectives exist (`collectives/tma_pipeline.py`: `operand_smem_layout`,
`operand_tma`), `operand_smem` and `tma_boxes` call them, so the pictures are the kernels' own
layouts; otherwise they call the DSL helpers those collectives are built on.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass.cute as cute

from cute_kernels.study import banks as _banks
from cute_kernels.study.layout import Layout, evaluate, from_dsl, in_dsl, to_dsl

SMEM_KINDS = ("K_INTER", "K_SW32", "K_SW64", "K_SW128", "MN_INTER", "MN_SW32", "MN_SW64", "MN_SW128")

_DSL_DTYPES = {"bf16": "BFloat16", "fp16": "Float16", "fp8": "Float8E4M3FN", "e4m3": "Float8E4M3FN",
               "e5m2": "Float8E5M2", "int8": "Int8"}


def _dtype(name: str):
    import cutlass

    try:
        return getattr(cutlass, _DSL_DTYPES[name.lower()])
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(_DSL_DTYPES)} (a WGMMA operand type), got {name!r}") from None


def _major(major: str) -> str:
    m = major.lower()
    if m not in ("k", "mn"):
        raise ValueError(f"major must be 'k' or 'mn', got {major!r}")
    return m


# ----------------------------------------------------------------------------------------------
# shared-memory layout atoms

def smem_atom(kind: str, dtype: str = "bf16") -> Layout:
    """`warpgroup.make_smem_layout_atom(SmemLayoutAtomKind.<kind>, dtype)`: the swizzled atom,
    coordinates (MN, K); K-major atoms are 8 rows of one swizzle width, MN-major ones transposed."""
    if kind not in SMEM_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SMEM_KINDS)}, got {kind!r}")
    from cutlass.cute.nvgpu import warpgroup

    dt = _dtype(dtype)
    return in_dsl(lambda: from_dsl(warpgroup.make_smem_layout_atom(getattr(warpgroup.SmemLayoutAtomKind, kind), dt)))


def as_tile(layout: Layout, dtype: str, name: str | None = None) -> "_banks.SmemTile":
    """A swizzled rank-2 layout as a bank-model tile whose columns are the contiguous dimension:
    K-major (MN, K) atoms keep their orientation; MN-major ones (mode 0 contiguous) are drawn as
    (K, MN). The swizzle acts on byte addresses (as on the DSL's swizzled shared-memory pointer)."""
    m0, m1 = layout.mode(0), layout.mode(1)
    first0 = m0.stride[0] if isinstance(m0.stride, tuple) else m0.stride
    if first0 == 1 and m0.size > 1:
        m0, m1 = m1, m0
    outer = Layout((m0.shape, m1.shape), (m0.stride, m1.stride))
    return _banks.make_tile(m0.size, m1.size, _banks.dtype_bytes(dtype), layout=outer, swizzle=layout.swizzle,
                            name=name or str(layout))


def _pipeline_collective():
    """`collectives.tma_pipeline` (the GEMM kernels' own layout and TMA builders) when present."""
    try:
        from collectives import tma_pipeline
    except ImportError:
        return None
    if hasattr(tma_pipeline, "operand_smem_layout") and hasattr(tma_pipeline, "operand_tma"):
        return tma_pipeline
    return None


def operand_smem(operand: str = "a", major: str = "k", tile_mnk=(128, 128, 64), dtype: str = "bf16",
                 stages: int = 1) -> Layout:
    """The staged shared-memory layout of operand A (M, K) or B (N, K): built by the GEMM
    collective (`collectives.tma_pipeline.operand_smem_layout`) when it exists, else by the DSL's
    `hopper_helpers.make_smem_layout_a/b` (the same atom choice and tiling)."""
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.tensor_utils import LayoutEnum

    m = _major(major)
    if operand not in ("a", "b"):
        raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")
    # A: row-major (M, K) is K-major; B: the DSL names (N, K) with K contiguous ROW_MAJOR too
    enum = LayoutEnum.ROW_MAJOR if m == "k" else LayoutEnum.COL_MAJOR
    dt = _dtype(dtype)
    rows = tile_mnk[0] if operand == "a" else tile_mnk[1]
    coll = _pipeline_collective()
    if coll is not None:
        return in_dsl(lambda: from_dsl(coll.operand_smem_layout(enum, dt, rows, tile_mnk[2], stages)))
    fn = sm90.make_smem_layout_a if operand == "a" else sm90.make_smem_layout_b
    return in_dsl(lambda: from_dsl(fn(enum, tuple(tile_mnk), dt, stages)))


# ----------------------------------------------------------------------------------------------
# the accumulator of WGMMA

@dataclass(frozen=True)
class Accumulator:
    tv: Layout
    tile_mn: tuple[int, int]
    threads: int
    mma: str


def accumulator(n: int = 64, warpgroups: int = 1, dtype: str = "bf16", acc: str = "fp32") -> Accumulator:
    """The C thread-value layout of `make_trivial_tiled_mma(dtype, dtype, K, K, acc,
    (warpgroups, 1, 1), (64, n))`: which thread holds which accumulator of the (64*wg) x n tile."""
    import cutlass
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import OperandMajorMode

    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"WGMMA N must be a multiple of 8 in [8, 256], got {n}")
    if warpgroups not in (1, 2, 3, 4):
        raise ValueError(f"warpgroups must be 1..4, got {warpgroups}")
    dt = _dtype(dtype)
    acc_t = {"fp32": cutlass.Float32, "fp16": cutlass.Float16}.get(acc)
    if acc_t is None:
        raise ValueError(f"acc must be fp32 or fp16, got {acc!r}")

    def run():
        mma = sm90.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, acc_t,
                                          (warpgroups, 1, 1), (64, n))
        tv = from_dsl(mma.tv_layout_C_tiled)
        return Accumulator(tv, (int(mma.get_tile_size(0)), int(mma.get_tile_size(1))), int(cute.size(mma)),
                           str(mma.op).splitlines()[0] if str(mma.op) else "wgmma")

    return in_dsl(run)


# ----------------------------------------------------------------------------------------------
# TMA boxes

@dataclass(frozen=True)
class TmaBoxes:
    """One stage of an operand tile and the TMA boxes that fill it.

    `smem`: the one-stage shared-memory layout (MN, K); `box_elems`: elements one TMA instruction
    moves (the copy atom's value count); `box[r][c]`: which box fills element (r, c), in order of
    the unswizzled shared-memory offset.
    """

    smem: Layout
    box_elems: int
    boxes: int
    box: tuple[tuple[int, ...], ...]


def tma_boxes(operand: str = "a", major: str = "k", tile_mnk=(128, 128, 64), dtype: str = "bf16") -> TmaBoxes:
    """Build the TMA load atom a kernel would build (`make_tiled_tma_atom(CopyBulkTensorTileG2SOp(),
    gmem, smem_one_stage, cta_tile)`) for a gmem tensor of the given major-ness, and report its box."""
    from cutlass.cute.nvgpu import cpasync

    m = _major(major)
    smem = operand_smem(operand, m, tile_mnk, dtype, 1)
    one = Layout(tuple(smem.shape[:2]), tuple(smem.stride[:2]), smem.swizzle, smem.offset)
    dt = _dtype(dtype)
    mn = tile_mnk[0] if operand == "a" else tile_mnk[1]
    tile = (mn, tile_mnk[2])
    box: dict[str, int] = {}

    coll = _pipeline_collective()

    def build(g):
        if coll is not None:  # the GEMM collective's own TMA builder, on a 1-stage layout
            staged = to_dsl(Layout((*one.shape, 1), (*one.stride, 0), one.swizzle, one.offset))
            return coll.operand_tma(g, staged, tile[0], tile[1], 1)[0]
        return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), g, to_dsl(one), tile)[0]

    @cute.jit
    def trace(g: cute.Tensor):
        atom = build(g)
        box["elems"] = int(cute.size(atom.layout_src_tv, mode=[1]))

    a = cute.sym_int32()
    b = cute.sym_int32()
    ld = cute.sym_int32(divisibility=16)
    stride = (ld, 1) if m == "k" else (1, ld)
    fake = cute.runtime.make_fake_tensor(dt, (a, b), stride=stride, assumed_align=16)
    cute.compile(trace, fake)

    rows = one.mode(0).size
    cols = one.size // rows
    offs = evaluate(one.outer)
    grid_ = tuple(tuple(offs[r + rows * c] // box["elems"] for c in range(cols)) for r in range(rows))
    return TmaBoxes(one, box["elems"], one.size // box["elems"], grid_)
