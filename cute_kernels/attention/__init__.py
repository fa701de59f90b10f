"""Catalogue entry of FlashAttention forward on Hopper: its schedule (config) and what the
data is (signature: dtype, head dim, mask kind, softcap)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream
from cute_kernels.lazy import cute, cutlass
from schedules.attention import HEAD_DIMS, KINDS, AttentionSchedule, default_schedule, fp8_quant_cta
from schedules.attention_bwd import DQ_SPLITS, HEAD_DIMS_BWD, AttentionBwdSchedule
from schedules.decode import DECODE_HEAD_DIMS, PAGE_SIZES, DecodeSchedule, MergeSchedule

DTYPES = ("bf16", "fp16")
MASKS = ("none", "causal", "window", "band")  # band: a window bounded on both sides (or causal + left)


def mask_kind(mask: str):
    from collectives.attention_mask import MaskKind

    return {"none": MaskKind(), "causal": MaskKind(right=True), "window": MaskKind(left=True),
            "band": MaskKind(left=True, right=True)}[mask]


def mask_name(left: int, right: int) -> str:
    """The catalogue mask for window bounds (-1: unbounded); causal is right = 0."""
    return {(False, False): "none", (False, True): "causal", (True, False): "window", (True, True): "band"}[
        (left >= 0, right >= 0)]


def schedule_of(p) -> AttentionSchedule:
    """The AttentionSchedule of resolved catalogue parameters (tile_n 0: the head dim's default)."""
    return FLASH_ATTN.schedule_of(p)


def params_for(schedule: AttentionSchedule, **signature) -> dict:
    return {**FLASH_ATTN.config_of(schedule), **signature}


@dataclass(frozen=True, eq=False)
class FlashAttnSpec(KernelSpec):
    def schedule_of(self, p):
        fields = {f: p[k] for k, f in self.schedule_params().items()}
        fields["tile_n"] = fields["tile_n"] or default_schedule(p["head_dim"]).tile_n
        return AttentionSchedule(**fields)

    def defaults(self, given):
        """The options a schedule builds follow the ones given: ping-pong where two or three fa3 consumers take
        turns, the overlap on fa3 without lazy_rescale, split_mask on the one-buffer overlap where it fits the head
        dim (three loop bodies at D = 256 serialize the WGMMAs)."""
        p = super().defaults(given)
        kind = given.get("schedule", p["schedule"])
        p["pingpong"] = kind == "fa3" and given.get("tile_m", p["tile_m"]) != 64
        p["overlap"] = kind == "fa3" and not given.get("lazy_rescale", p["lazy_rescale"])
        overlap = given.get("overlap", p["overlap"])
        p["split_mask"] = False
        if overlap and not given.get("double_p", p["double_p"]):
            trial = {**p, **given, "split_mask": True}
            try:
                p["split_mask"] = self.schedule_of(trial).fits(trial["head_dim"])
            except ValueError:  # the given combination is refused by `check`, with or without the split
                pass
        return p

    def check(self, p):
        if p["l2_groups"] and (p["heads_first"] or p["varlen"]):
            raise ValueError(f"{self.name}: l2_groups is a tile order of its own (not with heads_first), built for "
                             "batched (not varlen) attention")
        if p["persistent"] and (p["schedule"] != "fa3" or p["varlen"]):
            raise ValueError(f"{self.name}: persistent is built for schedule fa3 on batched (not varlen) attention")
        if p["dynamic"] and not p["persistent"]:
            raise ValueError(f"{self.name}: dynamic hands out the tiles of a persistent walk: it needs persistent")
        s = self.schedule_of(p)  # the schedule's own rules (ping-pong, overlap and its variants)
        if not s.fits(p["head_dim"]):
            raise ValueError(f"{self.name}: {s} does not fit head_dim {p['head_dim']} "
                             f"({s.smem_bytes(p['head_dim'])} B smem, {s.accumulators(p['head_dim'])} acc regs)")

    def build(self, p):
        from cute_kernels.attention.forward import FlashAttnFwd

        dt = dtypes.cutlass_of(p["dtype"])
        d = p["head_dim"]

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        sq, sk, hq, hk = sym(), sym(), sym(), sym()
        b = 1 if p["varlen"] else sym()  # varlen: one packed batch, sequences delimited by cu_seqlens

        def seq_major(rows, heads):  # (S, D, H, B), unit stride along D
            return cute.runtime.make_fake_tensor(dt, (rows, d, heads, b), stride=(sym(8), 1, sym(8), sym(8)),
                                                 assumed_align=16)

        q, k, o = seq_major(sq, hq), seq_major(sk, hk), seq_major(sq, hq)
        v = cute.runtime.make_fake_tensor(dt, (d, sk, hk, b), stride=(1, sym(8), sym(8), sym(8)), assumed_align=16)
        lse = cute.runtime.make_fake_tensor(cutlass.Float32, (sq, hq, b), stride=(1, sym(), sym()), assumed_align=4)
        counter = cute.runtime.make_fake_tensor(cutlass.Int32, (sym(),), stride=(1,), assumed_align=4)  # (1,)
        kernel = FlashAttnFwd(dt, d, self.schedule_of(p), mask_kind(p["mask"]), p["softcap"], p["varlen"])
        scalars = (cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Int32(-1), cutlass.Int32(-1), fake_stream())
        if p["varlen"]:
            batch1 = sym()
            cu_q = cute.runtime.make_fake_tensor(cutlass.Int32, (batch1,), stride=(1,), assumed_align=4)
            cu_k = cute.runtime.make_fake_tensor(cutlass.Int32, (batch1,), stride=(1,), assumed_align=4)
            return kernel.call_varlen, (q, k, v, o, lse, cu_q, cu_k, cutlass.Int32(1), *scalars)
        return kernel, (q, k, v, o, lse, counter, *scalars)

    def representative(self):
        return [self.resolve(), self.resolve({"head_dim": 64, "mask": "causal"})]

    def sweep(self):
        out = []
        for d in HEAD_DIMS:
            for mask in MASKS:
                out.append(self.resolve({"head_dim": d, "mask": mask}))
        out.append(self.resolve({"dtype": "fp16", "softcap": True}))
        out.append(self.resolve({"pingpong": False}))
        out.append(self.resolve({"overlap": True}))
        out.append(self.resolve({"overlap": True, "head_dim": 64, "mask": "causal"}))
        out.append(self.resolve({"double_p": True}))
        out.append(self.resolve({"double_p": True, "head_dim": 256, "mask": "causal"}))
        out.append(self.resolve({"split_mask": True, "mask": "band"}))
        out.append(self.resolve({"split_mask": True, "sum_from_corr": True, "head_dim": 64, "mask": "causal"}))
        out.append(self.resolve({"lazy_rescale": True}))
        out.append(self.resolve({"lazy_rescale": True, "head_dim": 64, "mask": "causal"}))
        out.append(self.resolve({"schedule": "fa2"}))
        out.append(self.resolve({"schedule": "fa2", "tile_m": 64, "head_dim": 64, "mask": "causal"}))
        out.append(self.resolve({"varlen": True}))
        out.append(self.resolve({"varlen": True, "head_dim": 64, "mask": "causal", "overlap": True}))
        out.append(self.resolve({"varlen": True, "schedule": "fa2", "mask": "band"}))
        out.append(self.resolve({"heads_first": True, "mask": "causal"}))
        out.append(self.resolve({"heads_first": True, "varlen": True, "head_dim": 64, "mask": "causal"}))
        out.append(self.resolve({"persistent": True}))
        out.append(self.resolve({"persistent": True, "mask": "causal", "head_dim": 64, "tile_m": 192}))
        out.append(self.resolve({"persistent": True, "head_dim": 256, "double_p": True, "mask": "causal"}))
        out.append(self.resolve({"persistent": True, "overlap": False}))
        out.append(self.resolve({"l2_groups": True, "mask": "causal"}))
        out.append(self.resolve({"l2_groups": True, "persistent": True, "mask": "causal", "head_dim": 64,
                                 "tile_m": 192}))
        out.append(self.resolve({"l2_groups": True, "schedule": "fa2", "mask": "causal"}))
        out.append(self.resolve({"skip_rescale": True, "mask": "causal"}))
        out.append(self.resolve({"skip_rescale": True, "head_dim": 256, "double_p": True}))
        out.append(self.resolve({"persistent": True, "dynamic": True}))
        out.append(self.resolve({"late_v_release": True, "mask": "causal"}))
        out.append(self.resolve({"late_v_release": True, "persistent": True, "dynamic": True, "head_dim": 64,
                                 "tile_m": 192}))
        out.append(self.resolve({"persistent": True, "dynamic": True, "l2_groups": True, "mask": "causal",
                                 "head_dim": 256, "double_p": True}))
        out.append(self.resolve({"persistent": True, "dynamic": True, "l2_groups": True, "mask": "causal",
                                 "head_dim": 64, "tile_m": 192}))
        return out


FLASH_ATTN = FlashAttnSpec(
    name="flash_attn",
    family="attention",
    lesson=0,
    summary="FlashAttention forward, FA3 warp-specialized (or the FA2 arrangement): TMA Q/K/V rings, WGMMA QK^T "
            "and PV (P in registers), ping-pong consumers, intra-warpgroup overlap; causal/window/softcap, GQA, LSE",
    ops=("flash_attn", "flash_attn_varlen"),
    status="ready",
    schedule=AttentionSchedule,
    params={
        "dtype": Param("bf16", DTYPES, "signature", "Q/K/V/O element type"),
        "head_dim": Param(128, HEAD_DIMS, "signature", "head dimension D"),
        "mask": Param("none", MASKS, "signature", "bounded sides of the key window: none, causal (right), "
                      "window (left), band (both)"),
        "softcap": Param(False, (True, False), "signature", "logit softcap: cap * tanh(scale * s / cap)"),
        "varlen": Param(False, (True, False), "signature", "packed sequences delimited by cu_seqlens (int32, B + 1): "
                        "O stored from registers, predicated on each sequence's end"),
        "schedule": Param("fa3", KINDS, help="fa3: warp-specialized producer + consumer warpgroups; fa2: every "
                          "warpgroup computes, warp 0 loads in line (no producer, no setmaxnreg)"),
        "tile_m": Param(128, (64, 128, 192), help="Q rows per CTA (64 per computing warpgroup; 192: fa3 with three "
                        "consumers at 160 registers, taking turns round robin)"),
        "tile_n": Param(0, (0, 64, 80, 96, 112, 128, 160, 176, 192), help="K/V rows per stage (0: per head dim)"),
        "stages": Param(0, (0, 1, 2, 3, 4), help="K/V smem stages (0: fa3 as many as fit, fa2 2)"),
        "pingpong": Param(True, (True, False), help="named barriers alternate the consumers' GEMMs (default: on "
                          "for fa3 with two or three consumers, tile_m 128 or 192; off for fa2 and tile_m 64)"),
        "overlap": Param(True, (True, False), help="fa3: issue the next S = Q K^T before this block's softmax "
                           "(default: on for fa3 without lazy_rescale)"),
        "lazy_rescale": Param(False, (True, False), help="keep a row's exponent reference while its max grows by "
                              "<= 2^8 after the scale: the warp skips the O rescale (vote.all per block)"),
        "double_p": Param(False, (True, False), help="overlap with P in two register buffers: the wait for P_j V_j "
                          "moves from inside the next softmax to after the next S issue (needs overlap)"),
        "split_mask": Param(True, (True, False), help="one-buffer overlap: the K/V walk as three loops (key end / "
                            "right edge, interior, left edge), the interior one without mask code (bitwise the same; "
                            "the default where it fits; off without overlap, with double_p, or at D = 256)"),
        "sum_from_corr": Param(False, (True, False), help="the row sum starts from l * corr and adds the block's "
                               "probabilities (FA4's order) instead of l * corr + sum at the end (l rounds differently)"),
        "heads_first": Param(False, (True, False), help="the grid (H_q, B, q_tiles): each q index over every head and "
                             "batch before the next (causal: longest first over the whole grid); the same bits"),
        "l2_groups": Param(False, (True, False), help="a 1-D grid in FA3's order: heads in groups whose K/V fit L2, a "
                           "group's tiles q index slowest (causal: longest first); the same bits"),
        "persistent": Param(False, (True, False), help="fa3, batched: one CTA per SM walks the tiles in launch order, "
                            "carrying the K/V ring (the next tile's first blocks load under this tile's end); the "
                            "same bits"),
        "dynamic": Param(False, (True, False), help="with persistent: the tiles handed out at run time by an atomic "
                         "counter, in the walk's order (FA3's dynamic scheduler); the same bits"),
        "skip_rescale": Param(False, (True, False), help="overlap: O's rescale skipped on warps where no row's max "
                              "moved (corr exactly 1 there); equal to the default up to a few ulps of corr"),
        "late_v_release": Param(False, (True, False), help="one-buffer overlap: V_j's stage released a step later "
                                "(after S_{j+2}'s wait), so that no arrive holds the P V wait at the softmax's top; "
                                "the same bits"),
    },
)



# --- the backward: preprocess, main, postprocess ----------------------------------------------------
def _bwd_fakes(p):
    """The backward kernels' fake tensors: (S, D, H, B) sequences, (S, H, B) fp32 rows, the dQ accumulator."""
    dt = dtypes.cutlass_of(p["dtype"])
    d = p["head_dim"]

    def sym(div=1):
        return cute.sym_int32(divisibility=div)

    b = 1 if p["varlen"] else sym()

    def seq_major(rows, heads):  # (S, D, H, B), unit stride along D
        return cute.runtime.make_fake_tensor(dt, (rows, d, heads, b), stride=(sym(8), 1, sym(8), sym(8)),
                                             assumed_align=16)

    def f32_rows(rows, heads, align=4):  # (S, H, B) fp32, unit stride along S
        return cute.runtime.make_fake_tensor(cutlass.Float32, (rows, heads, b), stride=(1, sym(), sym()),
                                             assumed_align=align)

    def dq_accumulator(tiles, heads):  # (tile_m D, tiles, H, B) fp32, a tile in MMA order
        return cute.runtime.make_fake_tensor(cutlass.Float32, (p["tile_m"] * d, tiles, heads, b),
                                             stride=(1, p["tile_m"] * d, sym(4), sym(4)), assumed_align=16)

    return SimpleNamespace(dt=dt, d=d, b=b, sym=sym, seq_major=seq_major, f32_rows=f32_rows,
                           dq_accumulator=dq_accumulator)


def _bwd_defaults(spec, given):
    """The schedule parameters not given follow the head dim (`default_bwd_schedule`: FA3's tiles per D)."""
    from schedules.attention_bwd import default_bwd_schedule

    p = KernelSpec.defaults(spec, given)
    base = default_bwd_schedule(given.get("head_dim", p["head_dim"]), deterministic=bool(p.get("deterministic")))
    for k in ("tile_m", "tile_n", "stages", "kv_split", "dq_buffers", "early_stats"):
        if k in p and k not in given:
            p[k] = getattr(base, k)
    return p


@dataclass(frozen=True, eq=False)
class _BwdSpec(KernelSpec):
    """The backward's three kernels: schedule parameters that follow the head dim, the dQ accumulator's fixed tile."""

    def defaults(self, given):
        return _bwd_defaults(self, given)

    def static_extents(self, p):
        return {p["tile_m"] * p["head_dim"]}  # the dQ accumulator's tile, in MMA order


@dataclass(frozen=True, eq=False)
class FlashAttnBwdSpec(_BwdSpec):
    def check(self, p):
        self.schedule_of(p).check(p["head_dim"])

    def build(self, p):
        from cute_kernels.attention.backward import FlashAttnBwd

        f = _bwd_fakes(p)
        s = self.schedule_of(p)
        sq, sk, hq, hk, spad, tiles = f.sym(), f.sym(), f.sym(), f.sym(), f.sym(), f.sym()
        q, do = f.seq_major(sq, hq), f.seq_major(sq, hq)
        k, v, dk, dv = (f.seq_major(sk, hk) for _ in range(4))
        lse2, dpsum = f.f32_rows(spad, hq, 16), f.f32_rows(spad, hq, 16)
        dq_acc = f.dq_accumulator(tiles, hq)
        sem = cute.runtime.make_fake_tensor(cutlass.Int32, (tiles, hq, f.b), stride=(1, f.sym(), f.sym()),
                                            assumed_align=4)
        kernel = FlashAttnBwd(f.dt, f.d, s, mask_kind(p["mask"]), p["softcap"], p["varlen"], p["deterministic"])
        scalars = (cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Float32(1.0),
                   cutlass.Int32(-1), cutlass.Int32(-1), fake_stream())
        if p["varlen"]:
            batch1 = f.sym()
            cu_q = cute.runtime.make_fake_tensor(cutlass.Int32, (batch1,), stride=(1,), assumed_align=4)
            cu_k = cute.runtime.make_fake_tensor(cutlass.Int32, (batch1,), stride=(1,), assumed_align=4)
            return kernel.call_varlen, (q, k, v, do, lse2, dpsum, dq_acc, dk, dv, sem, cu_q, cu_k, cutlass.Int32(1),
                                        *scalars)
        return kernel, (q, k, v, do, lse2, dpsum, dq_acc, dk, dv, sem, *scalars)

    def representative(self):
        return [self.resolve(), self.resolve({"head_dim": 64, "mask": "causal"})]

    def sweep(self):
        out = []
        for d in HEAD_DIMS_BWD:
            for mask in MASKS:
                out.append(self.resolve({"head_dim": d, "mask": mask}))
        out.append(self.resolve({"dtype": "fp16", "softcap": True}))
        out.append(self.resolve({"varlen": True, "mask": "causal"}))
        out.append(self.resolve({"deterministic": True, "mask": "causal"}))
        out.append(self.resolve({"deterministic": True, "varlen": True, "head_dim": 64, "mask": "band"}))
        out.append(self.resolve({"stages": 1}))
        out.append(self.resolve({"dq_split": "one"}))
        return out


@dataclass(frozen=True, eq=False)
class FlashAttnBwdSideSpec(_BwdSpec):
    """The preprocess (D, LSE2, the dQ accumulator zeroed) or the postprocess (dQ from its accumulator)."""

    def check(self, p):
        if "dq_split" in p:
            self.schedule_of(p).check(p["head_dim"])

    def build(self, p):
        from cute_kernels.attention.backward import FlashAttnBwdPost, FlashAttnBwdPre

        f = _bwd_fakes(p)
        sq, hq, spad, tiles = f.sym(), f.sym(), f.sym(), f.sym()
        dq_acc = f.dq_accumulator(tiles, hq)
        cu_q = cute.runtime.make_fake_tensor(cutlass.Int32, (f.sym(),), stride=(1,), assumed_align=4)
        if self.name.endswith("pre"):
            o, do = f.seq_major(sq, hq), f.seq_major(sq, hq)
            lse, dlse = (cute.runtime.make_fake_tensor(cutlass.Float32, (sq, hq, f.b), assumed_align=4,
                                                       stride=(f.sym(), f.sym(), f.sym())) for _ in range(2))
            lse2, dpsum = f.f32_rows(spad, hq, 16), f.f32_rows(spad, hq, 16)
            sem = cute.runtime.make_fake_tensor(cutlass.Int32, (tiles, hq, f.b), stride=(1, f.sym(), f.sym()),
                                                assumed_align=4)
            kernel = FlashAttnBwdPre(f.dt, f.d, p["tile_m"], p["varlen"], p["dlse"], p["deterministic"])
            return kernel, (o, do, lse, dlse, lse2, dpsum, dq_acc, sem, cu_q, cutlass.Int32(1), fake_stream())
        dq = f.seq_major(sq, hq)
        kernel = FlashAttnBwdPost(f.dt, f.d, self.schedule_of(p), p["varlen"])
        return kernel, (dq_acc, dq, cu_q, cutlass.Int32(1), cutlass.Float32(1.0), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"head_dim": 64, "tile_m": 128})]

    def sweep(self):
        return [self.resolve({"head_dim": d, "varlen": vl}) for d in HEAD_DIMS_BWD for vl in (False, True)]


