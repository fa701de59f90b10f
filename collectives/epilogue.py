"""GEMM epilogue: fused elementwise math on the fp32 accumulator, then registers -> shared memory
(stmatrix for 16-bit outputs) -> global memory by TMA store, one (epi_m, epi_n) sub-tile at a time.

`EpilogueOps` says what is fused: D = act(alpha * acc + beta * C + bias), with C an (M, N, L)
tensor, bias an N-vector (broadcast over rows and batches), act one of relu / gelu (erf form, as
torch's default) / silu. The math runs in fp32 on the accumulator registers, element by element,
with each element's (m, n) coordinate taken from the same partition of an identity tensor (so the
tails of M and N are predicated without knowing the MMA's register layout).

The gated activation "swiglu" halves the tile: B's columns alternate in blocks of `GLU_BLOCK` gate columns and
`GLU_BLOCK` up columns (packed so by the caller), and output column j is silu(gate_j) * up_j. A WGMMA accumulator
gives each thread the same two columns of every 8-column block, so gate_j and up_j sit in the same thread; `glu_pairs`
finds their registers at trace time and `glu_fold` writes the products into the accumulator of a tile half as
wide, which the usual store then writes.

The store walks the output tile in sub-tiles: convert a sub-tile's registers to the output dtype,
write them to one of `epi_stages` smem buffers, fence the async proxy, sync the storing warpgroups
on a named barrier, and let one warp issue the TMA store. Buffers are reused only after the TMA
store that read them completed (bulk async-group wait), so stores overlap the next sub-tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass._mlir.dialects import nvvm
from cutlass.cute.nvgpu import cpasync
from cutlass.tensor_utils import LayoutEnum

from collectives.activations import silu_mul
from collectives.arg_reduce import select
from collectives.ptx import mbarrier_wait, pack_bf16x2, st_async_f32, st_async_v4, unpack_bf16x2
from collectives.quantize import E4M3, inverse, scale_of
from collectives.reduce import warp_reduce
from collectives.vector_io import as_vectors
from schedules.fp8_gemm import GQ_THREADS, GQ_TILE, GQ_XCH_WORDS, glu_quant_bytes
from schedules.gemm import GLU_BLOCK

ACTIVATIONS = ("none", "relu", "gelu", "silu", "swiglu")


@dataclass(frozen=True)
class EpilogueOps:
    activation: str = "none"
    bias: bool = False
    source: bool = False  # beta * C
    scale: bool = False  # alpha != 1

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.gated and (self.bias or self.source or self.scale):
            raise ValueError("the gated activation (swiglu) fuses no bias, beta * C or alpha")

    @property
    def gated(self) -> bool:
        """The output is half as wide as the accumulator: silu(gate) * up of interleaved column blocks."""
        return self.activation == "swiglu"

    @property
    def fused(self) -> bool:
        return self.activation != "none" or self.bias or self.source or self.scale

    def __str__(self) -> str:
        parts = [self.activation] + [n for n, on in (("bias", self.bias), ("c", self.source), ("alpha", self.scale)) if on]
        return "+".join(parts)


def activate(x, activation: str):
    """fp32 activation of one value (trace-time choice)."""
    if activation == "relu":
        return cutlass.max(x, Float32(0.0))
    if activation == "gelu":
        return Float32(0.5) * x * (Float32(1.0) + cute.math.erf(x * Float32(1.0 / math.sqrt(2.0))))
    if activation == "silu":
        return x / (Float32(1.0) + cute.math.exp(-x))
    return x


@cute.jit
def apply_ops(
    ops: cutlass.Constexpr,
    acc: cute.Tensor,
    tCcC: cute.Tensor,
    m0,
    n0,
    l,
    mC: cute.Tensor,
    bias: cute.Tensor,
    alpha: Float32,
    beta: Float32,
):
    """acc[i] = act(alpha * acc[i] + beta * C[m, n, l] + bias[n]) in place. tCcC holds each
    accumulator element's (m, n) inside the tile (the MMA partition of an identity tensor); m0, n0
    are the tile's origin. Reads outside (M, N) are skipped (the TMA store clips those elements)."""
    if cutlass.const_expr(ops.fused and not ops.gated):
        rows = cute.size(mC, mode=[0]) if cutlass.const_expr(ops.source) else 0
        cols = cute.size(bias, mode=[0]) if cutlass.const_expr(ops.bias) else 0
        if cutlass.const_expr(ops.source):
            cols = cute.size(mC, mode=[1])
        for i in cutlass.range_constexpr(cute.size(acc)):
            v = acc[i]
            if cutlass.const_expr(ops.scale):
                v = v * alpha
            if cutlass.const_expr(ops.source or ops.bias):
                m = m0 + tCcC[i][0]
                n = n0 + tCcC[i][1]
                if cutlass.const_expr(ops.source):
                    if m < rows and n < cols:
                        v = v + beta * mC[m, n, l].to(Float32)
                if cutlass.const_expr(ops.bias):
                    if n < cols:
                        v = v + bias[n].to(Float32)
            acc[i] = activate(v, ops.activation)


