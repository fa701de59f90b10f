"""W4A16 GEMM for small M (1-64 rows of x): y = x W^T with W packed int4, streamed by TMA, dequantized in registers,
multiplied by warp-level `mma.sync.m16n8k16` with the weight as the A operand.

Roofline: at M <= 16 the weight bytes (N K / 2) are the whole cost; floor = those bytes / read bandwidth.

Data flow (schedule: `schedules.w4a16`). A CTA owns `tile_n` rows of W and a split of K. Its producer warp fills a
ring of stages on mbarriers: a stage is `k_boxes` TMA boxes of W (tile_n rows x 32 packed words = 256 k each, 128-byte
swizzle) and four boxes of x per W box (8 * col_tiles rows x 64 k, zero-filled past M and past K). Each consumer warp owns
`m_tiles` 16-row MMA tiles of W and all of x's columns (`col_tiles` n8 tiles), and per 128-k chunk of a stage:
- loads, per MMA row it holds (g and g + 8 of each tile), its 16-byte unit of the packed row: lane c of the chunk
  takes span c (32 k), the unit `cute_kernels.w4a16.pack` lays out for these fragments;
- loads x's matching 32 k for its column g of each n8 tile (four 16-byte reads: the B fragments of 8 MMAs);
- per MMA t (0-7), dequantizes pairs 2 (t % 2) and 2 (t % 2) + 1 of word t // 2 of each unit (`collectives.int4`)
  into the A fragment and issues one MMA per n8 tile. A dot product may visit K in any order if both operands
  use the same one: MMA t's k slots (2c, 2c+1, 2c+8, 2c+9) are the unit's values 4t .. 4t + 3 on both sides.
Scales: for groups of 128 or more (and per channel) a chunk lies in one group of every row, so the MMAs take the
exact integers (q - z) and the chunk's fp32 partial sums are scaled by s[row] in fp32 (one FFMA per accumulator
value a chunk instead of a multiply per weight); groups of 32 / 64 multiply each weight pair by its scale. In bf16 at
up to two column tiles the folded MMAs take the biased integers M + q straight from the lop3, and the chunk's sums
lose (M + z) sum x, with sum x from MMAs on a ones fragment (`biased`). A stage's scales are loaded two stages ahead
into one of two register buffers that alternate, so the consumer runs stages in pairs (an even count a split).

Shared-memory banks: MMA row g of a tile reads smem row (g // 2) + 4 (g % 2) of its 8-row half, so the two rows
of a quarter-warp differ in bit 2 of the swizzle's XOR and their 16-byte units hit disjoint bank groups (four
wavefronts per 512-byte warp load, the minimum). The consumers read the rings through plain views with the swizzle's
XOR applied once per lane: unit u of smem row r sits at u ^ (r % 8), and r % 8 is fixed per lane.

Split K: with `splits` > 1 each CTA stores its fp32 partials (splits, M, N) and the last CTA of its W tile
(`collectives.split_counter`) adds them in split order: the same bits on every run.
"""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.nvgpu import warp as warp_mma

from collectives import pdl
from collectives.activations import silu_mul
from collectives.int4 import biased_pair, dequant_pair, magic_of, ones_pair, pair_of
from collectives.smem_tiles import swizzle_128b
from collectives.split_counter import last_split
from collectives.tma_pipeline import make_pipeline
from collectives.vector_io import extent
from schedules.gemm import GLU_BLOCK
from schedules.w4a16 import MAX_SPLITS, TILE_K, W4A16Plan  # (TILE_K: k of one W box)

X_BOX = 64  # k of one x box (128 bytes of 16-bit elements: the 128-byte swizzle)
WORDS = TILE_K // 8  # packed int32 words of a W row in one box (128 bytes)
CHUNK = 128  # k of one chunk: four lanes' 32-k units
_EPI_BAR = 1  # named barrier of the consumer warps (0 is the CTA's)