_BWD_SIG = {
    "dtype": Param("bf16", DTYPES, "signature", "Q/K/V/dO element type"),
    "head_dim": Param(128, HEAD_DIMS_BWD, "signature", "head dimension D"),
    "varlen": Param(False, (True, False), "signature", "packed sequences delimited by cu_seqlens"),
}
_BWD_TILES = {
    "tile_m": Param(64, (64, 128), help="query rows per block of the walk (D = 64: 128)"),
    "tile_n": Param(128, (64, 128), help="keys per CTA (kv_split rows: 64 per consumer warpgroup)"),
    "dq_buffers": Param(1, (1, 2), help="smem buffers of the dQ parts (2: the next block's store does not wait for "
                        "this block's reduce-add)"),
    "kv_split": Param("rows", ("rows", "dim"), help="dK / dV cut among the consumers by key rows (D <= 128, S^T in "
                      "registers) or by head dim (D > 128, P and dS through smem)"),
    "stages": Param(2, (1, 2), help="Q / dO ring stages (and dS buffers)"),
    "early_stats": Param(False, (False, True), help="kv_split rows: LSE and D loaded into registers while the GEMMs "
                         "run (False: read where used)"),
    "p_smem": Param(False, (False, True), help="kv_split rows: dV's A operand P^T from smem (stmatrix) instead of "
                    "registers"),
    "dq_split": Param("", DQ_SPLITS, help="dQ = dS K cut among the consumers: m (rows), n (columns), one "
                      "(warpgroup 0); '': the head dim's"),
}

