"""FlashAttention backward schedules: which keys a CTA owns, how its warps split the work, where dQ goes.

The backward (`cute_kernels/attention/backward.py`) is FA3's arrangement. One CTA per (K/V block of
`tile_n` keys, K/V head, batch); its K and V stay in shared memory while the producer warp streams the
query blocks (Q, dO, and their LSE / D rows) through a ring of `stages`. With GQA the CTA walks every
query head of its K/V head's group, so dK and dV are summed over the group in registers (no fp32
dK / dV accumulators in global memory, no atomics, the same bits every run).

Warp roles (3 warpgroups at tile_n 128):
* warpgroup 0 gives its registers away (`producer_regs`): warp 0 issues the TMA loads, warp 1 adds
  each query block's dQ partial into the fp32 dQ accumulator in global memory with bulk reduce-adds
  (`cp.reduce.async.bulk .add.f32`), after the consumers have staged it in shared memory;
* consumer warpgroup w (`consumer_regs`) owns keys [64 w, 64 w + 64) of the block: per query block it
  computes S^T = K_w Q^T and dP^T = V_w dO^T (WGMMA, both operands in smem: the transposed products,
  FA3's SdP_swapAB, so that P^T and dS^T land in registers as the A operand of the next GEMMs),
  P = exp2(S * scale_log2 - LSE2) with LSE2 per column, dS = P (dP - D), then dV_w += P^T dO and
  dK_w += dS^T Q with A from registers; dS also goes to shared memory (q-contiguous), where both
  warpgroups compute dQ = dS K (`dq_split`).

`dq_split`, how the dQ = dS K tile (tile_m, D) is cut among the consumer warpgroups:
* "m": each takes 64 query rows (tile_m 128, D <= 128: FA3's D = 64 arrangement);
* "n": each takes D / 2 columns (tile_m 64, D a multiple of 128: D = 128);
* "one": warpgroup 0 computes all of it (D = 96, whose halves are not whole 64-column swizzle atoms).
* "k": each warpgroup computes a whole (tile_m, D) partial over its own 64 keys, from the dS rows it wrote itself:
  no barrier across the consumers, the same dQ work on both; warpgroup 1 adds its partial onto warpgroup 0's in
  shared memory, and one bulk reduce-add takes the sum (tile_m 64, D <= 96). Measured 0.94x "one" at D = 64.

The dQ partials are kept in the accumulator's register order (the "MMA order": element e of thread t
at (e // 4) * 512 + 4 t + e % 4 of the warpgroup's chunk): 128-bit smem stores without bank conflicts,
one contiguous bulk reduce-add per chunk. The postprocess kernel reads them back with the same
partition and writes dQ * scale in the input dtype.

`kv_split` "dim" (D = 192, 256; FA3's D = 256 arrangement): 64 x 64 tiles, the two consumer warpgroups take halves
of the head dim for dK, dV and dQ, and halves of the keys for S = Q K^T and dP = dO V^T (not transposed: per-row
statistics); P and dS go through shared memory (q x keys, keys contiguous), where dV = P^T dO, dK = dS^T Q and
dQ = dS K read them as MN- / K-major operands. Registers: dK, dV and the dQ part 64 each, S and dP 16 each.

The tile order: the grid is (key blocks, K/V heads, batch), x fastest, key blocks ascending: with a causal mask key
block 0 walks the most query blocks, so the longest columns start first. Deterministic causal runs (and launches) the
key blocks descending instead, the order its semaphores count (`backward.FlashAttnBwd.dq_writer`).

`p_smem` (kv_split "rows"): P^T goes to shared memory by stmatrix (each warpgroup its own key rows, one buffer) and
dV += P^T dO reads it there, so the bf16 P is not held in registers while dV runs: at tile_m 128, D = 64 (FA3's tile)
the two register-A GEMMs together make ptxas serialize every WGMMA (C7512); with P from smem it compiles clean.

Registers per consumer thread at D = 128, tile 64 x 128: dK and dV 64 each, S^T and dP^T 32 each, the dQ
partial 32, P and dS as bf16 A operands 16 each: FA3's 240-register budget (24 + 2 x 240 <= 512).
"""

from __future__ import annotations