def glu_pairs(full_mma: cute.TiledMma, half_mma: cute.TiledMma, tile_m: int, tile_n: int) -> tuple:
    """(gate, up): for each element of `half_mma`'s C partition of tile_m x tile_n/2 (output column j), the index
    in `full_mma`'s C partition of tile_m x tile_n of its gate column (j's block 2b, b = j // GLU_BLOCK) and of its
    up column (block 2b + 1). Trace-time, from thread 0's coordinates (the maps are the same for every thread: each
    holds the same offsets inside every 8-column block); raises if a column has no register."""
    full = full_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    half = half_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, tile_n // 2)))
    where = {}
    for j in range(cute.size(full)):
        m, n = full[j]
        where[(int(m), int(n))] = j
    gate, up = [], []
    for i in range(cute.size(half)):
        m, n = (int(v) for v in half[i])
        col = 2 * GLU_BLOCK * (n // GLU_BLOCK) + n % GLU_BLOCK
        gate.append(where[(m, col)])
        up.append(where[(m, col + GLU_BLOCK)])
    assert sorted(gate + up) == list(range(cute.size(full))), "the gated pairs do not cover the accumulator"
    return tuple(gate), tuple(up)


@cute.jit
def glu_fold(acc: cute.Tensor, out: cute.Tensor, gate: cutlass.Constexpr, up: cutlass.Constexpr,
             fast: cutlass.Constexpr[bool]):
    """out[i] = silu(acc[gate[i]]) * acc[up[i]] in fp32 (`glu_pairs`' maps); `fast` (16-bit outputs): the sigmoid's
    hardware reciprocal (`collectives.activations.sigmoid`)."""
    for i in cutlass.range_constexpr(cute.size(out)):
        out[i] = silu_mul(acc[gate[i]], acc[up[i]], fast)


def smem_layout(c_layout, dtype, epi_tile, buffers: int):
    """(epi_m, epi_n, buffers) swizzled smem layout for output sub-tiles."""
    return sm90_utils.make_smem_layout_epi(dtype, c_layout, epi_tile, buffers)


def store_tma(c: cute.Tensor, smem_staged, epi_tile):
    """TMA store atom + coordinate tensor writing one (epi_m, epi_n) box of c (M, N, L)."""
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c,
                                       cute.slice_(smem_staged, (None, None, 0)), epi_tile)


def acc_smem_copy(tiled_mma: cute.TiledMma, c_layout, out_dtype) -> cute.TiledCopy:
    """The register -> smem copy of `tiled_mma`'s accumulator tile in `out_dtype` (stmatrix for 16-bit types): slice
    it per thread, `retile` the (converted) accumulator, copy into a `c_layout` smem tile."""
    atom = sm90_utils.get_smem_store_op(c_layout, out_dtype, Float32)
    stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), out_dtype)
    return cute.make_tiled_copy_S(atom, cute.make_tiled_copy_C_atom(stmatrix, tiled_mma))