FLASH_ATTN_BWD = FlashAttnBwdSpec(
    name="flash_attn_bwd",
    family="attention",
    lesson=0,
    summary="FlashAttention backward, FA3's arrangement: a CTA per K/V block (K, V in smem), Q / dO / LSE / D "
            "streamed by TMA; S^T, dP^T by WGMMA, dV += P^T dO and dK += dS^T Q from registers, dQ = dS K "
            "bulk-reduce-added into fp32; GQA summed in registers; deterministic dQ order",
    ops=("flash_attn", "flash_attn_varlen"),
    status="ready",
    schedule=AttentionBwdSchedule,
    params={
        **_BWD_SIG,
        "mask": Param("none", MASKS, "signature", "bounded sides of the key window, as the forward"),
        "softcap": Param(False, (True, False), "signature", "logit softcap (its tanh's derivative in dS)"),
        "deterministic": Param(False, (True, False), "signature", "dQ contributions added in K/V-block order "
                               "(a semaphore per dQ tile)"),
        **_BWD_TILES,
    },
)

FLASH_ATTN_BWD_PRE = FlashAttnBwdSideSpec(
    name="flash_attn_bwd_pre",
    family="attention",
    lesson=0,
    summary="FlashAttention backward preprocess: D = rowsum(dO * O) - dLSE, LSE in base 2 (padded rows: +inf, 0), "
            "the dQ accumulator zeroed",
    ops=("flash_attn", "flash_attn_varlen"),
    status="ready",
    params={**_BWD_SIG, "tile_m": _BWD_TILES["tile_m"],
            "dlse": Param(False, (True, False), "signature", "a gradient into the LSE is read (D -= dLSE)"),
            "deterministic": Param(False, (True, False), "signature", "deterministic mode's dQ semaphores zeroed "
                                   "here")},
)