from dataclasses import dataclass

SMEM_BYTES = 232448
BARRIER_BYTES = 1024
DQ_SPLITS = ("", "m", "n", "one", "k")
KV_SPLITS = ("rows", "dim")
HEAD_DIMS_BWD = (64, 96, 128, 192, 256)


@dataclass(frozen=True)
class AttentionBwdSchedule:
    tile_m: int = 64  # query rows per block of the walk (the N of S^T = K Q^T)
    tile_n: int = 128  # keys per CTA: 64 per consumer warpgroup
    stages: int = 2  # Q / dO ring stages (the dS buffer has as many)
    dq_split: str = ""  # "m", "n", "one" (see the module doc); "": derived from tile_m and the head dim
    kv_split: str = "rows"  # dK / dV cut among the consumers by key rows (S^T in registers) or by head dim (D > 128)
    dq_buffers: int = 1  # smem buffers of the dQ parts: 2 lets block i + 1's store proceed while block i's add waits
    early_stats: bool = False  # kv_split rows: LSE and D loaded into registers while the GEMMs run (else where used)
    p_smem: bool = False  # kv_split rows: P^T to smem (stmatrix), dV's A operand from there instead of registers
    producer_regs: int = 24
    consumer_regs: int = 240

    def __post_init__(self):
        if self.tile_m not in (64, 128):
            raise ValueError(f"tile_m must be 64 or 128, got {self.tile_m}")
        if self.tile_n not in (64, 128):
            raise ValueError(f"tile_n must be 64 or 128 (64 keys per consumer warpgroup), got {self.tile_n}")
        if self.kv_split not in KV_SPLITS:
            raise ValueError(f"kv_split must be one of {KV_SPLITS}, got {self.kv_split!r}")
        if self.kv_split == "dim" and (self.tile_m, self.tile_n) != (64, 64):
            raise ValueError("kv_split 'dim' is built for 64 x 64 tiles")
        if self.stages not in (1, 2):
            raise ValueError(f"stages must be 1 or 2, got {self.stages}")
        if self.dq_buffers not in (1, 2):
            raise ValueError(f"dq_buffers must be 1 or 2, got {self.dq_buffers}")
        if self.dq_split not in DQ_SPLITS:
            raise ValueError(f"dq_split must be one of {DQ_SPLITS[1:]} (or '' for the head dim's), got {self.dq_split!r}")
        if self.producer_regs % 8 or self.consumer_regs % 8:
            raise ValueError("register budgets must be multiples of 8")

    @property
    def consumer_wgs(self) -> int:
        return 2 if self.kv_split == "dim" else self.tile_n // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumer_wgs)

    def split(self, head_dim: int) -> str:
        """The dQ split at this head dim (`dq_split`, or the one that fits)."""
        if self.kv_split == "dim":
            return "n"
        if self.dq_split:
            return self.dq_split
        if self.consumer_wgs == 1:
            return "one"
        if self.tile_m == 128:
            return "m"
        return "n" if head_dim % 128 == 0 else "one"

    def dq_wgs(self, head_dim: int) -> int:
        """Consumer warpgroups that compute (a part of) dQ."""
        return 1 if self.split(head_dim) == "one" else self.consumer_wgs

    def dq_chunks(self, head_dim: int) -> int:
        """Chunks of a dQ tile in shared memory and in the accumulator (one per warpgroup part; "one" and "k": 1)."""
        return 1 if self.split(head_dim) in ("one", "k") else self.consumer_wgs

    @property
    def early_dv(self) -> bool:
        """dV += P^T dO issued before the wait for dP^T (under the dS math), at tile_m 64; at 128 P's bf16 copy would
        live beside the fp32 S and dP (64 + 64 + 32 registers): dV then follows dS, as in FA3."""
        return self.tile_m == 64

    def atom_cols(self, head_dim: int) -> int:
        """The head-dim extent the smem swizzle atom of Q, dO, K, V is chosen for: the whole D, or with kv_split "dim"
        one warpgroup's half (D = 192: 96 columns, the 64-byte swizzle, so that each half is whole atoms)."""
        return head_dim // 2 if self.kv_split == "dim" else head_dim

    def consumer_budget(self, head_dim: int, computes_dq: bool) -> int:
        """setmaxnreg of a consumer warpgroup: `consumer_regs`, or with dQ on warpgroup 0 alone ("one", two consumers)
        16 more for it and 16 fewer for the other (FA3's 256 / 224 at D = 96)."""
        if self.split(head_dim) == "one" and self.consumer_wgs == 2:
            return self.consumer_regs + (16 if computes_dq else -16)
        return self.consumer_regs

    def dq_tile(self, head_dim: int) -> tuple[int, int]:
        """The (rows, columns) of dQ one warpgroup computes."""
        sp = self.split(head_dim)
        if sp == "m":
            return 64, head_dim
        if sp == "n":
            return self.tile_m, head_dim // 2
        return self.tile_m, head_dim

    def smem_bytes(self, head_dim: int, elem: int = 2) -> int:
        q = self.stages * self.tile_m * head_dim * elem  # Q and dO rings, each
        kv = self.tile_n * head_dim * elem  # K and V, each
        ds = self.stages * self.tile_n * self.tile_m * elem * (2 if self.kv_split == "dim" else 1)  # dS (and P)
        if self.p_smem:
            ds += self.tile_n * self.tile_m * elem  # P, one buffer: each warpgroup reads only its own rows
        dq = self.tile_m * head_dim * 4 * self.dq_buffers
        stats = 2 * self.stages * self.tile_m * 4
        return 2 * q + 2 * kv + ds + dq + stats + BARRIER_BYTES

    def check(self, head_dim: int, elem: int = 2) -> None:
        """Raises ValueError when this schedule cannot run at `head_dim`."""
        if head_dim not in HEAD_DIMS_BWD:
            raise ValueError(f"the backward is built for head dims {HEAD_DIMS_BWD}, got {head_dim}")
        if self.kv_split == "rows" and head_dim > 128:
            raise ValueError(f"kv_split 'rows' holds a 64 x D dK and dV per warpgroup: D <= 128, got {head_dim} (use "
                             "kv_split 'dim')")
        if self.kv_split == "dim" and head_dim % 64:
            raise ValueError(f"kv_split 'dim' halves the head dim into whole swizzle atoms: D a multiple of 64, got "
                             f"{head_dim}")
        sp = self.split(head_dim)
        if self.p_smem and self.kv_split != "rows":
            raise ValueError("p_smem is for kv_split 'rows' (kv_split 'dim' always takes P from smem)")
        if sp == "k" and (self.tile_m != 64 or self.consumer_wgs != 2 or self.kv_split != "rows" or head_dim > 96):
            raise ValueError("dq_split 'k' needs tile_m 64, two consumer warpgroups (kv_split rows) and D <= 96 (a whole "
                             "tile_m x D partial per warpgroup)")
        if sp == "m" and (self.tile_m != 128 or self.consumer_wgs != 2):
            raise ValueError("dq_split 'm' needs tile_m 128 and two consumer warpgroups (tile_n 128)")
        if sp == "n" and (self.tile_m != 64 or self.consumer_wgs != 2 or head_dim % (128 if self.kv_split == "rows" else 64)):
            raise ValueError("dq_split 'n' needs tile_m 64, two consumer warpgroups and a head dim that is a multiple "
                             "of 128")
        regs = self.producer_regs + self.consumer_wgs * self.consumer_regs
        if regs > 512:
            raise ValueError(f"register budgets {self.producer_regs} + {self.consumer_wgs} x {self.consumer_regs} "
                             "exceed 512 per thread slot")
        if self.smem_bytes(head_dim, elem) > SMEM_BYTES:
            raise ValueError(f"{self} needs {self.smem_bytes(head_dim, elem)} B of shared memory at D = {head_dim} "
                             f"(at most {SMEM_BYTES})")

    def fits(self, head_dim: int, elem: int = 2) -> bool:
        try:
            self.check(head_dim, elem)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        return (f"bwd{self.tile_m}x{self.tile_n}s{self.stages}" + (f"-{self.dq_split}" if self.dq_split else "")
                + ("-dim" if self.kv_split == "dim" else "") + ("-dq2" if self.dq_buffers == 2 else "") + ("-early" if self.early_stats else "") + ("-psmem" if self.p_smem else ""))