def glu_column(row):
    """The output column of gate row `row` of a W interleaved by `pack_gate_up` (gate / up blocks of GLU_BLOCK)."""
    return row // (2 * GLU_BLOCK) * GLU_BLOCK + row % GLU_BLOCK


def mma_row(g: int) -> int:
    """The smem row (within its 8-row half of a 16-row MMA tile) of MMA row g (0-7)."""
    return g // 2 + 4 * (g % 2)


class W4A16Stream:
    """`dense`: W itself in x's dtype (the skinny GEMM / GEMV of `cute_kernels.gemv`): four TMA boxes of (tile_n, 64)
    a stage like x's, each lane's unit of a row read as four 16-byte vectors like its x unit (two lanes a bank group:
    rows in order, the int4 row permutation would make it four), no scales."""

    def __init__(self, dtype, col_tiles: int, group: int, zeros: bool, plan: W4A16Plan, dense: bool = False,
                 source: bool = False, gated: bool = False):
        if dtype.width != 16:
            raise ValueError(f"W4A16 activations are bf16 / fp16, got {dtype}")
        if group % 32:
            raise ValueError(f"int4 groups must be a multiple of 32 columns, got {group}")
        self.dtype, self.col_tiles, self.group, self.zeros, self.plan = dtype, col_tiles, group, zeros, plan
        self.dense = dense
        self.source = source  # y = alpha * (x W^T) + beta * src, in fp32 and rounded once (a residual, addmm's input)
        self.gated = gated  # y (M, N / 2) = silu(x W_gate^T) * (x W_up^T), W's rows interleaved by `pack_gate_up`
        if gated and source:
            raise ValueError("the streaming kernel's gated epilogue takes no source")
        self.fold = not dense and (group == 0 or group >= CHUNK)  # a chunk inside one group: scales on fp32 sums
        # bf16 folded, up to 16 columns: the MMAs take M + q as the lop3 makes it (no subtraction a weight pair) and
        # the chunk's fp32 sums lose (M + z) sum x, sum x from MMAs on a ones fragment: 8 MMAs a column tile and chunk
        # for 32 packed subtractions a lane (a win at 1-2 column tiles). M = 128: the cancellation costs ~7 of fp32's
        # 24 bits; fp16's M = 1024 would cost 10, so fp16 subtracts.
        self.biased = self.fold and dtype is cutlass.BFloat16 and col_tiles <= 2

    @cute.jit
    def __call__(self, w: cute.Tensor, x: cute.Tensor, y: cute.Tensor, scales: cute.Tensor, zeros: cute.Tensor,
                 part: cute.Tensor, counter: cute.Tensor, per_split: Int32, splits: Int32, src: cute.Tensor,
                 alpha: Float32, beta: Float32, stream):
        """w (N, K / 8) int32 packed; x (M, K); y (M, N); scales / zeros (N, K / group) (zeros read only with
        `zeros`); part (splits, M, N) fp32 and counter (W tiles,) int32 (zero before and after) read only with
        splits > 1; per_split: stages of K (`plan.tile_k` each) a split; src (M, N), alpha and beta read only with
        `source`."""
        p, dt = self.plan, self.dtype
        xr = 8 * self.col_tiles
        swz = swizzle_128b()
        kb = p.k_boxes
        wt, w_cols, w_boxes = (dt, X_BOX, 4 * kb) if self.dense else (Int32, WORDS, kb)  # a box: 128-byte rows
        w_layout = cute.make_composed_layout(swz, 0, cute.make_layout(
            (p.tile_n, w_cols, w_boxes * p.stages), stride=(w_cols, 1, p.tile_n * w_cols)))
        x_layout = cute.make_composed_layout(swz, 0, cute.make_layout(
            (xr, X_BOX, 4 * kb * p.stages), stride=(X_BOX, 1, xr * X_BOX)))
        tma_w, gw = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), w,
                                                cute.slice_(w_layout, (None, None, 0)), (p.tile_n, w_cols))
        tma_x, gx = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), x,
                                                cute.slice_(x_layout, (None, None, 0)), (xr, X_BOX))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, p.stages * 2]
            last: cute.struct.MemRange[Int32, 4]  # the finished-split count the counter's add returned
            sW: cute.struct.Align[cute.struct.MemRange[wt, cute.cosize(w_layout.outer)], 1024]
            sX: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(x_layout.outer)], 1024]

        self.storage = Storage
        tiles = (extent(w, 0) + p.tile_n - 1) // p.tile_n
        self.kernel(tma_w, gw, tma_x, gx, y, scales, zeros, part, counter, per_split, src, alpha, beta, w_layout,
                    x_layout).launch(
            grid=[tiles, splits, 1], block=[p.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, tma_w: cute.CopyAtom, mW: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor, mY: cute.Tensor,
               mS: cute.Tensor, mZ: cute.Tensor, mP: cute.Tensor, mC: cute.Tensor, per_split: Int32, mSrc: cute.Tensor,
               alpha: Float32, beta: Float32, w_layout: cute.ComposedLayout, x_layout: cute.ComposedLayout):
        p = self.plan
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == p.consumer_warps:
            cpasync.prefetch_descriptor(tma_w)
            cpasync.prefetch_descriptor(tma_x)
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        kb = p.k_boxes
        wt, w_boxes = (self.dtype, 4 * kb) if self.dense else (Int32, kb)
        tx = w_boxes * cute.size_in_bytes(wt, cute.slice_(w_layout, (None, None, 0))) + \
            4 * kb * cute.size_in_bytes(self.dtype, cute.slice_(x_layout, (None, None, 0)))
        pipe = make_pipeline(st.bars.data_ptr(), p.stages, tx, (1, 1), p.consumer_warps)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sW = st.sW.get_tensor(w_layout.outer, swizzle=w_layout.inner)  # (TMA writes the swizzled boxes)
        sX = st.sX.get_tensor(x_layout.outer, swizzle=x_layout.inner)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        tile, split, _ = cute.arch.block_idx()
        k_tiles = (extent(mX, 1) + p.tile_k - 1) // p.tile_k
        first = split * per_split
        count = cutlass.max(cutlass.min(first + per_split, k_tiles) - first, 0)
        count = count + count % 2  # stages in pairs (the consumer's scale buffers alternate): per_split is even, and
        # the last split's odd stage count takes one stage past K, which TMA fills with zeros (no bytes read)
        if warp == p.consumer_warps:
            self.produce(tma_w, mW, sW, tma_x, mX, sX, pipe, tile, first, count)
        else:
            self.consume(st.sW.get_tensor(w_layout.outer), st.sX.get_tensor(x_layout.outer), pipe, mX, mY, mS, mZ,
                         mP, mC, st.last.get_tensor(cute.make_layout(4)), tile, split, first, count, warp, tidx,
                         SimpleNamespace(src=mSrc, alpha=alpha, beta=beta))

    # --- the producer warp --------------------------------------------------------------------------------------
    @cute.jit
    def produce(self, tma_w: cute.CopyAtom, mW: cute.Tensor, sW: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
                sX: cute.Tensor, pipe, tile: Int32, first: Int32, count: Int32):
        p = self.plan
        w_cols = X_BOX if self.dense else WORDS
        kb = p.k_boxes
        gW = cute.flat_divide(mW, (p.tile_n, w_cols))  # (tile_n, 128 bytes, W tiles, boxes along K)
        gX = cute.flat_divide(mX, (8 * self.col_tiles, X_BOX))  # (rows, 64, 1, x boxes)
        tWsW, tWgW = cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                           cute.group_modes(gW, 0, 2))
        tXsX, tXgX = cpasync.tma_partition(tma_x, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                           cute.group_modes(gX, 0, 2))
        wb = 4 * kb if cutlass.const_expr(self.dense) else kb  # W boxes a stage
        # the first stages' W (the weight: no kernel of the chain writes it) into L2 while the previous kernel ends,
        # then the wait of a programmatic dependent (collectives.pdl)
        for i in cutlass.range_constexpr(p.stages):
            if i < count:
                for b in cutlass.range_constexpr(wb):
                    cute.prefetch(tma_w, tWgW[(None, tile, wb * (first + i) + b)])
        pdl.enter()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, p.stages)
        for i in cutlass.range(count, unroll=1):
            kt = first + i
            pipe.producer_acquire(state)
            bar = pipe.producer_get_barrier(state)
            for b in cutlass.range_constexpr(wb):
                cute.copy(tma_w, tWgW[(None, tile, wb * kt + b)], tWsW[(None, wb * state.index + b)], tma_bar_ptr=bar)
            for b in cutlass.range_constexpr(4 * kb):
                cute.copy(tma_x, tXgX[(None, 0, 4 * kb * kt + b)], tXsX[(None, 4 * kb * state.index + b)],
                          tma_bar_ptr=bar)
            pipe.producer_commit(state)
            state.advance()
        pipe.producer_tail(state)

    # --- the consumer warps -------------------------------------------------------------------------------------
    @cute.jit
    def consume(self, sW: cute.Tensor, sX: cute.Tensor, pipe, mX: cute.Tensor, mY: cute.Tensor, mS: cute.Tensor,
                mZ: cute.Tensor, mP: cute.Tensor, mC: cute.Tensor, last: cute.Tensor, tile: Int32, split: Int32,
                first: Int32, count: Int32, warp: Int32, tidx: Int32, out: SimpleNamespace):
        """sW / sX: the rings' plain (unswizzled) views; the lane's 16-byte units are addressed pre-swizzled."""
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        p, dt = self.plan, self.dtype
        MT, NT = p.m_tiles, self.col_tiles
        lane = tidx % 32
        g = lane // 4
        c = lane % 4
        m = extent(mX, 0)
        n = extent(mY, 1) * (2 if self.gated else 1)  # W's rows
        perm = g if cutlass.const_expr(self.dense) else g // 2 + 4 * (g % 2)  # (`mma_row`)

        op = warp_mma.MmaF16BF16Op(dt, Float32, (16, 8, 16))
        atom = cute.make_mma_atom(op)
        tiled = cute.make_tiled_mma(op)
        a_shape = tiled.get_slice(0).partition_A(cute.make_identity_tensor((16, 16))).shape
        b_shape = tiled.get_slice(0).partition_B(cute.make_identity_tensor((8, 16))).shape
        c_shape = tiled.get_slice(0).partition_C(cute.make_identity_tensor((16, 8))).shape
        frags = {
            "accs": [[tiled.make_fragment_C(c_shape) for _ in range(NT)] for _ in range(MT)],
            "fa": tiled.make_fragment_A(a_shape),
            "fbs": [tiled.make_fragment_B(b_shape) for _ in range(NT)],
        }
        for mt in cutlass.range_constexpr(MT):
            for nt in cutlass.range_constexpr(NT):
                frags["accs"][mt][nt].fill(0.0)
        frags["sums"] = [[tiled.make_fragment_C(c_shape) for _ in range(NT)] for _ in range(MT)] \
            if cutlass.const_expr(self.fold) else frags["accs"]
        if cutlass.const_expr(self.biased):  # sum x over a chunk per x row, in C's layout: MMAs with A = ones
            frags["xsum"] = [tiled.make_fragment_C(c_shape) for _ in range(NT)]
            frags["ones"] = tiled.make_fragment_A(a_shape)
            ones_w = cute.recast_tensor(frags["ones"], Int32)
            for e in cutlass.range_constexpr(cute.size(ones_w)):
                ones_w[e] = ones_pair(dt)

        # the lane's smem rows (tile-local) and global W rows: (m tile, half h) for MMA rows g + 8 h
        srow = [[16 * (MT * warp + mt) + 8 * h + perm for h in range(2)] for mt in range(MT)]
        grow = [[cutlass.min(tile * p.tile_n + srow[mt][h], n - 1) for h in range(2)] for mt in range(MT)]
        # x's rows past M are TMA's zero fill. Under the 128-byte swizzle unit u (16 bytes) of a 128-byte smem row r
        # sits at u ^ (r % 8) (every box starts 1024-byte aligned): r % 8 is perm for the lane's W rows, g for its x rows
        lanes = (c, srow, perm, g)

        # the scales (and zero points) of a stage, loaded two stages ahead into alternating register buffers (a copy
        # between buffers would wait on the load): one group per unit (per chunk when folded), for each (chunk,
        # m tile, half)
        nsz = 0 if self.dense else p.tile_k // CHUNK * MT * 2
        bufs = [(cute.make_rmem_tensor((max(nsz, 1),), dt), cute.make_rmem_tensor((max(nsz, 1),), dt))
                for _ in range(2)]
        if cutlass.const_expr(nsz > 0):
            self.load_scales(mS, mZ, bufs[0], first, grow, c)
            self.load_scales(mS, mZ, bufs[1], first + 1, grow, c)  # (past the split's end: unused, in range)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, p.stages)
        for i in cutlass.range(count // 2, unroll=1):  # (count is even)
            for b in cutlass.range_constexpr(2):
                pipe.consumer_wait(state)
                self.stage(sW, sX, state.index, mS, mZ, bufs[b], first + 2 * i + b, grow, lanes, frags, atom)
                pipe.consumer_release(state)
                state.advance()
        self.epilogue(frags["accs"], mY, mP, mC, last, tile, split, srow, m, n, c, tidx, out)

    @cute.jit
    def stage(self, sW: cute.Tensor, sX: cute.Tensor, slot: Int32, mS: cute.Tensor, mZ: cute.Tensor, buf, kt: Int32,
              grow, lanes, frags, atom):
        """Stage kt, full in ring slot `slot`: its scales from `buf` (then `buf` takes stage kt + 2's), its 128-k
        chunks of MMAs."""
        p, dt = self.plan, self.dtype
        MT, NT = p.m_tiles, self.col_tiles
        c, srow, wsw, g = lanes  # (g: the lane's x row in each n8 tile, and its swizzle term)
        accs, sums, fa, fbs = frags["accs"], frags["sums"], frags["fa"], frags["fbs"]
        fa_w = cute.recast_tensor(fa, Int32)
        fb_w = [cute.recast_tensor(fb, Int32) for fb in fbs]
        chunks = p.tile_k // CHUNK
        sz = []
        for jj in cutlass.range_constexpr(0 if self.dense else chunks):
            sz.append([[self.group_words(buf[0][(jj * MT + mt) * 2 + h], buf[1][(jj * MT + mt) * 2 + h])
                        for h in range(2)] for mt in range(MT)])
        if cutlass.const_expr(not self.dense):
            self.load_scales(mS, mZ, buf, kt + 2, grow, c)
        for jj in cutlass.range_constexpr(chunks):
            units = []
            for mt in cutlass.range_constexpr(0 if self.dense else MT):
                hs = []
                for h in cutlass.range_constexpr(2):
                    row = cute.logical_divide(sW[(srow[mt][h], None, p.k_boxes * slot + jj // 2)],
                                              cute.make_layout(4))
                    u = cute.make_rmem_tensor((4,), Int32)
                    u.store(row[(None, (4 * (jj % 2) + c) ^ wsw)].load())
                    hs.append(u)
                units.append(hs)
            if cutlass.const_expr(self.fold):
                for mt in cutlass.range_constexpr(MT):
                    for nt in cutlass.range_constexpr(NT):
                        sums[mt][nt].fill(0.0)
            if cutlass.const_expr(self.biased):
                for nt in cutlass.range_constexpr(NT):
                    frags["xsum"][nt].fill(0.0)
            box = 4 * p.k_boxes * slot + 2 * jj + c // 2  # x's (and dense W's) box of the unit
            for v in cutlass.range_constexpr(4):
                xs = []
                for nt in cutlass.range_constexpr(NT):
                    xv = cute.logical_divide(sX[(8 * nt + g, None, box)], cute.make_layout(8))
                    r = cute.make_rmem_tensor((8,), dt)
                    r.store(xv[(None, (4 * (c % 2) + v) ^ g)].load())
                    xs.append(cute.recast_tensor(r, Int32))
                wvs = []  # dense: the rows' vector v of their units, as x's
                for mt in cutlass.range_constexpr(MT if self.dense else 0):
                    hs = []
                    for h in cutlass.range_constexpr(2):
                        wv = cute.logical_divide(sW[(srow[mt][h], None, box)], cute.make_layout(8))
                        r = cute.make_rmem_tensor((8,), dt)
                        r.store(wv[(None, (4 * (c % 2) + v) ^ wsw)].load())
                        hs.append(cute.recast_tensor(r, Int32))
                    wvs.append(hs)
                for t in cutlass.range_constexpr(2 * v, 2 * v + 2):
                    for nt in cutlass.range_constexpr(NT):  # values 4t .. 4t+3 of the unit: words 2 (t % 2), +1
                        fb_w[nt][0] = xs[nt][2 * (t % 2)]
                        fb_w[nt][1] = xs[nt][2 * (t % 2) + 1]
                    if cutlass.const_expr(self.biased):
                        for nt in cutlass.range_constexpr(NT):
                            cute.gemm(atom, frags["xsum"][nt], frags["ones"], fbs[nt], frags["xsum"][nt])
                    for mt in cutlass.range_constexpr(MT):
                        for e in cutlass.range_constexpr(4):  # a0a1: row g lo; a2a3: g + 8 lo; a4a5, a6a7: hi
                            h, hi = e % 2, e // 2
                            j = 2 * (t % 2) + hi  # (the pair of word t // 2 of the unit)
                            if cutlass.const_expr(self.dense):
                                fa_w[e] = wvs[mt][h][j]
                            elif cutlass.const_expr(self.biased):
                                fa_w[e] = biased_pair(units[mt][h][t // 2], j, dt)
                            else:
                                neg_off, s2 = sz[jj][mt][h]
                                fa_w[e] = dequant_pair(units[mt][h][t // 2], j, neg_off,
                                                       None if cutlass.const_expr(self.fold) else s2, dt)
                        for nt in cutlass.range_constexpr(NT):
                            cute.gemm(atom, sums[mt][nt], fa, fbs[nt], sums[mt][nt])
            if cutlass.const_expr(self.fold):
                for mt in cutlass.range_constexpr(MT):
                    for nt in cutlass.range_constexpr(NT):
                        for e in cutlass.range_constexpr(4):  # C values 0, 1: row g; 2, 3: row g + 8
                            off, scale = sz[jj][mt][e // 2]
                            part = sums[mt][nt][e]
                            if cutlass.const_expr(self.biased):  # sum (M + q) x - (M + z) sum x
                                part = frags["xsum"][nt][e] * off + part
                            accs[mt][nt][e] = part * scale + accs[mt][nt][e]

    @cute.jit
    def load_scales(self, mS: cute.Tensor, mZ: cute.Tensor, buf, kt: Int32, grow, c: Int32):
        """Stage kt's scales (and zero points) of the lane's rows into buf = (scales, zeros), entry
        (jj * m_tiles + mt) * 2 + h: the group of the lane's unit (of its chunk when folded), clamped into the tensor."""
        MT = self.plan.m_tiles
        groups = extent(mS, 1)
        for jj in cutlass.range_constexpr(self.plan.tile_k // CHUNK):
            k0 = kt * self.plan.tile_k + jj * CHUNK
            if cutlass.const_expr(not self.fold):
                k0 = k0 + 32 * c
            gi = 0 if cutlass.const_expr(self.group == 0) else cutlass.min(k0 // self.group, groups - 1)
            for mt in cutlass.range_constexpr(MT):
                for h in cutlass.range_constexpr(2):
                    buf[0][(jj * MT + mt) * 2 + h] = mS[grow[mt][h], gi]
                    if cutlass.const_expr(self.zeros):
                        buf[1][(jj * MT + mt) * 2 + h] = mZ[grow[mt][h], gi]

    @cute.jit
    def group_words(self, s, z):
        """One row's group: (-(M + z) twice, the scale twice) as words for the 16-bit dequantization; folded, the
        scale in fp32, and -(M + z) in fp32 too where the MMAs take the biased integers (`biased`)."""
        _, magic = magic_of(self.dtype)
        if cutlass.const_expr(self.zeros):
            off = -(z.to(Float32) + magic)
        else:
            off = Float32(-(8.0 + magic))
        if cutlass.const_expr(self.biased):
            return off, s.to(Float32)
        scale = s.to(Float32) if cutlass.const_expr(self.fold) else pair_of(s, self.dtype)
        return pair_of(self.dtype(off), self.dtype), scale

    @cute.jit
    def epilogue(self, accs, mY: cute.Tensor, mP: cute.Tensor, mC: cute.Tensor, last: cute.Tensor, tile: Int32,
                 split: Int32, srow, m: Int32, n: Int32, c: Int32, tidx: Int32, out: SimpleNamespace):
        """C value e of (m tile, n8 tile): W row srow[mt][e // 2], x row 8 nt + 2c + e % 2; y = the sum, or with
        `source` alpha * sum + beta * src (`out`). `gated`: W's rows are gate / up blocks of 8 (`pack_gate_up`), so
        value e < 2 (row r, a gate row) and e + 2 (row r + 8, its up row) meet in one thread: y's column
        r // 16 * 8 + r % 8 gets silu(gate) * up."""
        p = self.plan
        splits = cute.arch.grid_dim()[1]
        base = tile * p.tile_n
        # the thread's cells: (accumulator, W row, x row), the same walk for the store, the partials and the sum
        cells = [(accs[mt][nt], e, base + srow[mt][e // 2], 8 * nt + 2 * c + e % 2)
                 for mt in range(p.m_tiles) for nt in range(self.col_tiles) for e in range(4)]
        outs = [cell for cell in cells if cell[1] < 2] if self.gated else cells  # a gated output: its gate cell
        if splits == 1:
            for acc, e, row, col in outs:
                if row < n and col < m:
                    if cutlass.const_expr(self.gated):
                        mY[col, glu_column(row)] = silu_mul(acc[e], acc[e + 2], True).to(self.dtype)
                    else:
                        mY[col, row] = self.output(acc[e], out, col, row)
        else:
            for acc, e, row, col in cells:
                if row < n and col < m:
                    mP[split, col, row] = acc[e]
            bar = pipeline.NamedBarrier(barrier_id=_EPI_BAR, num_threads=32 * p.consumer_warps)
            if last_split(mC, tile, splits, last, bar, tidx == 0):
                for _, _, row, col in outs:
                    if row < n and col < m:
                        if cutlass.const_expr(self.gated):  # (an up row is its gate row + 8 < n: n % 16 == 0)
                            gate, up = self.split_sum(mP, splits, col, row), self.split_sum(mP, splits, col, row + 8)
                            mY[col, glu_column(row)] = silu_mul(gate, up, True).to(self.dtype)
                        else:
                            mY[col, row] = self.output(self.split_sum(mP, splits, col, row), out, col, row)

    @cute.jit
    def split_sum(self, mP: cute.Tensor, splits: Int32, col: Int32, row: Int32):
        """Every split's partial of (col, row) loaded at once (one round trip), added in split order."""
        parts = [mP[cutlass.min(s, splits - 1), col, row] for s in range(MAX_SPLITS)]
        total = parts[0]
        for s in cutlass.range_constexpr(1, MAX_SPLITS):
            if s < splits:
                total = total + parts[s]
        return total

    @cute.jit
    def output(self, total: Float32, out: SimpleNamespace, col: Int32, row: Int32):
        """y's element (x row col, W row row) from its fp32 sum, rounded once."""
        if cutlass.const_expr(self.source):
            total = out.alpha * total + out.beta * out.src[col, row].to(Float32)
        return total.to(self.dtype)


class Int4Dequant:
    """The dequantized weight (N, K) in the scales' dtype from the packed one, one pass (the M > 64 path: then a
    bf16 / fp16 GEMM): (q - z) s rounded once, `unpack_int4`'s values. A work item is one 16-byte span of a row
    (32 k, one group): 16 dequantized pairs (`collectives.int4`) stored as four 16-byte vectors in k order (word m
    of the span holds elements 8m .. 8m + 7, pair j elements 8m + 2j, + 1). Grid-stride walk (`GridStride`), the
    spans of a pass contiguous."""

    def __init__(self, dtype, group: int, zeros: bool, schedule):
        self.dtype, self.group, self.zeros, self.s = dtype, group, zeros, schedule

    @cute.jit
    def __call__(self, w: cute.Tensor, scales: cute.Tensor, zeros: cute.Tensor, out: cute.Tensor, ctas: Int32,
                 stream):
        self.kernel(w, scales, zeros, out).launch(grid=[ctas, 1, 1], block=[self.s.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, w: cute.Tensor, mS: cute.Tensor, mZ: cute.Tensor, out: cute.Tensor):
        from collectives.vector_io import as_vectors

        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows = extent(w, 0)
        spans = extent(w, 1) // 4  # per row
        total = rows * spans
        first, step, jump = self.s.thread_walk(bidx, gdim, tidx)
        _, magic = magic_of(self.dtype)
        u = self.s.unroll
        passes = (total - first + jump - 1) // jump
        for it in cutlass.range(passes, unroll=1):
            items = []
            for j in cutlass.range_constexpr(u):  # every item's loads first (u spans in flight), then the stores
                i = cutlass.min(first + it * jump + j * step, total - 1)  # (a clamped item repeats the last span)
                row = i // spans
                sp = i - row * spans
                wv = as_vectors(w[row, None], extent(w, 1), 4)
                words = cute.make_rmem_tensor((4,), Int32)
                words.store(wv[(None, sp)].load())
                gi = 0 if cutlass.const_expr(self.group == 0) else sp * 32 // self.group
                s = mS[row, gi]
                if cutlass.const_expr(self.zeros):
                    off = -(mZ[row, gi].to(Float32) + magic)
                else:
                    off = Float32(-(8.0 + magic))
                items.append((row, sp, words, s, off))
            for j in cutlass.range_constexpr(u):
                row, sp, words, s, off = items[j]
                neg2, s2 = pair_of(self.dtype(off), self.dtype), pair_of(s, self.dtype)
                ov = as_vectors(out[row, None], extent(out, 1), 8)
                for m_ in cutlass.range_constexpr(4):
                    r = cute.make_rmem_tensor((8,), self.dtype)
                    rw = cute.recast_tensor(r, Int32)
                    for pj in cutlass.range_constexpr(4):
                        rw[pj] = dequant_pair(words[m_], pj, neg2, s2, self.dtype)
                    ov[(None, 4 * sp + m_)].store(r.load())