@cute.jit
def copy_acc_to_smem(r2s: cute.TiledCopy, thr_dst: cute.Tensor, regs: cute.Tensor):
    """A whole accumulator tile, already in the output dtype (`regs`, the accumulator's layout), into its smem tile:
    `thr_dst` is this thread's slice of the tile (`acc_smem_copy(...).get_slice(tid).partition_D`, one stage). The
    retiled registers ((CPY, reps), 1, 1) are seen as the destination's (CPY, 1, reps)."""
    n_cpy, n_rep = cute.size(thr_dst, mode=[0]), cute.size(thr_dst, mode=[2])
    src = cute.make_tensor(r2s.retile(regs).iterator, cute.make_layout((n_cpy, 1, n_rep), stride=(1, 0, n_cpy)))
    cute.copy(r2s, src, thr_dst)


def row_store_copy(dtype, tile_mn: tuple[int, int], threads: int) -> cute.TiledCopy:
    """`threads` threads moving a row-major (tile_m, tile_n) tile in 16-byte row vectors: a power-of-two number of
    threads per row (the most that divides its vectors), each one vector per atom, repeated across the row at the
    threads' stride (a longer contiguous run per thread would cross the 8 x 32 swizzle atoms of a 96-column smem
    tile, where its composition with the tile's layout does not exist)."""
    n = tile_mn[1]
    vec = 128 // dtype.width
    per_row = n // vec
    tpr = 1
    while per_row % (tpr * 2) == 0 and tpr * 2 <= threads:
        tpr *= 2
    thr_layout = cute.make_layout((threads // tpr, tpr), stride=(tpr, 1))
    val_layout = cute.make_layout((1, vec))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return cute.make_tiled_copy_tv(atom, thr_layout, val_layout)


@cute.jit
def store_rows_staged(tiled_mma: cute.TiledMma, regs: cute.Tensor, sC: cute.Tensor, gC: cute.Tensor, row0, rows,
                      tid, threads: cutlass.Constexpr[int]):
    """A whole accumulator tile already in its output dtype (`regs`, in the accumulator's layout) into gC (tile_m,
    tile_n) through the row-major smem tile sC: stmatrix in, 16-byte row vectors out (full sectors, where the
    accumulator's own layout stores 4-byte pairs), rows at or past `rows` (counted from `row0`, gC's first) left out.
    All `threads` threads of the CTA take part (one CTA barrier between the two halves)."""
    r2s = acc_smem_copy(tiled_mma, LayoutEnum.ROW_MAJOR, regs.element_type)
    copy_acc_to_smem(r2s, r2s.get_slice(tid).partition_D(sC), regs)
    cute.arch.sync_threads()
    tile = (cute.size(gC, mode=[0]), cute.size(gC, mode=[1]))
    s2g = row_store_copy(regs.element_type, tile, threads)
    thr = s2g.get_slice(tid)
    src = thr.partition_S(sC)
    dst = thr.partition_D(gC)
    crd = thr.partition_D(cute.make_identity_tensor(tile))
    frag = cute.make_rmem_tensor_like(src)
    cute.autovec_copy(src, frag)
    for i in cutlass.range_constexpr(cute.size(frag, mode=[1])):
        if row0 + crd[(0, i, 0)][0] < rows:
            cute.autovec_copy(frag[(None, i, None)], dst[(None, i, None)])


@cute.jit
def store_tile(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tid,
    sC: cute.Tensor,
    buf0,
    buffers: cutlass.Constexpr[int],
    counter,
    tma_c: cute.CopyAtom,
    gC_tile: cute.Tensor,
    epi_tile: cutlass.Constexpr,
    out_dtype: cutlass.Constexpr,
    c_layout: cutlass.Constexpr,
    barrier,
    is_store_warp,
    store_pipe,
):
    """Write the accumulator tile to gC_tile (tile_m, tile_n) through smem buffers
    buf0 .. buf0 + buffers - 1 of sC (epi_m, epi_n, *). `tid` is the thread's index among the
    storing warpgroups, `barrier` their named barrier, `counter` the running sub-tile count (picks
    the buffer). Returns the updated counter."""
    r2s = acc_smem_copy(tiled_mma, c_layout, out_dtype)
    thr = r2s.get_slice(tid)
    tRS_sC = thr.partition_D(sC)
    tRS_acc = r2s.retile(acc)
    frag_shape = cute.shape(thr.partition_S(sC))[:3]
    r_acc = cute.make_rmem_tensor(frag_shape, Float32)
    r_out = cute.make_rmem_tensor(frag_shape, out_dtype)
    per_sub = cute.size(r_acc)

    gC_epi = cute.zipped_divide(gC_tile, epi_tile)
    bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi)
    subs_mn = gC_epi.shape[1]
    order = cute.make_layout(subs_mn, stride=(subs_mn[1], 1))
    for e in cutlass.range_constexpr(cute.size(gC_epi, mode=[1])):
        for v in cutlass.range_constexpr(per_sub):
            r_acc[v] = tRS_acc[e * per_sub + v]
        r_out.store(r_acc.load().to(out_dtype))
        buf = buf0 + counter % buffers
        cute.copy(r2s, r_out, tRS_sC[(None, None, None, buf)])
        cute.arch.fence_proxy("async.shared", space="cta")
        barrier.arrive_and_wait()
        if is_store_warp:
            cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, order.get_hier_coord(e))])
            store_pipe.producer_commit()
            store_pipe.producer_acquire()
        barrier.arrive_and_wait()
        counter = counter + 1
    return counter