def default_bwd_schedule(head_dim: int, causal: bool = False, deterministic: bool = False) -> AttentionBwdSchedule:
    """D <= 128: 64 x 128 (two Q / dO stages; FA3 takes 128 x 128 at D = 64, where ptxas serializes our WGMMAs for want
    of registers); D = 192 and 256: 64 x 64 with dK / dV cut along the head dim (one stage at 256: shared memory).
    Measured choices (perf/NOTES.md): the statistics prefetched at D = 128 (1.01-1.02x), not at D = 64 (0.98x) nor in
    deterministic mode (0.88x: read where used); deterministic D = 64 with two dQ buffers (1.09x)."""
    if head_dim > 128:
        return AttentionBwdSchedule(tile_m=64, tile_n=64, kv_split="dim", stages=2 if head_dim <= 192 else 1)
    return AttentionBwdSchedule(tile_m=64, tile_n=128, early_stats=head_dim % 128 == 0 and not deterministic,
                                dq_buffers=2 if deterministic and head_dim <= 64 else 1)


def candidates_bwd(head_dim: int, causal: bool = False) -> list[AttentionBwdSchedule]:
    """The schedules `cute-kernels schedules attention --backward` ranks: the default first."""
    out = [default_bwd_schedule(head_dim, causal)]
    for early in (False, True):
        s = AttentionBwdSchedule(tile_m=64, tile_n=128, early_stats=early)
        if s not in out and s.fits(head_dim):
            out.append(s)
    for tm in (64, 128):
        for st in (2, 1):
            for sp in ("", "one"):
                for ps in (False, True) if tm == 128 else (False,):  # P through smem: for the 128-row tile
                    s = AttentionBwdSchedule(tile_m=tm, tile_n=128, stages=st, dq_split=sp, p_smem=ps)
                    if s not in out and s.fits(head_dim):
                        out.append(s)
    for st in (2, 1):
        for nb in (2, 1):
            s = AttentionBwdSchedule(tile_m=64, tile_n=64, stages=st, kv_split="dim", dq_buffers=nb)
            if s not in out and s.fits(head_dim):
                out.append(s)
    base = out[0]
    one = AttentionBwdSchedule(**{**base.__dict__, "dq_buffers": 3 - base.dq_buffers})
    if one not in out and one.fits(head_dim):
        out.insert(1, one)
    return out


