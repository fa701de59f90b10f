"""CPU: the FP8 FlashAttention forward (`cute_kernels/attention/fp8_forward.py`, `collectives/fp8_attention.py`).

- P's permutation: every register of the P V WGMMA's 8-bit A operand, built from the S accumulator by
  `acc_a_view_fp8`, holds the (row, key) that operand's slot stands for, key = pi(slot) (layout algebra, all 128
  threads of a warpgroup);
- V^T: the transposing step's closed-form swizzled offsets against the DSL's own smem offsets, and the step replayed
  in Python with a model of `prmt`: slot k of row e = V[pi(k), e], every byte of a stage once;
- compile census of representative variants (FP8 WGMMAs, TMA, setmaxnreg 40 / 232, the transpose's 32-bit shared
  accesses and prmt, P's e4m3x2 conversions, no local memory, registers under the consumers' budget, smem);
- the op's named errors under FakeTensorMode."""

import random
import re

import pytest
import torch

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import highest_register


def _prmt(a, b, sel):
    """PTX prmt.b32 (default mode): byte k of the result is byte (sel >> 4k) & 7 of the 8 bytes b:a."""
    src = (a & 0xFFFFFFFF).to_bytes(4, "little") + (b & 0xFFFFFFFF).to_bytes(4, "little")
    return int.from_bytes(bytes(src[(sel >> (4 * k)) & 7] for k in range(4)), "little")


def test_slot_key_is_a_permutation_of_each_32_key_slice():
    from collectives.fp8_attention import slot_key

    for base in (0, 32, 96):
        keys = [slot_key(base + k) for k in range(32)]
        assert sorted(keys) == list(range(base, base + 32))
    # lane c's A slots 4c..4c+3, 16+4c..16+4c+3 hold its own accumulator columns 2c, 2c+1, 8+2c, ... 25+2c
    for c in range(4):
        slots = [4 * c + i for i in range(4)] + [16 + 4 * c + i for i in range(4)]
        assert [slot_key(s) for s in slots] == [2 * c, 2 * c + 1, 8 + 2 * c, 9 + 2 * c, 16 + 2 * c, 17 + 2 * c,
                                                 24 + 2 * c, 25 + 2 * c]