@cute.jit
def store_partial(acc: cute.Tensor, tCcC: cute.Tensor, mW: cute.Tensor, m0, n0, slot):
    """Split-K: write the raw fp32 accumulator tile (origin m0, n0) to batch `slot` of the workspace mW
    (M, Np, L * splits), straight from registers, predicated by each element's (m, n) from tCcC.

    Plain st.global rather than the smem + TMA path of `store_tile`: stmatrix moves 16-bit elements
    only, an fp32 staging buffer would take shared memory from the A/B stages, and the partials are
    a small part of a split-K GEMM's traffic (2 x splits x M x N x 4 bytes against K x N x 2 of B).
    Each warp instruction writes 8 rows x 32 contiguous bytes (WGMMA's accumulator pairs), full
    sectors."""
    rows = cute.size(mW, mode=[0])
    cols = cute.size(mW, mode=[1])
    for i in cutlass.range_constexpr(cute.size(acc)):
        m = m0 + tCcC[i][0]
        n = n0 + tCcC[i][1]
        if m < rows and n < cols:
            mW[m, n, slot] = acc[i]


# --- SwiGLU + 1x128 e4m3 quantization across a CTA pair -------------------------------------------------------------
# A 1x2 cluster computes one 128-column block of silu(gate) * up: CTA 0 the gate columns' tile, CTA 1 the up columns'
# tile of the same rows (B read through a view that pairs them, `Gemm(glu_quant=True)`). Each CTA keeps one half of
# the block's output columns and sends the other half of its accumulator, rounded to bf16 as a 16-bit GEMM output is,
# to its peer (`st.async` into the peer's shared memory, completing on the peer's mbarrier); the row amax of the
# 128 columns is two halves exchanged the same way. The outputs are then bit for bit what the unfused pair writes
# (the bf16 GEMM output, then `swiglu_quantize`).
def glu_quant_regs(tiled_mma: cute.TiledMma, tile_m: int, tile_n: int, exchanged: bool = True) -> tuple:
    """(low, high, slot, rows): the accumulator registers of output columns [0, tile_n / 2) (`low`, in register
    order), for each the register of the column tile_n / 2 to its right (`high`), and which of the thread's `rows`
    rows each sits on (`slot`). Trace-time, from thread 0's coordinates (every thread holds the same pattern).
    `exchanged`: the pair's exchange is sized for this many registers (not "local", whose halves are gate and up)."""
    c = tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    coords = [(int(c[i][0]), int(c[i][1])) for i in range(cute.size(c))]
    where = {xy: i for i, xy in enumerate(coords)}
    half = tile_n // 2
    low = [i for i, (_, n) in enumerate(coords) if n < half]
    high = [where[(coords[i][0], coords[i][1] + half)] for i in low]
    rows = sorted({coords[i][0] for i in low})
    assert sorted(low + high) == list(range(len(coords))), "the column halves do not cover the accumulator"
    assert not exchanged or len(low) == 2 * GQ_XCH_WORDS, \
        f"{len(low)} registers a half: the exchange is sized for {2 * GQ_XCH_WORDS}"
    return tuple(low), tuple(high), tuple(rows.index(coords[i][0]) for i in low), len(rows)