FLASH_ATTN_BWD_POST = FlashAttnBwdSideSpec(
    name="flash_attn_bwd_post",
    family="attention",
    lesson=0,
    summary="FlashAttention backward postprocess: dQ = scale * its fp32 accumulator (MMA order), in the input dtype",
    ops=("flash_attn", "flash_attn_varlen"),
    status="ready",
    schedule=AttentionBwdSchedule,
    params={**_BWD_SIG, **_BWD_TILES},
)

SPECS = (FLASH_ATTN, FLASH_ATTN_BWD, FLASH_ATTN_BWD_PRE, FLASH_ATTN_BWD_POST)


# --- decode: split-KV flash decoding over a contiguous or paged KV cache, and the attention-state merge ------------
@dataclass(frozen=True, eq=False)
class FlashDecodeSpec(KernelSpec):
    def defaults(self, given):
        from schedules.decode import default_decode_schedule

        p = super().defaults(given)
        if "tile_n" not in given:
            p["tile_n"] = default_decode_schedule(given.get("head_dim", p["head_dim"])).tile_n
        return p

    def check(self, p):
        s = self.schedule_of(p)
        elem = 1 if p["kv_scale"] != "none" else 2
        if not s.fits(p["head_dim"], elem):
            raise ValueError(f"{self.name}: {s} does not fit head_dim {p['head_dim']} ({s.smem_bytes(p['head_dim'], elem)}"
                             " B smem)")

    def build(self, p):
        from cute_kernels.attention.decode import FlashDecode

        dt = dtypes.cutlass_of(p["dtype"])
        d = p["head_dim"]

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        def fake(dtype, shape, stride, align=16):
            return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

        q = fake(dt, (sym(), sym(), sym(), d), (sym(8), sym(8), sym(8), 1))
        if p["kv_scale"] == "none" and not p["swap_rows"]:
            k = fake(dt, (sym(), d, sym(), sym()), (sym(8), 1, sym(8), sym(8)))
            v = fake(dt, (d, sym(), sym(), sym()), (1, sym(8), sym(8), sym(8)))
        else:  # e4m3 K and V (or K and V with swapped operands), both (page rows, D, H_kv, pages)
            kt = dt if p["kv_scale"] == "none" else cutlass.Float8E4M3FN
            k, v = (fake(kt, (sym(), d, sym(), sym()), (sym(16), 1, sym(16), sym(16))) for _ in range(2))
        # per token (pages, page rows, H_kv), or per head (1, 1, H_kv)
        scales = (fake(cutlass.Float32, (sym(), sym(), sym()), (sym(), sym(), sym()), 4) for _ in range(2))
        o = fake(cutlass.Float32 if p["split"] else dt, (sym(), sym(), sym(), sym(), d),
                 (sym(), sym(), sym(), sym(), 1), 4)
        lse = fake(cutlass.Float32, (sym(), sym(), sym(), sym()), (sym(), sym(), sym(), sym()), 4)
        o_final = fake(dt, (sym(), sym(), sym(), d), (sym(), sym(), sym(), 1), 4)
        lse_final = fake(cutlass.Float32, (sym(), sym(), sym()), (sym(), sym(), sym()), 4)
        counter = fake(cutlass.Int32, (sym(), sym(), sym()), (sym(), sym(), 1), 4)
        seqlens = fake(cutlass.Int32, (sym(),), (1,), 4)
        table = fake(cutlass.Int32, (sym(), sym()), (sym(), 1), 4)
        kernel = FlashDecode(dt, d, self.schedule_of(p), p["page_size"], mask_kind(p["mask"]), p["softcap"], p["split"],
                             p["kv_scale"])
        i32, f32 = cutlass.Int32, cutlass.Float32
        return kernel, (q, k, v, o, lse, o_final, lse_final, counter, seqlens, table, *scales, i32(0), i32(1),
                        f32(1.0), f32(1.0), f32(1.0), f32(1.0), i32(-1), i32(-1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"page_size": 16, "split": True, "mask": "causal", "fused_merge": True}),
                self.resolve({"kv_scale": "token", "page_size": 64, "split": True}),
                self.resolve({"kv_scale": "token", "page_size": 64, "split": True, "swap_rows": 8})]

    def sweep(self):
        out = [self.resolve({"head_dim": d, "split": sp}) for d in DECODE_HEAD_DIMS for sp in (False, True)]
        for ps in (16, 32, 48, 64, 256):
            out.append(self.resolve({"page_size": ps, "split": True}))
        for mask in MASKS:
            out.append(self.resolve({"mask": mask, "softcap": mask == "band", "page_size": 64}))
        out.append(self.resolve({"dtype": "fp16", "tile_n": 64}))
        out.append(self.resolve({"split": True, "fused_merge": True}))
        for d in DECODE_HEAD_DIMS:
            out.append(self.resolve({"kv_scale": "head", "head_dim": d, "softcap": d == 256}))
        out.append(self.resolve({"kv_scale": "token", "page_size": 16, "mask": "causal", "split": True}))
        # swapped operands: FP8 per head and per token, 8 and 16 rows, D 128 / 256, masks, softcap; bf16
        out.append(self.resolve({"kv_scale": "head", "swap_rows": 8, "split": True}))
        out.append(self.resolve({"kv_scale": "token", "swap_rows": 8, "page_size": 64, "split": True}))
        out.append(self.resolve({"kv_scale": "token", "swap_rows": 16, "page_size": 16, "mask": "causal"}))
        out.append(self.resolve({"kv_scale": "head", "swap_rows": 16, "head_dim": 256, "mask": "band",
                                 "softcap": True}))
        out.append(self.resolve({"swap_rows": 8, "split": True}))
        out.append(self.resolve({"swap_rows": 16, "head_dim": 64, "page_size": 32}))
        return out


