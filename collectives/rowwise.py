"""A row held in registers: the base of every "load once, reduce, compute, store" row-wise kernel
(RMSNorm, LayerNorm, softmax, log-softmax, cross-entropy; curriculum lessons 4-7).

A row of N elements is cut into 128-bit vectors of `vec` elements. The `threads_per_row` (tpr)
threads of a row group, in each of the `cluster_n` CTAs of a cluster, hold `vpt` vectors each:

    vector index of (rank, k, lane) = (rank * vpt + k) * tpr + lane,   k < vpt

so for every k the row group reads one contiguous, coalesced run of tpr vectors, and a CTA of a
cluster owns one contiguous slice of the row. Vectors past the row's end are never loaded or
stored; they hold a fill value (0 for sums, -inf for maxima) so the reductions need no masks.

Staging (`schedules.row_tiling.HeldRowPlan.staging`): with "regs" `RowSlice.fetch` loads the
vectors into registers, which hold them until the output is written. With "smem" it issues one
128-bit `cp.async.cg` per vector into this CTA's slice of the row in a shared-memory buffer
(`stage_buffer`: rows_per_cta x (tpr * vpt) vectors, vector k of lane l at k * tpr + l, so a warp
writes and reads 512 contiguous bytes), `RowSlice.arrive` commits and waits once, and
`RowSlice.read` loads the vectors back for each pass over the row: every byte of the row is in
flight at once and only the pass's working set is in registers, so shared memory, not registers,
bounds the CTAs per SM. A thread reads back only what its own cp.async wrote, so the wait is the
only synchronization (no barrier); the reduction's slots are separate allocations. Vectors past the
row's end are never copied: `read` gives the fill value for them, exactly as `load` does, so the
fp32 math (and the output, bit for bit) is that of the register path.

`RowSlice` does the loads, stores and per-thread folds; `RowReducer` turns a per-thread value
into the row's value: warp butterfly, then shared memory across the warps of a row
(`collectives.reduce.group_reduce`), then distributed shared memory across the CTAs of a cluster
(`collectives.reduce.cluster_reduce`). Schedules come from `schedules.row_tiling.plan_held_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync

from collectives.reduce import cluster_reduce, cluster_smem_slots, group_reduce, group_smem_slots
from collectives.vector_io import as_vectors
from schedules.row_tiling import HeldRowPlan


@dataclass(frozen=True)  # frozen: the DSL then knows a loop cannot mutate it (no loop-carried state)
class RowSlice:
    """The vectors of one row that this thread holds. Build inside a kernel; `lane` is the thread's
    index in its row group, `rank` its CTA's rank in the cluster (0 without one), `n` the row length
    (a multiple of `vec`: the kernels' aligned variants require it, the scalar ones have vec=1).
    `compact` (shared-memory staging, aligned rows): address the vectors from one per-thread base
    (`mine`: vector k at a constant offset) and test vector k against the count left past it, so
    the loop-invariant addresses and predicates take a few registers, not a pair per vector."""

    vec: int
    tpr: int
    vpt: int
    lane: Any
    rank: Any
    n: Any
    compact: bool = False

    @property
    def nv(self):
        return self.n // self.vec if self.vec > 1 else self.n

    def index(self, k: int):
        """Vector index (in the row) of this thread's k-th vector."""
        return (self.rank * self.vpt + k) * self.tpr + self.lane

    def valid(self, k: int):
        if self.compact:
            return k * self.tpr < self.nv - self.index(0)
        return self.index(k) < self.nv

    def mine(self, row: cute.Tensor) -> cute.Tensor:
        """(vec, vpt): this thread's vectors of a flat row, from its first one (`compact`)."""
        first = self.view(row)[None, self.index(0)]
        return cute.make_tensor(first.iterator, cute.make_layout((self.vec, self.vpt), stride=(1, self.tpr * self.vec)))

    def vector(self, rv: cute.Tensor, k: int) -> cute.Tensor:
        """Vector k of this thread in `rv` (`view` of a row, or `mine` when `compact`)."""
        return rv[None, k] if self.compact else rv[None, self.index(k)]

    def vectors(self, row: cute.Tensor) -> cute.Tensor:
        return self.mine(row) if self.compact else self.view(row)

    def view(self, row: cute.Tensor) -> cute.Tensor:
        """A flat row (unit stride, 16-byte aligned when vec > 1) as (vec, N / vec) vectors."""
        return as_vectors(row, self.n, self.vec)

    @cute.jit
    def load(self, row: cute.Tensor, ok, fill: cutlass.Constexpr[float]):
        """This thread's vectors of `row` (a list of TensorSSA in the row's dtype); `fill` where the
        vector is past the row's end or `ok` (the row exists) is false."""
        rv = self.vectors(row)
        out = []
        for k in cutlass.range_constexpr(self.vpt):
            v = cute.full((self.vec,), fill, row.element_type)
            if ok and self.valid(k):
                v = self.vector(rv, k).load()
            out.append(v)
        return out

    # --- staging: "regs" (load) or "smem" (cp.async into a buffer, read back per pass) ----------
    def slot(self, k: int):
        """Where this thread's k-th vector sits in its row group's staging buffer."""
        return k * self.tpr + self.lane

    @cute.jit
    def fetch(self, row: cute.Tensor, ok, fill: cutlass.Constexpr[float], buf=None):
        """Start holding this thread's vectors of `row`: without `buf` (register staging) they are
        loaded (`load`) and returned; with `buf` (this row group's `stage_buffer` slice) one
        128-bit cp.async per vector inside the row copies them there, and the held row is `buf`
        (read it after `arrive`). Either way hand the result to `read`."""
        if cutlass.const_expr(buf is None):
            return self.load(row, ok, fill)
        rv = self.vectors(row)
        # 128-bit copies, an fp32 weight next to bf16 rows two per vector: one cute.copy each, on a 16-byte piece.
        # (cute.copy with the 128-bit atom on a whole 32-byte vector issued one copy, leaving its upper half
        # unwritten: the staged fp32 weights, GPU test test_norm_backward_fp32_weight_fitted.)
        bits = min(128, self.vec * row.element_type.width)
        per = bits // row.element_type.width
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), row.element_type,
                                   num_bits_per_copy=bits)
        for k in cutlass.range_constexpr(self.vpt):
            if ok and self.valid(k):
                src = cute.zipped_divide(self.vector(rv, k), (per,))
                dst = cute.zipped_divide(buf[None, self.slot(k)], (per,))
                for j in cutlass.range_constexpr(self.vec // per):
                    cute.copy(atom, src[None, j], dst[None, j])
        return buf

    @staticmethod
    def commit(staged: bool):
        """With shared-memory staging, close this thread's copies issued so far into one group
        (a pipeline's prologue: the first tile, waited for by the first `arrive(staged, 1)`)."""
        if staged:
            cute.arch.cp_async_commit_group()

    @staticmethod
    def arrive(staged: bool, pending: int = 0):
        """After the last `fetch` of a tile: with shared-memory staging, commit this thread's copies
        as one group and wait until at most `pending` groups are in flight: 0 waits for all; 1 (a
        pipeline that has just fetched the next tile) waits for the tile before it. The copies
        waited for are then visible to this thread (no other thread reads them)."""
        if staged:
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(pending)

    # --- prefetching the next row tile into a second register set ----------------------------
    def ahead(self, dtype) -> cute.Tensor:
        """A (vec, vpt) register fragment that holds this thread's vectors of the next tile."""
        return cute.make_rmem_tensor(cute.make_layout((self.vec, self.vpt)), dtype)

    @cute.jit
    def load_ahead(self, frag: cute.Tensor, row: cute.Tensor, ok, fill: cutlass.Constexpr[float]):
        """Issue the loads of this thread's vectors of `row` into `frag` (`ahead`): exactly `load`'s
        values, consumed by `take` one tile later, so their latency hides behind a tile."""
        vals = self.load(row, ok, fill)
        for k in cutlass.range_constexpr(self.vpt):
            frag[None, k].store(vals[k])

    def take(self, frag: cute.Tensor) -> list:
        """The vectors `load_ahead` put into `frag`, as the list `fetch` returns (register staging);
        read them before `frag` is refilled."""
        return [frag[None, k].load() for k in range(self.vpt)]

    @cute.jit
    def read(self, held, ok, fill: cutlass.Constexpr[float]):
        """This thread's vectors (TensorSSA in the row's dtype) of a row `fetch` returned: the
        registers as they are, or a fresh read of the staging buffer (`fill` outside the row)."""
        if cutlass.const_expr(isinstance(held, list)):
            return held
        return [self.read_one(held, k, ok, fill) for k in range(self.vpt)]

    @cute.jit
    def read_one(self, buf: cute.Tensor, k: cutlass.Constexpr[int], ok, fill: cutlass.Constexpr[float]):
        """Vector k of this thread from a staging buffer (`fill` outside the row)."""
        v = cute.full((self.vec,), fill, buf.element_type)
        if ok and self.valid(k):
            v = buf[None, self.slot(k)].load()
        return v

    def lazy(self, held, values: list, ok, fill: float):
        """`values` (fp32, read from `held`) for a function that walks them more than once (like
        `online_softmax.local_state`): with shared-memory staging a sequence that reads vector k
        from the buffer at each access, so a pass holds one vector at a time, not the row."""
        if isinstance(held, list):
            return values
        return _Reread(self, held, ok, fill)

    def again(self, held, values: list, ok, fill: float):
        """`values` as read from `held` earlier, for a later pass: register staging keeps them (the
        same SSA values, so the register path is unchanged); shared-memory staging reads the
        buffer again, so nothing row-sized stays live across a reduction."""
        if isinstance(held, list):
            return values
        return self.to_f32(self.read(held, ok, fill))

    @cute.jit
    def store(self, row: cute.Tensor, ok, values):
        """Write this thread's vectors `values` (fp32 TensorSSA) into `row`, converted to its dtype."""
        rv = self.vectors(row)
        for k in cutlass.range_constexpr(self.vpt):
            if ok and self.valid(k):
                self.vector(rv, k).store(values[k].to(row.element_type))

    @staticmethod
    def to_f32(values):
        return [v.to(Float32) for v in values]

    @staticmethod
    def sum(values):
        """Sum of all held elements (fp32), vector lanes first, then across vectors."""
        acc = values[0]
        for k in range(1, len(values)):
            acc = acc + values[k]
        return acc.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

    @staticmethod
    def dot(a, b):
        """sum(a * b) over all held elements (fp32): vector lanes first, then across vectors, with
        explicit fmas. Written as products and sums, ptxas contracted some pairs into FFMA and not
        others depending on the surrounding code, so two kernels of the same math (prefetch on and
        off) disagreed in the last bit (GPU test tests/rowwise/test_bwd_prefetch_gpu.py::test_fp32_rows)."""
        acc = None
        for k in range(len(a)):
            x = a[k]  # once: `a` may be a staged row that reads shared memory on each access
            y = x if b is a else b[k]
            acc = x * y if acc is None else cute.math.fma(x, y, acc)
        return acc.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

    @cute.jit
    def masked_sum(self, values):
        """Sum of the held elements of vectors inside the row (vectors past its end are skipped:
        for values whose fill would not be 0, like x - mean)."""
        acc = Float32(0.0)
        for k in cutlass.range_constexpr(self.vpt):
            s = values[k].reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if self.valid(k):
                acc = acc + s
        return acc


class _Reread:
    """A staged row as a sequence of fp32 vectors, each access a fresh shared-memory read."""

    def __init__(self, sl: RowSlice, buf, ok, fill: float):
        self.sl, self.buf, self.ok, self.fill = sl, buf, ok, fill

    def __len__(self):
        return self.sl.vpt

    def __getitem__(self, k: int):
        return self.sl.read_one(self.buf, k, self.ok, self.fill).to(Float32)


@dataclass(frozen=True)
class RowReducer:
    """Row reductions for a CTA of `threads` threads in groups of `tpr`, over `cluster_n` CTAs.

    `RowReducer.allocate` (inside the kernel) takes one set of shared-memory slots per call site:
    `widths[s]` scalars for site s. Every thread of the CTA must call `reduce` for every site (it
    has barriers), also threads whose row is past the end. Between tiles the caller runs
    `end_tile` (a CTA barrier, so the slots of the group stage may be rewritten). In a cluster the
    kernel's `cluster_join` must come before the first `reduce`. The cluster
    stage alternates two slot sets by tile parity instead of waiting again. `sync` is
    `HeldRowPlan.cluster_sync`: with "mbarrier" each cluster slot set has its own mbarrier
    (`cluster_reduce`), initialized here, before the kernel's `cluster_start`.
    """

    threads: int
    tpr: int
    cluster_n: int
    group_bufs: tuple
    cluster_bufs: tuple
    mbars: object = None  # "mbarrier" sync: 2 per call site (one per slot set), else None
    tree: bool = False  # `HeldRowPlan.cluster_fold` "tree": the cluster's partials folded by a butterfly

    @staticmethod
    def allocate(smem, threads: int, tpr: int, cluster_n: int, widths: tuple[int, ...],
                 sync: str = "barrier", fold: str = "serial") -> "RowReducer":
        group_bufs, cluster_bufs = [], []
        for w in widths:
            g = group_smem_slots(threads, tpr, w)
            group_bufs.append(smem.allocate_tensor(Float32, cute.make_layout(g), byte_alignment=16) if g else None)
            c = cluster_smem_slots(threads // tpr, cluster_n, w)
            cluster_bufs.append(
                smem.allocate_tensor(Float32, cute.make_layout((c, 2)), byte_alignment=16) if c else None)
        mbars = None
        if cluster_n > 1 and sync == "mbarrier":
            mbars = smem.allocate_array(cutlass.Int64, num_elems=2 * len(widths), byte_alignment=8)
            _init_mbarriers(mbars, 2 * len(widths))
        return RowReducer(threads, tpr, cluster_n, tuple(group_bufs), tuple(cluster_bufs), mbars,
                          fold == "tree" and cluster_n > 1)

    @property
    def needs_barrier(self) -> bool:
        # mbarrier sync also needs it: thread 0 arms a slot set's barrier for tile i + 2 only after
        # every thread has waited on its tile i phase (a parity wait cannot tell two phases apart)
        return any(b is not None for b in self.group_bufs) or self.mbars is not None

    @cute.jit
    def reduce(self, val, op, init, site: cutlass.Constexpr[int], tile):
        """The row's reduction of `val` (a scalar or tuple) by `op`, in every thread of the row;
        `tile` is the index of the CTA's row tile in its loop (0, 1, 2, ...: its parity picks the
        cluster slot set, and with mbarrier sync its half the barrier's phase)."""
        val = group_reduce(val, op, self.tpr, self.group_bufs[site], init)
        if cutlass.const_expr(self.cluster_n > 1):
            tidx, _, _ = cute.arch.thread_idx()
            _, rank, _ = cute.arch.block_idx()
            parity = tile % 2
            if cutlass.const_expr(self.mbars is None):
                val = cluster_reduce(val, op, self.cluster_n, self.cluster_bufs[site][None, parity],
                                     tidx // self.tpr, tidx % self.tpr, rank, tree=self.tree, row_threads=self.tpr)
            else:
                val = cluster_reduce(val, op, self.cluster_n, self.cluster_bufs[site][None, parity],
                                     tidx // self.tpr, tidx % self.tpr, rank, self.mbars + (2 * site + parity),
                                     (tile // 2) % 2, self.threads // self.tpr, tree=self.tree, row_threads=self.tpr)
        return val

    @cute.jit
    def end_tile(self):
        if cutlass.const_expr(self.needs_barrier):
            cute.arch.barrier()


@cute.jit
def _init_mbarriers(mbars, count: cutlass.Constexpr[int]):
    """`count` mbarriers of one arrival each, by the first threads; fenced for the cluster (the
    kernel's `cluster_start` follows before any peer signals them)."""
    tidx, _, _ = cute.arch.thread_idx()
    if tidx < count:
        cute.arch.mbarrier_init(mbars + tidx, 1)
    cute.arch.mbarrier_init_fence()


def stage_buffer(smem, dtype, vec: int, tpr: int, vpt: int, rows_per_cta: int, stages: int = 1) -> cute.Tensor:
    """A CTA's staging buffer for one row tensor: (vec, tpr * vpt, rows_per_cta) elements of
    `dtype`, 16-byte aligned; `buf[None, None, group]` is a row group's slice for `RowSlice.fetch`.
    `stages` > 1 (prefetching row tiles): (vec, tpr * vpt, rows_per_cta, stages), a row group's
    `stages` buffers `buf[None, None, group, s]` one after another."""
    chunk = tpr * vpt
    if stages == 1:
        layout = cute.make_layout((vec, chunk, rows_per_cta), stride=(1, vec, vec * chunk))
    else:
        layout = cute.make_layout((vec, chunk, rows_per_cta, stages),
                                  stride=(1, vec, vec * chunk * stages, vec * chunk))
    return smem.allocate_tensor(dtype, layout, byte_alignment=16)


@cute.jit
def cluster_start(cluster_n: cutlass.Constexpr[int]):
    """Before the first write into a peer's shared memory every CTA of the cluster must have started:
    each CTA arrives here, at its start, and waits in `cluster_join`. The norm forwards join right
    after issuing their first tile's loads, so the cluster barrier's round trip runs under those
    loads (arriving and waiting here cost the RMSNorm forward at 64k, 8-CTA clusters with one tile
    each, 6 % of its warps' samples on UCGABAR_WAIT in PC sampling; QuACK also arrives at its
    start and waits later); the backwards join once after their first prefetch, the softmax forward
    at its start (see `cute_kernels.rowwise.softmax.SoftmaxFwd.kernel`)."""
    if cutlass.const_expr(cluster_n > 1):
        cute.arch.cluster_arrive_relaxed()


@cute.jit
def cluster_join(cluster_n: cutlass.Constexpr[int], first):
    """The wait half of `cluster_start`, where `first` (the CTA's first row tile, its loads issued;
    every thread of the CTA passes the same value) and before any `RowReducer.reduce`."""
    if cutlass.const_expr(cluster_n > 1):
        if first:
            cute.arch.cluster_wait()


def my_tile_count(rows, rows_per_cta: int, bidx, gdim, index64: bool):
    """Row tiles this CTA walks when CTAs stride over `ceil(rows / rows_per_cta)` tiles by the grid
    size (unit-step count: DSL 4.8.1 cannot trace a loop whose dynamic step is 64-bit).
    Returns (count, bidx, gdim) in the index width."""
    tiles = (rows + rows_per_cta - 1) // rows_per_cta
    if index64:
        from cutlass import Int64

        bidx, gdim, tiles = Int64(bidx), Int64(gdim), Int64(tiles)
    return (cutlass.max(tiles - bidx, 0) + gdim - 1) // gdim, bidx, gdim


# --- the row-held kernels' shared frame ------------------------------------------------------------
class HeldRowKernel:
    """The base of the row-held kernels (norms, softmax, cross-entropy backward): their launch geometry (CTAs x
    cluster ranks, grid-stride row tiles), staging buffers, the software pipeline across row tiles and the (N,)
    operands staged once a CTA, for a `schedules.row_tiling.HeldRowPlan`."""

    pipelined = False  # the tile loop implements `HeldRowPlan.prefetch` (the backward kernels)
    # ... only on held rows (the forwards: their one staging buffer refilled once the row is read out of it)
    prefetch_needs_hold = False
    holds = False  # the tile loop implements `HeldRowPlan.hold` (the softmax forward)
    held_min_regs = 80  # with `hold`: registers per thread the held row needs (sets the CTAs per SM)

    def __init__(self, vec: int, index64: bool, plan: HeldRowPlan):
        if plan.prefetch and not self.pipelined:
            raise ValueError(f"{type(self).__name__}: prefetch is not built for this kernel (plan {plan})")
        if plan.prefetch and self.prefetch_needs_hold and not plan.hold:
            raise ValueError(f"{type(self).__name__}: prefetch is built for held rows only (hold=True: the buffer is "
                             f"refilled once read); plan {plan}")
        if plan.hold and not self.holds:
            raise ValueError(f"{type(self).__name__}: hold is not built for this kernel (plan {plan})")
        self.vec, self.index64, self.plan = vec, index64, plan
        self.threads = plan.tiling.threads
        self.tpr = plan.tiling.threads_per_row
        self.vpt = plan.tiling.unroll
        self.cluster_n = plan.cluster_n
        self.rows_per_cta = plan.tiling.rows_per_cta
        self.staged = plan.staging == "smem"
        self.prefetch = plan.prefetch
        self.hold = plan.hold
        self.one_tile = plan.one_tile

    def stage_buffers(self, smem, dtypes: tuple, group) -> list:
        """With shared-memory staging, this row group's staging buffer for each row tensor (of
        the given dtypes, fetched in that order; with `prefetch` a (vec, chunk, 2) pair of them);
        without, Nones (`RowSlice.fetch` loads into registers)."""
        if not self.staged:
            return [None] * len(dtypes)
        bufs = [stage_buffer(smem, dt, self.vec, self.tpr, self.vpt, self.rows_per_cta, self.plan.stages)
                for dt in dtypes]
        return [b[None, None, group, None] if self.plan.stages > 1 else b[None, None, group] for b in bufs]

    # --- software pipelining across row tiles (`HeldRowPlan.prefetch`) -------------------------
    # Prologue: `fetch_rows` of the first tile into stage 0, `RowSlice.commit`. Tile i: `held_rows`
    # of stage i % 2 (registers: read out of the fragments now), `fetch_rows` of tile i + 1 into
    # the other stage, `RowSlice.arrive(staged, 1)` (cp.async: tile i's group has landed, tile
    # i + 1's stays in flight), then the tile's math exactly as without prefetch. A thread refills
    # only the slots it read itself one tile earlier (their values long consumed), so no barrier.
    def holders(self, sl: RowSlice, smem, dtypes: tuple, group) -> list:
        """Where each row tensor of a tile is held across the tile loop: staging buffers (smem),
        next-tile register fragments (regs with prefetch), or Nones (plain register loads)."""
        if self.staged:
            return self.stage_buffers(smem, dtypes, group)
        if self.prefetch:
            return [sl.ahead(dt) for dt in dtypes]
        return [None] * len(dtypes)

    @cute.jit
    def fetch_rows(self, sl: RowSlice, holders: list, srcs: list, ok, fill: cutlass.Constexpr[float], stage):
        """Start fetching this thread's vectors of the rows `srcs` (one per row tensor) into
        `holders` (stage `stage` of a prefetching plan); returns the held rows (`RowSlice.read`)."""
        out = []
        for h, src in zip(holders, srcs):
            if cutlass.const_expr(self.staged):  # (a held row refilled: one buffer, `HeldRowPlan.stages` 1)
                out.append(sl.fetch(src, ok, fill, h[None, None, stage] if self.plan.stages > 1 else h))
            elif cutlass.const_expr(self.prefetch):
                sl.load_ahead(h, src, ok, fill)
                out.append(h)
            else:
                out.append(sl.fetch(src, ok, fill))
        return out

    def held_rows(self, sl: RowSlice, holders: list, stage) -> list:
        """Prefetching: the held rows of the tile in `stage` (registers: their values, read now)."""
        if self.staged:
            return [h[None, None, stage] if self.plan.stages > 1 else h for h in holders]
        return [sl.take(h) for h in holders]

    # Staged operands: the element types of the row tensors and of the (N,) operands; fp32
    # accumulator row slices (set by the subclasses).
    staged_rows: tuple = ()
    staged_params: tuple = ()
    accumulators = 0
    staged_min_regs = 64  # the norms' backward: 128 (its fp32 dweight/dbias work spills below)

    def row_smem_bytes(self, accumulators: int | None = None) -> int:
        """Row-sized shared memory of a CTA (with `accumulators` fp32 row slices instead of the kernel's own)."""
        return self.plan.row_smem_bytes(self.vec, tuple(t.width // 8 for t in self.staged_rows),
                                        tuple(t.width // 8 for t in self.staged_params),
                                        self.accumulators if accumulators is None else accumulators)

    def residency_smem_bytes(self) -> int:
        """The shared memory that sets the CTAs per SM ptxas is asked to fit under staging (its register cap)."""
        return self.row_smem_bytes()

    @cute.jit
    def stage_vectors(self, smem, sl: RowSlice, group, vecs: cutlass.Constexpr,
                      with_first_tile: cutlass.Constexpr = False, in_regs: cutlass.Constexpr = False):
        """The (N,) operands `vecs` (weight, bias; None where absent) as the loop reads them: with
        shared-memory staging copied once per CTA into shared memory by row group 0 (a CTA
        barrier before the tile loop) and read from there; else the tensors, loaded per tile.
        `with_first_tile` (one row group per CTA, so each thread reads only the slots it copied
        itself): no wait and no barrier here, the copies complete with the first tile's (its
        `RowSlice.arrive` waits for every group), so a CTA that does one tile, as the uncapped
        forwards do, no longer pays a round trip to L2 for the weights before its row loads start.
        The caller waits for them after the loop (a CTA with no tile).
        `in_regs` (register staging): the 16-bit operands are loaded once here and held in registers across the
        tile loop (packed, as loaded) instead of being loaded again per tile; an fp32 weight stays per tile."""
        if cutlass.const_expr(not self.staged):
            if cutlass.const_expr(in_regs):
                return [v if v is None or v.element_type.width != 16 else sl.load(v, True, 0.0) for v in vecs]
            return vecs
        out = []
        for v in vecs:
            if cutlass.const_expr(v is None):
                out.append(None)
            else:
                buf = stage_buffer(smem, v.element_type, self.vec, self.tpr, self.vpt, 1)[None, None, 0]
                if group == 0:
                    sl.fetch(v, True, 0.0, buf)
                out.append(buf)
        if cutlass.const_expr(with_first_tile and self.rows_per_cta == 1):
            RowSlice.commit(True)
        else:
            sl.arrive(True)
            cute.arch.barrier()
        return out

    def vector_of(self, sl: RowSlice, held):
        """This thread's fp32 vectors of an operand `stage_vectors` returned."""
        if isinstance(held, list):  # held in registers (`stage_vectors`' in_regs)
            return sl.to_f32(held)
        return sl.to_f32(sl.read(held, True, 0.0) if self.staged else sl.load(held, True, 0.0))

    def resident_ctas(self) -> int:
        """CTAs per SM this kernel is built to fit: under staging what shared memory and the register floor allow (its
        `.minnctapersm`), else the plan's. A staged plan's own `ctas_per_sm` counts its staged rows alone (not the
        weights beside them): the forwards' capped grid is sized by this instead
        (`cute_kernels.rowwise.launch.launch_params`)."""
        if self.staged:
            regs = self.held_min_regs if self.hold else self.staged_min_regs
            return self.plan.staged_residency(self.residency_smem_bytes(), regs)
        return self.plan.ctas_per_sm

    def tile_count(self, rows, bidx, gdim):
        """(row tiles this CTA walks, bidx, gdim) in the index width (`collectives.rowwise.my_tile_count`); one, a
        trace-time constant, for a kernel built for one CTA per tile (`HeldRowPlan.one_tile`: `grid` launches that)."""
        count, bidx, gdim = my_tile_count(rows, self.rows_per_cta, bidx, gdim, self.index64)
        if cutlass.const_expr(self.one_tile):
            count = 1
        return count, bidx, gdim

    def grid(self, rows, max_ctas):
        tiles = (rows + self.rows_per_cta - 1) // self.rows_per_cta
        # (one_tile: a CTA per tile whatever max_ctas says; a tile past the rows is predicated off)
        ctas = cutlass.max(tiles if cutlass.const_expr(self.one_tile) else cutlass.min(tiles, max_ctas), 1)
        cn = self.cluster_n
        launch = dict(grid=[ctas, cn, 1], block=[self.threads, 1, 1], cluster=[1, cn, 1] if cn > 1 else None)
        if self.staged:
            # Registers no longer bound the CTAs per SM: ask ptxas to fit as many as shared memory
            # allows (a register cap); the carveout is given so the DSL does not query a device.
            launch.update(min_blocks_per_mp=self.resident_ctas(), preferred_smem_carveout=100)
        elif self.plan.acc_regs or self.plan.reg_cap:  # register accumulators of a register-held plan, or its
            # register cap (`HeldRowPlan.reg_cap`): keep its CTAs per SM
            launch.update(min_blocks_per_mp=self.plan.ctas_per_sm, preferred_smem_carveout=100)
        return launch