def padded_q_tiles(seqlen_q: int, tile_m: int) -> int:
    return (seqlen_q + tile_m - 1) // tile_m


def varlen_tile_base(cu_q_b, b, tile_m: int):
    """The first padded tile of sequence b in the varlen (H, tiles, ...) workspaces: (cu_q[b] + b tile_m) // tile_m.
    Consecutive sequences' ranges do not overlap (each gets at least ceil(len / tile_m) tiles)."""
    return (cu_q_b + b * tile_m) // tile_m


def varlen_total_tiles(total_q: int, batch: int, tile_m: int) -> int:
    """Tiles the varlen workspaces need for `batch` sequences of `total_q` rows in all."""
    return (total_q + batch * tile_m) // tile_m + 1


def m_block_range(n_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, left, right, kind):
    """[m_min, m_max): the query blocks that see any key of block `n_block` (the transpose of
    `collectives.attention_mask.n_block_range`). Query i sees key j iff j <= i + off + right and
    j >= i + off - left (off = seqlen_k - seqlen_q). Python and DSL ints alike."""
    from schedules.index_math import imax, imin

    m_blocks = (seqlen_q + tile_m - 1) // tile_m
    off = seqlen_k - seqlen_q
    col0 = n_block * tile_n
    col1 = imin(col0 + tile_n, seqlen_k) - 1
    m_min = 0
    m_max = m_blocks
    if kind.right:
        lo = col0 - off - right  # the first query that may see col0
        m_min = imin(imax(lo, 0) // tile_m, m_blocks)
    if kind.left:
        hi = col1 - off + left + 1  # one past the last query that may see col1
        m_max = imin(m_blocks, (imax(hi, 0) + tile_m - 1) // tile_m)
    return m_min, m_max