FLASH_DECODE = FlashDecodeSpec(
    name="flash_decode",
    family="attention",
    lesson=0,
    summary="decode attention (flash decoding): a CTA per (KV head, batch, split), GQA rows packed into WGMMA M, K/V "
            "tiles (or pages) by TMA through a stage ring, online softmax, partial (O, LSE) per split",
    ops=("flash_attn_with_kvcache",),
    status="ready",
    schedule=DecodeSchedule,
    params={
        "dtype": Param("bf16", DTYPES, "signature", "Q/K/V/O element type"),
        "head_dim": Param(128, DECODE_HEAD_DIMS, "signature", "head dimension D"),
        "page_size": Param(0, (0, *PAGE_SIZES), "signature", "keys per KV page (0: a contiguous cache)"),
        "mask": Param("none", MASKS, "signature", "bounded sides of each query's key window, bottom-right aligned"),
        "softcap": Param(False, (True, False), "signature", "logit softcap"),
        "split": Param(False, (True, False), "signature", "partial (O, LSE) in fp32 per split (else O, LSE final)"),
        "kv_scale": Param("none", ("none", "head", "token"), "signature", "FP8 (e4m3) KV cache with dequant scales "
                          "per KV head or per token and head (none: K/V in the Q dtype)"),
        "tile_n": Param(128, (64, 128), help="keys per K/V tile (default: 128 up to D = 128, 64 above)"),
        "stages": Param(0, (0, 1, 2, 3, 4, 5, 6, 7, 8), help="K/V smem stages (0: as many as fit)"),
        "fused_merge": Param(False, (True, False), help="split: the last split to finish merges the partials (a "
                             "counter per (batch, KV head, row tile)); False (default): the merge kernel does"),
        "swap_rows": Param(0, (0, 8, 16), help="swapped operands for up to 8 / 16 packed query rows (keys in the "
                           "WGMMA's M, K and V loaded into registers); 0: rows in M, 64 a tile"),
    },
)