@cute.jit
def _glu_send(words: list, region, peer, tid, xbar):
    """This thread's bf16x2 `words` into the peer's exchange region as [word / 4][thread][word % 4] (16-byte
    `st.async`s completing on the peer's `xbar`); returns the region's 32-bit cluster address in the peer."""
    remote = cutlass.Int32(cute.arch.map_dsmem_ptr(region, peer).toint())
    remote_x = cutlass.Int32(cute.arch.map_dsmem_ptr(xbar, peer).toint())
    for q in cutlass.range_constexpr(len(words) // 4):
        st_async_v4(remote + (q * GQ_THREADS + tid) * 16, words[4 * q], words[4 * q + 1], words[4 * q + 2],
                    words[4 * q + 3], remote_x)
    return remote


@cute.jit
def _glu_products(region, tid, own: cute.Tensor, gate_here) -> cute.Tensor:
    """silu(gate) * up of this thread's `own` values (bf16-rounded, register order) and the peer's words for the same
    registers in this CTA's exchange region (after its `xbar` phase): the gate is `own` where `gate_here`."""
    n = cute.size(own)
    xv = cute.make_tensor(cute.recast_ptr(region, dtype=cutlass.Int32),
                          cute.make_layout((4, GQ_THREADS, n // 8), stride=(1, 4, 4 * GQ_THREADS)))
    y = cute.make_rmem_tensor((n,), Float32)
    for q in cutlass.range_constexpr(n // 8):
        got = xv[None, tid, q].load()
        for e in cutlass.range_constexpr(4):
            p = 4 * q + e
            r0, r1 = unpack_bf16x2(got[e])
            for j, r in ((2 * p, r0), (2 * p + 1, r1)):
                y[j] = silu_mul(select(gate_here, own[j], r), select(gate_here, r, own[j]), True)
    return y


@cute.jit
def _row_amax(y: cute.Tensor, regs: cutlass.Constexpr, tCcC: cute.Tensor):
    """(each of the thread's rows' amax of the products `y` (in `low`'s register order) over the quad holding the
    row's columns, the rows' tile coordinates)."""
    low, _, slot, nrows = regs
    amax = []
    rows_local = []
    for s_ in cutlass.range_constexpr(nrows):
        mine = [k for k in range(len(low)) if slot[k] == s_]
        a = cute.math.absf(y[mine[0]])
        for k in mine[1:]:
            a = cute.arch.fmax(a, cute.math.absf(y[k]))
        amax.append(warp_reduce(a, cute.arch.fmax, 4))
        rows_local.append(tCcC[low[mine[0]]][0])
    return amax, rows_local


@cute.jit
def glu_quant_store(acc: cute.Tensor, tCcC: cute.Tensor, regs: cutlass.Constexpr, half, peer, tid, region,
                    xbar, abar, phase, mQ: cute.Tensor, mQS: cute.Tensor, m0, q_col0, s_col):
    """One 128 x 128 tile's epilogue under `Gemm(glu_quant=True)`: this CTA (`half` 0: the gate tile, 1: the up tile)
    and its `peer` make 64 output columns each of mQ (M, I) e4m3, rows from m0, this CTA's from column `q_col0`,
    and CTA 0 the rows' scales in column `s_col` of mQS (M, I / 128). `region`: the exchange region (a Uint8
    shared-memory pointer, `glu_quant_bytes`), `xbar` / `abar` this CTA's mbarriers of the two exchanges (one
    arrival each), `phase` their parity this tile. Every consumer thread (`tid` 0..255) calls it; the two mbarriers
    are the only synchronization (a peer writes tile i + 1's words into this CTA only after it has every row's amax
    half of tile i, each sent after its quad read the words of tile i)."""
    low, high, _, nrows = regs
    n = len(low)
    amax_off, _ = glu_quant_bytes()
    gate_here = half == 0
    # 1. bf16 words: the half this CTA keeps and the half its peer needs (the same register order on both CTAs)
    own = cute.make_rmem_tensor((n,), Float32)
    words = []
    for p in cutlass.range_constexpr(n // 2):
        a0 = select(gate_here, acc[low[2 * p]], acc[high[2 * p]])
        a1 = select(gate_here, acc[low[2 * p + 1]], acc[high[2 * p + 1]])
        s0 = select(gate_here, acc[high[2 * p]], acc[low[2 * p]])
        s1 = select(gate_here, acc[high[2 * p + 1]], acc[low[2 * p + 1]])
        own[2 * p], own[2 * p + 1] = unpack_bf16x2(pack_bf16x2(a1, a0))
        words.append(pack_bf16x2(s1, s0))
    if tid == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(xbar, GQ_XCH_WORDS * GQ_THREADS * 4)
        cute.arch.mbarrier_arrive_and_expect_tx(abar, GQ_TILE * 4)
    remote = _glu_send(words, region, peer, tid, xbar)
    remote_a = cutlass.Int32(cute.arch.map_dsmem_ptr(abar, peer).toint())
    # 2. the peer's half, the products, the row amax halves
    mbarrier_wait(xbar, phase)
    y = _glu_products(region, tid, own, gate_here)
    lane = tid % 32
    amax, rows_local = _row_amax(y, regs, tCcC)
    if lane % 4 == 0:
        for s_ in cutlass.range_constexpr(nrows):
            st_async_f32(remote + amax_off + rows_local[s_] * 4, amax[s_], remote_a)
    mbarrier_wait(abar, phase)
    av = cute.make_tensor(cute.recast_ptr(region + amax_off, dtype=Float32), cute.make_layout(GQ_TILE))
    full = [cute.arch.fmax(amax[s_], av[rows_local[s_]]) for s_ in range(nrows)]
    _glu_quant_write(y, full, regs, rows_local, half, lane, tCcC, mQ, mQS, m0, q_col0, s_col)


@cute.jit
def glu_quant_store_local(acc: cute.Tensor, tCcC: cute.Tensor, regs: cutlass.Constexpr, tid, mQ: cute.Tensor,
                          mQS: cute.Tensor, m0, q_col0, s_col):
    """One 128 x 256 tile's epilogue under `Gemm(glu_quant=True, glu_exchange="local")`: the tile's columns [0, 128)
    are a gate block and [128, 256) its up block, so a thread holds both of each product (`regs`' low / high: column
    c and c + 128 of the same row). Both are rounded to bf16 first (the plain GEMM's output), the row amax is a quad's
    butterfly over its 32 products a row, and the 128 output columns go to mQ from column `q_col0` with their rows'
    scales in column `s_col` of mQS: `swiglu_quantize`'s arithmetic, no shared memory and no barrier."""
    low, high, _, _ = regs
    n = len(low)
    y = cute.make_rmem_tensor((n,), Float32)
    for p in cutlass.range_constexpr(n // 2):
        g0, g1 = unpack_bf16x2(pack_bf16x2(acc[low[2 * p + 1]], acc[low[2 * p]]))
        u0, u1 = unpack_bf16x2(pack_bf16x2(acc[high[2 * p + 1]], acc[high[2 * p]]))
        y[2 * p] = silu_mul(g0, u0, True)
        y[2 * p + 1] = silu_mul(g1, u1, True)
    amax, rows_local = _row_amax(y, regs, tCcC)
    _glu_quant_write(y, amax, regs, rows_local, 0, tid % 32, tCcC, mQ, mQS, m0, q_col0, s_col)


@cute.jit
def _glu_quant_write(y: cute.Tensor, amax: list, regs: cutlass.Constexpr, rows_local: list, half, lane,
                     tCcC: cute.Tensor, mQ: cute.Tensor, mQS: cute.Tensor, m0, q_col0, s_col):
    """The end of both exchanges: the stored half's products `y` (in `low`'s register order) scaled by their rows'
    block amax (`scale_of`, `inverse`: swiglu_quantize's arithmetic), e4m3 column pairs straight to global (a warp's
    store covers 8 rows x 8 bytes, the tile's other stores the rest of those sectors while they sit in L2: no
    staging, no barrier between the CTA's threads), CTA 0's scales."""
    low, _, slot, nrows = regs
    n = len(low)
    rows = cute.size(mQ, mode=[0])
    cols = cute.size(mQ, mode=[1])
    scaled = cute.make_rmem_tensor((n,), Float32)
    for s_ in cutlass.range_constexpr(nrows):
        scale = scale_of(amax[s_], False)
        inv = inverse(scale)
        for k in cutlass.range_constexpr(n):
            if cutlass.const_expr(slot[k] == s_):
                scaled[k] = y[k] * inv
        if half == 0 and lane % 4 == 0 and m0 + rows_local[s_] < rows:
            mQS[m0 + rows_local[s_], s_col] = scale
    qv = cute.make_rmem_tensor((n,), E4M3)
    qv.store(scaled.load().to(E4M3))
    for k in cutlass.range_constexpr(0, n, 2):
        m = m0 + tCcC[low[k]][0]
        if m < rows:
            pair = cute.make_rmem_tensor((2,), E4M3)
            pair[0] = qv[k]
            pair[1] = qv[k + 1]
            as_vectors(mQ[m, None], cols, 2)[None, (q_col0 + tCcC[low[k]][1]) // 2].store(pair.load())


@cute.jit
def glu_quant_store_full(acc: cute.Tensor, tCcC: cute.Tensor, regs: cutlass.Constexpr, half, peer, tid, region,
                         xbar, fbar, phase, mQ: cute.Tensor, mQS: cute.Tensor, m0, q_col0, s_col):
    """`glu_quant_store` with one exchange instead of two: each CTA sends its whole accumulator (bf16, 32 words a
    thread, `glu_quant_bytes("full")`), so both hold gate and up of all 128 columns and take the row amax locally (a
    quad's butterfly over 32 products a row); each then stores its 64 columns. One round trip a tile instead of two,
    at twice the exchanged bytes and products. The peer's region is reused only after the peer has read it: each warp
    arrives on this CTA's `fbar` in the peer (8 arrivals a phase) after its reads, and a CTA waits on its own `fbar`
    (phase `phase` + 1: open at the first tile) before sending. The kernel ends with a cluster barrier (the last
    tile's arrivals land before the peer exits)."""
    low, high, slot, nrows = regs
    n = len(low)
    gate_here = half == 0
    own = cute.make_rmem_tensor((2 * n,), Float32)
    w = []
    for p in cutlass.range_constexpr(n):
        w.append(pack_bf16x2(acc[2 * p + 1], acc[2 * p]))
        own[2 * p], own[2 * p + 1] = unpack_bf16x2(w[p])
    if tid == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(xbar, len(w) * GQ_THREADS * 4)
    mbarrier_wait(fbar, (phase + 1) % 2)  # the peer has read the previous tile's words
    _glu_send(w, region, peer, tid, xbar)
    mbarrier_wait(xbar, phase)
    y = _glu_products(region, tid, own, gate_here)
    cute.arch.sync_warp()
    lane = tid % 32
    if lane == 0:
        cute.arch.mbarrier_arrive(fbar, peer, scope=nvvm.MemScopeKind.CLUSTER)  # (release: the reads before it)
    amax = []
    rows_local = []
    for s_ in cutlass.range_constexpr(nrows):
        mine = [k for k in range(n) if slot[k] == s_]
        a = cute.math.absf(y[low[mine[0]]])
        for k in mine:
            a = cute.arch.fmax(a, cute.arch.fmax(cute.math.absf(y[low[k]]), cute.math.absf(y[high[k]])))
        amax.append(warp_reduce(a, cute.arch.fmax, 4))
        rows_local.append(tCcC[low[mine[0]]][0])
    kept = cute.make_rmem_tensor((n,), Float32)
    for k in cutlass.range_constexpr(n):
        kept[k] = select(gate_here, y[low[k]], y[high[k]])
    _glu_quant_write(kept, amax, regs, rows_local, half, lane, tCcC, mQ, mQS, m0, q_col0, s_col)