@pytest.mark.parametrize("tile_n,d", [(128, 128), (64, 256), (128, 64), (32, 128), (160, 128), (192, 128), (224, 128), (224, 64)])
def test_p_permutation(tile_n, d):
    """Element i of `acc_a_view_fp8(acc)` is the accumulator value at (row, key); the P V WGMMA's A operand element i
    is (row, slot): same row, key = pi(slot), for every thread and element; the view has the operand's shape."""
    import cutlass.cute as cute

    from collectives.fp8_attention import slot_key
    from cute_kernels.jit import compile_fn  # noqa: F401  (sets up the DSL target)
    from tests.attention import _fp8_probe as probe

    cute.compile(probe.p_probe, tile_n, d)
    res = probe.OUT[("p", tile_n, d)]
    assert len(res) == 128
    seen = set()
    for t, a, cv, a_shape, v_shape in res:
        assert len(a) == len(cv) == 64 * tile_n // 128
        assert a_shape.replace(" ", "") == "((4,2,2),1,%d)" % (tile_n // 32), a_shape
        for (ra, slot), (rc, key) in zip(a, cv):
            assert ra == rc and key == slot_key(slot), (t, (ra, slot), (rc, key))
            seen.add((rc, key))
    assert len(seen) == 64 * tile_n  # every (row, key) of the tile once


class _VStage:
    """A V stage's smem layouts (the DSL's own, from `_fp8_probe.smem_probe`), random V bytes written at stage 1 of a
    two-stage V buffer, and an empty V^T buffer with a write count a byte: what the transpose replays start from."""

    STAGE = 1

    def __init__(self, tile_n: int, d: int, seed: int):
        import cutlass.cute as cute

        from cute_kernels.jit import compile_fn  # noqa: F401  (sets up the DSL target)
        from tests.attention import _fp8_probe as probe

        cute.compile(probe.smem_probe, tile_n, d)
        self.tile_n, self.d = tile_n, d
        self.lays = probe.OUT[("smem", tile_n, d)]
        (vb, self.vk), (self.tb, self.tk) = self.lays["v"], self.lays["vt"]
        rng = random.Random(seed)
        self.v = [[rng.randrange(256) for _ in range(d)] for _ in range(tile_n)]
        self.src = bytearray(2 * self.vk.stage_bytes)
        for key in range(tile_n):
            for e in range(d):
                self.src[int(vb[key][e])] = self.v[key][e]
        self.dst = bytearray(2 * self.tk.stage_bytes)
        self.writes = [0] * len(self.dst)

    def store(self, o: int, word: int):
        """A 32-bit store into V^T at byte offset o, counted."""
        self.dst[o:o + 4] = word.to_bytes(4, "little")
        for i in range(4):
            self.writes[o + i] += 1

    def assert_transposed(self):
        """Every byte of the V^T stage written once, slot k of row e holding V[pi(k), e]."""
        from collectives.fp8_attention import slot_key

        assert sum(self.writes) == self.d * self.tile_n and max(self.writes) == 1
        for e in range(self.d):
            for k in range(self.tile_n):
                o = int(self.tb[e][k])
                assert self.writes[o] == 1
                assert self.dst[o] == self.v[slot_key(k)][e], (e, k)


@pytest.mark.parametrize("tile_n,d", [(128, 128), (64, 256), (128, 64), (32, 128), (160, 128), (192, 128), (224, 128), (224, 64)])
def test_v_transpose(tile_n, d):
    """`transpose_v_stage`, replayed: its closed-form offsets (`KMajorBytes`) equal the DSL layouts' own swizzled
    byte offsets at every (row, column); the three warps' lanes in its loop order, with `group_addresses` /
    `slice_words`, read four 32-bit words of V, transpose them with the kernel's prmt selectors and write four words
    of V^T, every byte of a V^T stage once, slot k of row e holding V[pi(k), e]."""
    from collectives.fp8_attention import group_addresses, slice_words, transpose_lane_roles, transpose_words
    from cute_kernels.attention.fp8_forward import TRANSPOSE_WARPS

    st = _VStage(tile_n, d, seed=0)
    for name, (byte, kb) in st.lays.items():
        for r in range(len(byte)):
            for c in range(len(byte[r])):
                assert kb.offset(r, c) + kb.stage_bytes == int(byte[r][c]), (name, r, c)
    vk, tk, stage = st.vk, st.tk, st.STAGE

    def load(word):
        o = 4 * (stage * vk.stage_bytes // 4 + word)
        return int.from_bytes(st.src[o:o + 4], "little")

    for warp in range(TRANSPOSE_WARPS):
        for lane in range(32):
            c, dq_lo, j = transpose_lane_roles(lane)
            for g in range(warp, d // 16, TRANSPOSE_WARPS):
                src0, dst0 = group_addresses(vk, tk, g, c, dq_lo, j)
                for q in range(tile_n // 32):
                    sw, dw = slice_words(vk, tk, src0, dst0, q)
                    x = transpose_words(*(load(w) for w in sw), prmt=_prmt)
                    for e in range(4):
                        st.store(4 * (stage * tk.stage_bytes // 4 + dw[e]), x[e])
    st.assert_transposed()


@pytest.mark.parametrize("tile_n,d", [(128, 128), (64, 256), (128, 64), (32, 128), (160, 128), (192, 128), (224, 128), (224, 64)])
def test_v_transpose_ldsm(tile_n, d):
    """`transpose_v_stage_ldsm`, replayed with models of ldmatrix.x4.trans and stmatrix.x4 (each lane's row address
    per matrix, each thread's registers as PTX defines them) and of prmt: every byte of a V^T stage written once,
    slot k of row e holding V[pi(k), e]."""
    from collectives.fp8_attention import ldsm_lane_offsets, ldsm_slice, ldsm_words
    from cute_kernels.attention.fp8_forward import TRANSPOSE_WARPS

    st = _VStage(tile_n, d, seed=1)
    vk, tk, stage = st.vk, st.tk, st.STAGE

    def b16(row_addr, col):  # the b16 element `col` of the 16-byte V row at row_addr
        return int.from_bytes(st.src[row_addr + 2 * col:row_addr + 2 * col + 2], "little")

    for warp in range(TRANSPOSE_WARPS):
        for g in range(warp, d // 16, TRANSPOSE_WARPS):
            for q in range(tile_n // 32):
                # every lane's row address of the load (matrix lane // 8, row lane % 8) and of the store
                addr = [ldsm_slice(vk, tk, *ldsm_lane_offsets(vk, tk, g, lane), q) for lane in range(32)]
                ld = [stage * vk.stage_bytes + a for a, _ in addr]
                sto = [stage * tk.stage_bytes + b for _, b in addr]
                assert all(a % 16 == 0 for a in ld + sto)
                for t in range(32):
                    r, c = t // 4, t % 4
                    regs = [b16(ld[8 * i + 2 * c], r) | b16(ld[8 * i + 2 * c + 1], r) << 16 for i in range(4)]
                    words = ldsm_words(*regs, prmt=_prmt)
                    for j in range(4):  # stmatrix: register j is row r of matrix j, bytes 4c .. 4c + 3
                        st.store(sto[8 * j + r] + 4 * c, words[j])
    st.assert_transposed()


VARIANTS = [
    {},  # D = 128, block scales, no mask
    {"mask": "causal", "scales": "head"},
    {"head_dim": 64, "mask": "window"},
    {"head_dim": 256, "mask": "band", "softcap": True, "out_dtype": "fp16"},
    {"lazy_rescale": 0, "vt_ldsm": False},  # every O rescale done; V^T by 32-bit words
    {"lazy_rescale": 4, "mask": "causal", "scales": "head"},
    {"vt_ldsm": False, "head_dim": 256},
]


def _id(v):
    return ",".join(f"{k}={x}" for k, x in v.items()) or "default"


@pytest.fixture(scope="module", params=VARIANTS, ids=[_id(v) for v in VARIANTS])
def compiled(request, tmp_path_factory):
    spec = catalog.get("flash_attn_fp8")
    p = spec.resolve(request.param)
    report, files = compile_with_artifacts(spec, p, str(tmp_path_factory.mktemp("fa8")))
    sass = files["sass"].read_text() if "sass" in files else None
    return p, report, files["ptx"].read_text(), sass


def test_compile_census(compiled):
    from cute_kernels.attention.fp8_forward import CONSUMER_REGS, PRODUCER_REGS, default_tile_n, max_stages, smem_bytes

    p, report, ptx, sass = compiled
    d = p["head_dim"]
    tile_n = p["tile_n"] or default_tile_n(d)
    census = report.ptx_census
    # S = Q K^T: D / 32 e4m3 WGMMAs (both operands from smem); O += P V: tile_n / 32 (A from registers); each twice
    # (the overlapped loop, and its first S / last P V outside it)
    mmas = re.findall(r"wgmma\.mma_async\S*", ptx)
    assert len(mmas) == 2 * (d // 32 + tile_n // 32), mmas
    assert all(".e4m3.e4m3" in m and ".f32" in m for m in mmas), mmas
    assert census["cp.async.bulk.tensor"] >= 3  # Q, K, V loads (O is stored from registers)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{PRODUCER_REGS}\b", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{CONSUMER_REGS}\b", ptx)
    assert PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 65536
    # the V transpose, a 32-key slice unrolled: four 32-bit shared loads, eight prmt, four 32-bit shared stores each;
    # the async-proxy fence
    slices = tile_n // 32
    if p["vt_ldsm"]:  # a slice: one ldmatrix.x4.trans, four prmt, one stmatrix.x4
        assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", ptx)) == slices
        assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)) == slices
        assert len(re.findall(r"prmt\.b32", ptx)) == 4 * slices
    else:
        assert len(re.findall(r"ld\.shared\.(?:b|u)32", ptx)) == 4 * slices
        assert len(re.findall(r"prmt\.b32", ptx)) == 8 * slices
        assert len(re.findall(r"st\.shared\.(?:b|u)32", ptx)) >= 4 * slices
    assert "fence.proxy.async.shared::cta" in ptx
    # P: one e4m3x2 conversion per column pair (tile_n / 4 a thread), saturating, nearest even; twice (the first block
    # and the loop)
    assert len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)) == 2 * (tile_n // 4)
    # ping-pong turns (named barriers 4, 5 of 256 threads)
    assert len(re.findall(r"bar\.arrive\s+%r\d+, 256;", ptx)) >= 2 and re.search(r"bar\.sync\s+%r\d+, 256;", ptx)
    if p["softcap"]:
        assert "tanh.approx.f32" in ptx
    lazy = p["lazy_rescale"] if p["lazy_rescale"] >= 0 else (7 if d == 256 else 0)
    if lazy:  # the warp's vote on keeping its references (the loop and the first block)
        assert len(re.findall(r"vote\.sync\.all\.pred", ptx)) == 2, re.findall(r"vote\S*", ptx)
    assert census["ld/st.local"] == 0 and not report.spills, report.format()
    if sass is not None:
        assert report.sass_census["LDL/STL (spills)"] == 0
        top = highest_register(sass)
        assert top < CONSUMER_REGS, top
    assert smem_bytes(d, tile_n, p["stages"] or max_stages(d, tile_n)) <= 227 * 1024


def _fake_inputs(b=2, sq=300, sk=500, hq=8, hk=2, d=128, gran="block"):
    e = torch.float8_e4m3fn
    q = torch.empty(b, sq, hq, d, dtype=e, device="cuda")
    k = torch.empty(b, sk, hk, d, dtype=e, device="cuda")
    v = torch.empty(b, sk, hk, d, dtype=e, device="cuda")
    if gran == "block":
        sc = [torch.empty(b, h, (s + 127) // 128, device="cuda") for h, s in ((hq, sq), (hk, sk), (hk, sk))]
    else:
        sc = [torch.empty(b, h, device="cuda") for h in (hq, hk, hk)]
    return q, k, v, *sc


@pytest.mark.parametrize("gran", ["block", "head"])
def test_fake_shapes(gran):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cute_kernels as ck

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = _fake_inputs(gran=gran)
        o, lse = ck.flash_attn_fp8(*args, causal=True, return_lse=True)
        assert o.shape == (2, 300, 8, 128) and o.dtype == torch.bfloat16 and lse.shape == (2, 8, 300)
        o = ck.flash_attn_fp8(*args, window=(64, 0), out_dtype=torch.float16)
        assert o.dtype == torch.float16


def test_named_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cute_kernels as ck

    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, qs, ks, vs = _fake_inputs()
        qh, kh, vh = (torch.empty(2, h, device="cuda") for h in (8, 2, 2))
        e4m3 = torch.float8_e4m3fn
        q_bf16 = torch.empty(2, 300, 8, 128, dtype=torch.bfloat16, device="cuda")
        k3, v3 = (torch.empty(2, 500, 3, 128, dtype=e4m3, device="cuda") for _ in range(2))
        v_short = torch.empty(2, 400, 2, 128, dtype=e4m3, device="cuda")
        ks16 = torch.empty(2, 2, 4, dtype=torch.float16, device="cuda")
        cases = [
            ((q_bf16, k, v, qs, ks, vs), {}, TypeError, "q has dtype bfloat16"),
            ((q, k, v, torch.empty(2, 8, 2, device="cuda"), ks, vs), {}, ValueError, "q_scale must be fp32 of shape"),
            ((q, k, v, qh, ks, vs), {}, ValueError, "same granularity"),
            ((q, k, v, qs, ks16, vs), {}, TypeError, "k_scale has dtype float16"),
            ((q, k, v, qs, ks, vs), {"out_dtype": torch.float32}, TypeError, "out_dtype"),
            ((q, k, v, qs, ks, vs), {"window": (-2, 0)}, ValueError, "window"),
            ((q, k3, v3, qs, torch.empty(2, 3, 4, device="cuda"), torch.empty(2, 3, 4, device="cuda")), {}, ValueError,
             "multiple"),
            ((torch.empty(2, 300, 8, 96, dtype=torch.float8_e4m3fn, device="cuda"), k, v, qs, ks, vs), {}, ValueError,
             "head dim"),
            ((q, k, v_short, qs, ks, vs), {}, ValueError, "same shape"),
        ]
        for args, kw, exc, msg in cases:
            with pytest.raises(exc, match=msg):
                ck.flash_attn_fp8(*args, **kw)
        # per-head scales against block scales of another shape, and with the right ones
        ck.flash_attn_fp8(q, k, v, qh, kh, vh)


def test_catalogue_entry():
    spec = catalog.get("flash_attn_fp8")
    assert "flash_attn_fp8" in catalog.FAMILIES["attention"]
    for d in (64, 128, 256):
        p = spec.resolve({"head_dim": d})
        assert spec.dynamic_smem_bytes(p) <= 227 * 1024
    with pytest.raises(ValueError):
        spec.resolve({"tile_n": 128, "head_dim": 256, "stages": 4})


def test_exp2_fma_model():
    """`collectives.online_softmax.exp2_fma`'s PTX, step for step in numpy float32 (round by 1.5 * 2^23, degree-3
    polynomial, j added to the exponent bits, below -126 -> 0): within 1e-4 relative of 2^x over [-125, 0] (below, where the
    result's exponent field reaches 0, 2e-4), exactly 0 for -inf and below -126, never negative."""
    import numpy as np

    from collectives.online_softmax import EXP2_POLY

    x = np.concatenate([np.linspace(-126, 0, 200001, dtype=np.float32), np.float32([-np.inf, -126.5, -300.0, 0.0])])
    f32 = np.float32
    xc = np.maximum(x, f32(-126.0))
    t = (xc + f32(12582912.0)).astype(np.float32)
    f = (xc - (t - f32(12582912.0))).astype(np.float32)
    c0, c1, c2, c3 = (f32(c) for c in EXP2_POLY)
    p = ((f * c3 + c2) * f + c1) * f + c0
    bits = (p.astype(np.float32).view(np.uint32) + (t.view(np.uint32) << np.uint32(23))).astype(np.uint32)
    y = np.where(x < f32(-126.0), f32(0.0), bits.view(np.float32))
    ref = np.exp2(x.astype(np.float64))
    ok = x >= -125
    rel = np.abs(y[ok] - ref[ok]) / ref[ok]
    assert rel.max() < 1e-4, rel.max()
    low = (x < -125) & (x >= -126)
    assert (np.abs(y[low] - ref[low]) / ref[low]).max() < 2e-4
    assert (y >= 0).all() and (y[x < -126] == 0).all() and (x < -126).sum() == 3


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_candidates_resolve(d):
    """`schedules.attention.fp8_candidates`: the kernel's defaults first, no duplicates, every config accepted by the
    catalogue entry (smem within the limit, tile_n dividing the scale block), exp2_poly among the kernel's choices."""
    from schedules.attention import FP8_EXP2_POLY, fp8_candidates, fp8_default_tile_n, fp8_max_stages

    spec = catalog.get("flash_attn_fp8")
    cands = fp8_candidates(d)
    assert cands[0] == {"tile_n": fp8_default_tile_n(d), "stages": fp8_max_stages(d, fp8_default_tile_n(d)),
                        "exp2_poly": 0}
    assert len({tuple(sorted(c.items())) for c in cands}) == len(cands) <= 24
    for c in cands:
        assert c["exp2_poly"] in FP8_EXP2_POLY
        spec.check(spec.resolve({"head_dim": d, **c}))