@dataclass(frozen=True, eq=False)
class MergeStatesSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.attention.merge import MergeStates

        d = p["head_dim"]

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        src = dtypes.cutlass_of(p["in_dtype"])
        dst = dtypes.cutlass_of(p["out_dtype"])
        o = cute.runtime.make_fake_tensor(src, (sym(), sym(), sym(), sym(), d), stride=(sym(4), sym(4), sym(4), sym(4), 1),
                                          assumed_align=4 * src.width // 8)
        lse = cute.runtime.make_fake_tensor(cutlass.Float32, (sym(), sym(), sym(), sym()),
                                            stride=(sym(), sym(), sym(), sym()), assumed_align=4)
        out = cute.runtime.make_fake_tensor(dst, (sym(), sym(), sym(), d), stride=(sym(4), sym(4), sym(4), 1),
                                            assumed_align=4 * dst.width // 8)
        lse_out = cute.runtime.make_fake_tensor(cutlass.Float32, (sym(), sym(), sym()), stride=(sym(), sym(), sym()),
                                                assumed_align=4)
        return MergeStates(dst, d, self.schedule_of(p)), (o, lse, out, lse_out, fake_stream())

    def check(self, p):
        if not self.schedule_of(p).fits(p["head_dim"]):
            raise ValueError(f"{self.name}: {p['lanes']} lanes x head_dim {p['head_dim']} / 4 is more than 1024 threads")

    def representative(self):
        return [self.resolve(), self.resolve({"in_dtype": "bf16", "out_dtype": "bf16", "head_dim": 64}),
                self.resolve({"lanes": 4, "chunk": 8})]

    def sweep(self):
        return [self.resolve({"in_dtype": a, "out_dtype": b, "head_dim": d}) for a in ("fp32", "bf16", "fp16")
                for b in ("fp32", "bf16", "fp16") for d in (64, 128, 256)]


MERGE_STATES = MergeStatesSpec(
    name="merge_attention_states",
    family="attention",
    lesson=0,
    summary="attention-state merge: N (O, LSE) partials of one row over disjoint keys into the row's (O, LSE); "
            "empty states (LSE +-inf) skipped",
    ops=("merge_attention_states", "merge_attention_states_many", "flash_attn_with_kvcache"),
    status="ready",
    schedule=MergeSchedule,
    params={
        "lanes": Param(1, (1, 2, 4, 8, 16, 32), help="threads (of one warp) sharing each vector column of a row, "
                       "each over every lanes-th state"),
        "chunk": Param(4, (1, 2, 4, 8), help="states whose loads a thread issues together"),
        "in_dtype": Param("fp32", ("fp32", "bf16", "fp16"), "signature", "the states' O element type"),
        "out_dtype": Param("bf16", ("fp32", "bf16", "fp16"), "signature", "the merged O's element type"),
        "head_dim": Param(128, tuple(range(4, 513, 4)), "signature", "head dimension D (a multiple of 4)"),
    },
)

SPECS = SPECS + (FLASH_DECODE, MERGE_STATES)


# --- the KV-cache append (and the fused decode RoPE + append) -------------------------------------------------------
def append_vec_error(vec: int, head_dim: int, rope: str, rotary_dim: int):
    """Why the append kernel cannot take rows in `vec`-element vectors (None: it can): D / vec threads a row, a power
    of two <= 32 (lanes of one warp); with RoPE, `rope.rotary_vec_error` (no pass-through copy: a thread owns each
    column)."""
    tpr = head_dim // vec
    if head_dim % vec or tpr > 32 or tpr & (tpr - 1):
        return f"head_dim / vec must be a power of two <= 32, got {head_dim} / {vec}"
    if rope != "none":
        from cute_kernels.rope import rotary_vec_error

        return rotary_vec_error(vec, head_dim, rotary_dim, rope == "gptj", pass_through=False)
    return None


@dataclass(frozen=True, eq=False)
class KVAppendSpec(KernelSpec):
    def check(self, p):
        err = append_vec_error(p["vec"], p["head_dim"], p["rope"], p["rotary_dim"])
        if err:
            raise ValueError(f"{self.name}: {err}")
        if p["vec"] * dtypes.elem_bytes(p["dtype"]) > 16:
            raise ValueError(f"{self.name}: vec {p['vec']} of {p['dtype']} is more than 16 bytes")

    def build(self, p):
        from cute_kernels.attention.append import KVAppend

        dt = dtypes.cutlass_of(p["dtype"])
        d, v, r = p["head_dim"], p["vec"], p["rotary_dim"]

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        def fake(dtype, shape, stride, align):
            return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

        es = dt.width // 8
        rows = [fake(dt, (sym(), sym(), sym(), d), (sym(v), sym(v), sym(v), 1), v * es) for _ in range(4)]  # q k v q_out
        ct = dt if p["kv_scale"] == "none" else cutlass.Float8E4M3FN
        cache = [fake(ct, (sym(), sym(), sym(), d), (sym(v), sym(v), sym(v), 1), v * ct.width // 8) for _ in range(2)]
        scales = [fake(cutlass.Float32, (sym(), sym(), sym()), (sym(), sym(), sym()), 4) for _ in range(2)]
        lens = fake(cutlass.Int32, (sym(),), (1,), 4)
        table = fake(cutlass.Int32, (sym(), sym()), (sym(), 1), 4)
        angles = v // 2 if p["rope"] == "gptj" else v
        tabs = [fake(cutlass.Float32, (sym(), r // 2), (sym(angles), 1), min(16, 4 * angles)) for _ in range(2)]
        pos_t = cutlass.Int64 if p["positions"] == "int64" else cutlass.Int32
        pos = fake(pos_t, (sym(), sym()), (sym(), sym()), pos_t.width // 8)
        kernel = KVAppend(dt, d, v, p["paged"], p["kv_scale"], p["rope"], r,
                          p["positions"], p["threads"])
        return kernel, (*rows, *cache, *scales, lens, table, *tabs, pos, fake_stream())

    def static_extents(self, p):
        return {p["rotary_dim"] // 2}  # the angle tables' width: r / 2 angles a row, fixed by rotary_dim

    def representative(self):
        return [self.resolve(), self.resolve({"rope": "neox", "paged": True}),
                self.resolve({"rope": "gptj", "kv_scale": "token", "positions": "int64"}),
                self.resolve({"kv_scale": "head", "paged": True})]

    def sweep(self):
        out = [self.resolve({"head_dim": d, "rotary_dim": d, "rope": rp}) for d in (64, 128, 256)
               for rp in ("none", "neox", "gptj")]
        out += [self.resolve({"kv_scale": ks, "paged": pg, "rope": "neox"}) for ks in ("head", "token")
                for pg in (False, True)]
        out += [self.resolve({"dtype": "fp16", "rope": "neox", "rotary_dim": 64}),
                self.resolve({"vec": 4, "rope": "neox", "rotary_dim": 72})]
        return out


KV_APPEND = KVAppendSpec(
    name="kv_append",
    family="attention",
    lesson=0,
    summary="append new tokens' K / V rows to a contiguous or paged KV cache (FP8 quantized, per-token scales "
            "written beside), optionally rotating q and k by RoPE on the way: a CTA per token",
    ops=("flash_attn_with_kvcache", "rope_kv_append"),
    status="ready",
    params={
        "dtype": Param("bf16", DTYPES, "signature", "q / k / v element type"),
        "head_dim": Param(128, (16, 32, 64, 128, 256), "signature", "head dimension D"),
        "vec": Param(8, (1, 2, 4, 8), "signature", "elements a thread moves (D / vec threads a row)"),
        "paged": Param(False, (True, False), "signature", "a paged cache with a block table"),
        "kv_scale": Param("none", ("none", "head", "token"), "signature", "FP8 (e4m3) cache with per-head or "
                          "per-token dequant scales (none: the cache in the q dtype)"),
        "rope": Param("none", ("none", "neox", "gptj"), "signature", "rotate q and k first (none: append only)"),
        "rotary_dim": Param(128, tuple(range(2, 257, 2)), "signature", "rotated dims r (with rope)"),
        "positions": Param("none", ("none", "int32", "int64"), "signature", "a positions tensor's dtype (none: "
                           "the cache position)"),
        "threads": Param(256, (128, 256, 512), help="threads per CTA (a token)"),
    },
)

SPECS = SPECS + (KV_APPEND,)


# --- FP8 attention's quantization side: the Hadamard transform and the Q / K / V quantizer (`fp8_quant.py`) -----------
FP8_QUANT_DIMS = (64, 128, 256)  # head dims of the Hadamard transform (powers of two a warp's lanes can split)


@dataclass(frozen=True, eq=False)
class HadamardSpec(KernelSpec):
    def check(self, p):
        from cute_kernels.dtypes import elem_bytes

        tpr = p["head_dim"] // max(16 // elem_bytes(p["dtype"]), p["head_dim"] // 32)
        if p["threads"] % tpr:
            raise ValueError(f"{self.name}: threads must be a multiple of the {tpr} lanes a row takes")

    def build(self, p):
        from cute_kernels.attention.fp8_quant import Hadamard
        from cute_kernels.fake import fake_tensor, index_sym

        dt = dtypes.cutlass_of(p["dtype"])
        d, i64 = p["head_dim"], p["index64"]
        vec = 16 // (dt.width // 8)
        x, y = (fake_tensor(dt, (index_sym(i64), d), (index_sym(i64, vec), 1), 16) for _ in range(2))
        signs = fake_tensor(cutlass.Float32, (d,), (1,), 16)
        return Hadamard(dt, d, p["signed"], p["threads"], p["unroll"]), (x, y, signs, fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"dtype": "fp32", "head_dim": 256, "signed": False}),
                self.resolve({"head_dim": 64, "dtype": "fp16", "index64": True})]

    def sweep(self):
        return [self.resolve({"dtype": t, "head_dim": d, "signed": s}) for t in dtypes.FLOAT_NAMES
                for d in FP8_QUANT_DIMS for s in (True, False)]


HADAMARD = HadamardSpec(
    name="hadamard",
    family="attention",
    lesson=0,
    summary="Walsh-Hadamard transform of head rows (D 64 / 128 / 256), optionally of x * signs, orthogonal (1 / "
            "sqrt(D)): in-register butterflies, then xor shuffles across a row's lanes; 128-bit loads and stores",
    ops=("hadamard", "quantize_attention_fp8"),
    status="ready",
    params={
        "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "x / y element type"),
        "head_dim": Param(128, FP8_QUANT_DIMS, "signature", "transform length D (the last dim)"),
        "signed": Param(True, (True, False), "signature", "multiply by a (D,) +-1 signs vector first"),
        "index64": Param(False, (True, False), "signature", "64-bit indexing (>= 2^31 elements)"),
        "threads": Param(256, (128, 256, 512), help="threads per CTA (D / e lanes a row, e = max(8, D / 32) "
                         "elements a lane in 16 bits)"),
        "unroll": Param(2, (1, 2, 4), help="rows per row group in flight (every load issued before the shuffles)"),
    },
)


@dataclass(frozen=True, eq=False)
class FP8AttnQuantSpec(KernelSpec):
    def check(self, p):
        from cute_kernels.attention.fp8_quant import row_geometry

        _, _, tpr = row_geometry(p["head_dim"], dtypes.cutlass_of(p["dtype"]).width, p["elems"])
        rows = p["threads"] // tpr
        held = 128 // p["cluster"]
        if rows > held or held % rows:
            raise ValueError(f"{self.name}: threads / {tpr} (rows a pass) must divide the {held} rows a CTA holds, got "
                             f"threads={p['threads']}, cluster={p['cluster']}")

    def build(self, p):
        from cute_kernels.attention.fp8_quant import AttnQuantFP8
        from cute_kernels.fake import fake_tensor, index_sym

        dt = dtypes.cutlass_of(p["dtype"])
        d, i64 = p["head_dim"], p["index64"]

        def seq_major(t, div):  # (B, S, H, D), unit stride along D
            return fake_tensor(t, (index_sym(i64), index_sym(i64), index_sym(i64), d),
                               (index_sym(i64, div), index_sym(i64, div), index_sym(i64, div), 1), 16)

        x, q = seq_major(dt, 8), seq_major(cutlass.Float8E4M3FN, 16)
        scales, amax = (fake_tensor(cutlass.Float32, tuple(index_sym(i64) for _ in range(3)),
                                    tuple(index_sym(i64) for _ in range(3)), 4) for _ in range(2))
        signs = fake_tensor(cutlass.Float32, (d,), (1,), 16)
        kernel = AttnQuantFP8(dt, d, p["mode"], p["hadamard"], p["threads"], p["cluster"], p["elems"])
        return kernel, (x, q, scales, amax, signs, fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"mode": "amax", "head_dim": 64}),
                self.resolve({"mode": "head", "hadamard": False, "head_dim": 256, "dtype": "fp16"}),
                self.resolve({"head_dim": 256, **fp8_quant_cta(256)})]

    def sweep(self):
        return [self.resolve({"dtype": t, "head_dim": d, "mode": m, "hadamard": h}) for t in DTYPES
                for d in FP8_QUANT_DIMS for m in ("block", "amax", "head") for h in (True, False)]


FP8_ATTN_QUANT = FP8AttnQuantSpec(
    name="fp8_attn_quant",
    family="attention",
    lesson=0,
    summary="Q / K / V to e4m3 for FP8 attention: a CTA per (128-row block, head, batch), the block held in registers, "
            "optionally rotated by H diag(s) first; per-block scales in one pass, per-head in two (block amaxes, "
            "then each block folds its head's and quantizes)",
    ops=("quantize_attention_fp8",),
    status="ready",
    params={
        "dtype": Param("bf16", DTYPES, "signature", "input element type"),
        "head_dim": Param(128, FP8_QUANT_DIMS, "signature", "head dimension D"),
        "mode": Param("block", ("block", "amax", "head"), "signature", "block: quantize with a scale per 128-row "
                      "block; amax: only the blocks' amaxes (per-head pass 1); head: quantize with the head's scale "
                      "from those amaxes (pass 2)"),
        "hadamard": Param(True, (True, False), "signature", "rotate the rows by H diag(signs) before quantizing"),
        "index64": Param(False, (True, False), "signature", "64-bit indexing of x and q (>= 2^31 elements)"),
        "threads": Param(512, (128, 256, 512), help="threads per CTA (a block's 128 rows in 128 / (threads / "
                         "lanes a row) passes, all held)"),
        "cluster": Param(1, (1, 2, 4), help="CTAs sharing a 128-row block, each holding 128 / cluster rows (fewer "
                         "registers a thread, so more CTAs an SM overlap their load and compute phases); the block's "
                         "amax folded over the cluster in distributed shared memory"),
        "elems": Param(0, (0, 16, 32), help="elements a lane holds of a row (0: max(8, D / 32)); more put more of "
                       "the rotation's butterfly stages in registers and fewer in shuffles"),
    },
)

SPECS = SPECS + (HADAMARD, FP8_ATTN_QUANT)


# --- the FP8 forward (`fp8_forward.py`): e4m3 Q / K / V, descales folded in, V transposed in the kernel ----------------
FP8_FWD_DIMS = (64, 128, 256)


@dataclass(frozen=True, eq=False)
class FlashAttnFP8Spec(KernelSpec):
    def check(self, p):
        from cute_kernels.attention.fp8_forward import default_tile_n, max_stages, smem_bytes

        tile_n = p["tile_n"] or default_tile_n(p["head_dim"])
        stages = p["stages"] or max_stages(p["head_dim"], tile_n)
        if p["scales"] == "block" and 128 % tile_n:
            raise ValueError(f"{self.name}: with block scales tile_n must divide the 128-key scale block, got {tile_n}")
        if smem_bytes(p["head_dim"], tile_n, stages) > 227 * 1024:
            raise ValueError(f"{self.name}: {stages} stages of {tile_n} keys at D {p['head_dim']} need "
                             f"{smem_bytes(p['head_dim'], tile_n, stages)} B of smem")

    def build(self, p):
        from cute_kernels.attention.fp8_forward import FlashAttnFwdFP8

        d = p["head_dim"]
        e4m3, out = cutlass.Float8E4M3FN, dtypes.cutlass_of(p["out_dtype"])

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        sq, sk, hq, hk, b = sym(), sym(), sym(), sym(), sym()

        def seq_major(dt, rows, heads, div):  # (S, D, H, B), unit stride along D, 16-byte strides
            return cute.runtime.make_fake_tensor(dt, (rows, d, heads, b), stride=(sym(div), 1, sym(div), sym(div)),
                                                 assumed_align=16)

        q, k, v = seq_major(e4m3, sq, hq, 16), seq_major(e4m3, sk, hk, 16), seq_major(e4m3, sk, hk, 16)
        o = seq_major(out, sq, hq, 8)
        lse = cute.runtime.make_fake_tensor(cutlass.Float32, (sq, hq, b), stride=(1, sym(), sym()), assumed_align=4)
        scales = [cute.runtime.make_fake_tensor(cutlass.Float32, (sym(), h, b), stride=(sym(), sym(), sym()),
                                                assumed_align=4) for h in (hq, hk, hk)]
        kernel = FlashAttnFwdFP8(d, out, mask_kind(p["mask"]), p["softcap"], p["scales"] == "block", p["tile_n"],
                                 p["stages"], p["exp2_poly"], p["lazy_rescale"], p["vt_ldsm"])
        scalars = (cutlass.Float32(1.0),) * 4 + (cutlass.Int32(-1), cutlass.Int32(-1), fake_stream())
        return kernel, (q, k, v, o, lse, *scales, *scalars)

    def dynamic_smem_bytes(self, p):
        from cute_kernels.attention.fp8_forward import default_tile_n, max_stages, smem_bytes

        tile_n = p["tile_n"] or default_tile_n(p["head_dim"])
        return smem_bytes(p["head_dim"], tile_n, p["stages"] or max_stages(p["head_dim"], tile_n))

    def representative(self):
        return [self.resolve(), self.resolve({"mask": "causal", "scales": "head"})]

    def sweep(self):
        return [self.resolve({"head_dim": d, "mask": m, "scales": s}) for d in FP8_FWD_DIMS for m in MASKS
                for s in ("head", "block")] + [self.resolve({"softcap": True, "out_dtype": "fp16"})]


FLASH_ATTN_FP8 = FlashAttnFP8Spec(
    name="flash_attn_fp8",
    family="attention",
    lesson=0,
    summary="FlashAttention forward with e4m3 Q / K / V (FA3's FP8 path): FP8 WGMMAs, per-head or per-128-block "
            "descales folded into the softmax and O's rescale, V transposed in smem by the producer warpgroup in "
            "P's key order (P from registers without shuffles); causal/window/softcap, GQA, LSE",
    ops=("flash_attn_fp8",),
    status="ready",
    params={
        "head_dim": Param(128, FP8_FWD_DIMS, "signature", "head dimension D"),
        "out_dtype": Param("bf16", DTYPES, "signature", "O element type"),
        "mask": Param("none", MASKS, "signature", "bounded sides of the key window: none, causal (right), "
                      "window (left), band (both)"),
        "softcap": Param(False, (True, False), "signature", "logit softcap: cap * tanh(scale * s / cap)"),
        "scales": Param("block", ("head", "block"), "signature", "q / k / v scales per head (B, H) or per 128-row "
                        "block (B, H, ceil(S / 128))"),
        "tile_n": Param(0, (0, 32, 64, 128, 160, 192, 224), help="keys per K/V block (0: 128, 64 at D = 256); "
                        "divides 128 with block scales (per-head scales: any multiple of 32)"),
        "stages": Param(0, (0, 1, 2, 3, 4), help="K / V / V^T smem stages (0: as many as fit, at most 4)"),
        "exp2_poly": Param(0, (0, 2, 3, 4, 8), help="every k-th column's exponential on the FMA pipe (a degree-3 "
                           "polynomial, FA4's trick) instead of the MUFU; 0: none"),
        "lazy_rescale": Param(-1, (-1, 0, 4, 7), help="(-1: 7 at D = 256, else 0) keep a row's exponent reference "
                              "while its max grows by <= 2^t "
                              "and O's v-scale unit while a block's v scale stays within 2x of it (the block's "
                              "v scale / unit folded into P's exponent): O's rescale skipped on warps where both "
                              "hold; 0: rescale every block"),
        "vt_ldsm": Param(True, (False, True), help="V^T by ldmatrix.trans / prmt / stmatrix (512 bytes a warp "
                         "instruction) instead of 32-bit shared loads and stores (128)"),
    },
)

SPECS = SPECS + (FLASH_ATTN_FP8,)
