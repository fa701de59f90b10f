"""CPU: decode attention's split model and schedules, the torch op in fake mode (shapes, named errors), the
references' own consistency (the decode reference is the full attention's last rows; paged = contiguous; the
merge is associative with the empty-state rule), and the kernels' compiled PTX (TMA boxes per page, WGMMAs, no
local memory)."""

import math
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.decode import DecodeSchedule, choose_splits, decode_candidates, m_tiles, split_table
from tests.attention._decode_ref import decode_reference, merge_reference

ck = pytest.importorskip("cute_kernels")


# --- the split model ----------------------------------------------------------------------------------------------
def test_splits_fill_the_sms_once():
    assert choose_splits(1, 8, 32768, 1, 4, sms=132) == 16  # 128 CTAs
    assert choose_splits(4, 8, 16384, 1, 4, sms=132) == 4
    assert choose_splits(16, 8, 8192, 1, 4, sms=132) == 1  # 128 CTAs already
    assert choose_splits(128, 8, 2048, 1, 4, sms=132) == 1
    assert choose_splits(1, 8, 4096, 1, 4, sms=132) == 16  # splits of 2 tiles
    assert choose_splits(1, 8, 256, 1, 4, sms=132) == 1  # two tiles: no split shorter than min_tiles
    assert choose_splits(1, 8, 4096, 1, 4, DecodeSchedule(min_tiles=4), sms=132) == 8
    assert choose_splits(1, 1, 10**6, 1, 1, sms=132) == 128  # at most MAX_SPLITS
    for row in split_table([(b, n, 8, q, 4) for b in (1, 4, 64) for n in (2048, 131072) for q in (1, 16)]):
        assert row["ctas"] <= 132 or row["splits"] == 1


def test_row_tiles_and_schedules():
    assert m_tiles(1, 4) == 1 and m_tiles(16, 4) == 1 and m_tiles(16, 16) == 4 and m_tiles(5, 13) == 2
    s = DecodeSchedule()
    assert s.num_stages(128, 2) == 3 and s.fits(128) and DecodeSchedule(tile_n=64).num_stages(256, 2) == 3
    with pytest.raises(ValueError, match="tile_n"):
        DecodeSchedule(tile_n=96)
    assert all(c.fits(128) for c in decode_candidates(128))


def test_swapped_operand_choice():
    """An FP8 cache with at most 16 packed rows and D >= 128 takes swapped operands (8 or 16 rows in N); bf16, more
    rows, or FP8 at D = 64 keep the rows in M. Without the fp16 tiles the stage ring grows (six 32 KiB FP8 stages
    at D = 128)."""
    from schedules.decode import default_decode_schedule, swap_rows_for

    assert [swap_rows_for(q, g) for q, g in ((1, 4), (2, 4), (1, 8), (3, 4), (4, 4), (1, 16), (5, 4), (2, 16))] == \
        [8, 8, 8, 16, 16, 16, 0, 0]
    assert default_decode_schedule(128, True, 1, 4).swap_rows == 8
    assert default_decode_schedule(256, True, 4, 4) == DecodeSchedule(tile_n=64, swap_rows=16)
    assert default_decode_schedule(128, False, 1, 4).swap_rows == 0
    assert default_decode_schedule(64, True, 1, 4).swap_rows == 0
    swap = DecodeSchedule(swap_rows=8)
    assert swap.rows_per_tile == 8 and DecodeSchedule().rows_per_tile == 64
    assert swap.num_stages(128, 1) == 6 and DecodeSchedule().num_stages(128, 1) == 4
    with pytest.raises(ValueError, match="swap_rows"):
        DecodeSchedule(swap_rows=4)


def test_catalogue_resolves():
    spec = catalog.get("flash_decode")
    assert spec.resolve({"head_dim": 256})["tile_n"] == 64
    with pytest.raises(ValueError, match="page_size"):
        spec.resolve({"page_size": 24})
    assert catalog.get("merge_attention_states").resolve({"head_dim": 96})["head_dim"] == 96


# --- the references -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 3))])
def test_reference_is_the_last_rows_of_attention(causal, window):
    torch.manual_seed(0)
    b, q_len, hq, hk, d, n = 2, 4, 6, 2, 16, 37
    q, k, v = torch.randn(b, q_len, hq, d), torch.randn(b, n, hk, d), torch.randn(b, n, hk, d)
    out, lse = decode_reference(q, k, v, torch.tensor([n, n]), causal=causal, window=window)
    left, right = window
    right = 0 if causal else right
    kk, vv = k.repeat_interleave(3, 2).transpose(1, 2), v.repeat_interleave(3, 2).transpose(1, 2)
    s = q.transpose(1, 2) @ kk.transpose(-1, -2) / math.sqrt(d)
    t, j = torch.arange(q_len)[:, None], torch.arange(n)[None, :]
    ok = torch.ones(q_len, n, dtype=torch.bool)
    if right >= 0:
        ok &= j <= n - q_len + t + right
    if left >= 0:
        ok &= j >= n - q_len + t - left
    s = s.masked_fill(~ok, -math.inf)
    want = (torch.softmax(s, -1) @ vv).transpose(1, 2)
    assert torch.allclose(out, want, atol=1e-5)
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)


def test_paged_reference_equals_contiguous():
    torch.manual_seed(1)
    b, n, page = 3, 50, 16
    k = torch.randn(b, 64, 2, 8)
    table = torch.randperm(12).int().view(3, 4)
    pool = torch.empty(12, page, 2, 8)
    for i in range(b):
        for p in range(4):
            pool[table[i, p]] = k[i, p * page:(p + 1) * page]
    q = torch.randn(b, 1, 4, 8)
    lens = torch.tensor([50, 0, 17])
    a, la = decode_reference(q, k, k, lens)
    c, lc = decode_reference(q, pool, pool, lens, table)
    assert torch.equal(a, c) and torch.equal(la, lc)
    assert (a[1] == 0).all() and (la[1] == math.inf).all()  # a keyless sequence
    del n


def test_merge_reference_is_associative_and_skips_empty_states():
    torch.manual_seed(2)
    o, lse = torch.randn(3, 2, 5, 4, 8), torch.randn(3, 2, 4, 5)
    lse[1, 0] = math.inf
    lse[2, 1] = -math.inf
    o[1, 0] = math.nan
    ab, lab = merge_reference(o[:2], lse[:2])
    two, l_two = merge_reference(torch.stack([ab.float(), o[2]]), torch.stack([lab.float(), lse[2]]))
    three, l_three = merge_reference(o, lse)
    assert torch.allclose(two, three, atol=1e-6) and torch.allclose(l_two, l_three, atol=1e-6)
    lse[:, 0, 0, 0] = math.inf
    out, lo = merge_reference(o, lse)
    assert (out[0, 0, 0] == 0).all() and lo[0, 0, 0] == math.inf


# --- the op in fake mode ------------------------------------------------------------------------------------------
def _fake(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_mode_shapes():
    with FakeTensorMode():
        q, kc = _fake(4, 2, 32, 128), _fake(40, 64, 8, 128)
        table = _fake(4, 10, dtype=torch.int32)
        lens = _fake(4, dtype=torch.int32)
        out, lse = ck.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, block_table=table, return_lse=True)
        assert out.shape == (4, 2, 32, 128) and lse.shape == (4, 32, 2) and lse.dtype == torch.float32
        k8 = _fake(40, 64, 8, 128, dtype=torch.float8_e4m3fn)
        out8 = ck.flash_attn_with_kvcache(q, k8, k8, cache_seqlens=lens, block_table=table,
                                          k_scale=_fake(40, 64, 8, dtype=torch.float32),
                                          v_scale=_fake(40, 64, 8, dtype=torch.float32))
        assert out8.shape == q.shape and out8.dtype == q.dtype
        o, l = ck.merge_attention_states_many(_fake(3, 2, 5, 4, 64, dtype=torch.float32),
                                              _fake(3, 2, 4, 5, dtype=torch.float32))
        assert o.shape == (2, 5, 4, 64) and o.dtype == torch.float32 and l.shape == (2, 4, 5)


E4M3 = torch.float8_e4m3fn


def _bad(**kw):
    base = dict(q=_fake(2, 1, 8, 128), k_cache=_fake(2, 100, 2, 128), v_cache=_fake(2, 100, 2, 128))
    base.update(kw)
    return base


@pytest.mark.parametrize("make,exc,match", [
    (lambda: _bad(q=_fake(2, 1, 8, 96), k_cache=_fake(2, 100, 2, 96), v_cache=_fake(2, 100, 2, 96)), ValueError,
     "head dim"),
    (lambda: _bad(q=_fake(2, 1, 9, 128)), ValueError, "multiple of the cache's key/value heads"),
    (lambda: _bad(v_cache=_fake(2, 99, 2, 128)), ValueError, "same shape"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=torch.float16)), TypeError, "k_cache has dtype"),
    (lambda: _bad(k_cache=_fake(9, 24, 2, 128), v_cache=_fake(9, 24, 2, 128),
                  block_table=_fake(2, 4, dtype=torch.int32)), ValueError, "page size"),
    (lambda: _bad(block_table=_fake(2, 4, dtype=torch.int64)), TypeError, "block_table must be int32"),
    (lambda: _bad(block_table=_fake(3, 4, dtype=torch.int32)), ValueError, "block_table must be"),
    (lambda: _bad(cache_seqlens=_fake(3, dtype=torch.int32)), ValueError, "cache_seqlens must be"),
    (lambda: _bad(cache_seqlens=_fake(2, dtype=torch.int64)), TypeError, "cache_seqlens must be int32"),
    (lambda: _bad(k_cache=_fake(3, 100, 2, 128), v_cache=_fake(3, 100, 2, 128)), ValueError, "batch"),
    (lambda: _bad(k=_fake(2, 1, 2, 128)), ValueError, "given together"),
    (lambda: _bad(k=_fake(2, 2, 2, 128), v=_fake(2, 2, 2, 128), cache_seqlens=_fake(2, dtype=torch.int32)),
     ValueError, "k must be"),
    (lambda: _bad(k=_fake(2, 1, 2, 128), v=_fake(2, 1, 2, 128)), ValueError, "needs cache_seqlens"),
    (lambda: _bad(num_splits=0), ValueError, "num_splits"),
    (lambda: _bad(k_scale=_fake(2, dtype=torch.float32)), ValueError, "k_scale is given but the cache is bfloat16"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=E4M3), v_cache=_fake(2, 100, 2, 128, dtype=E4M3)), ValueError,
     "k_scale is needed"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=E4M3), v_cache=_fake(2, 100, 2, 128, dtype=E4M3),
                  k_scale=_fake(2, dtype=torch.float32), v_scale=_fake(3, dtype=torch.float32)), ValueError,
     r"v_scale must be per KV head \(2,\) or per token and head \(2, 100, 2\)"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=E4M3), v_cache=_fake(2, 100, 2, 128, dtype=E4M3),
                  k_scale=_fake(2, dtype=torch.float32), v_scale=_fake(2, 100, 2, dtype=torch.float32)), ValueError,
     "one granularity"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=E4M3), v_cache=_fake(2, 100, 2, 128, dtype=E4M3),
                  k_scale=_fake(2, dtype=torch.bfloat16), v_scale=_fake(2, dtype=torch.float32)), TypeError,
     "k_scale must be float32"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=E4M3)), TypeError, "one dtype"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=E4M3), v_cache=_fake(2, 100, 2, 128, dtype=E4M3),
                  k_scale=_fake(2, dtype=torch.float32), v_scale=_fake(2, dtype=torch.float32),
                  k=_fake(2, 1, 2, 128, dtype=E4M3), v=_fake(2, 1, 2, 128, dtype=E4M3),
                  cache_seqlens=_fake(2, dtype=torch.int32)), TypeError, "quantizes them on append"),
    (lambda: _bad(k_cache=_fake(2, 100, 2, 128, dtype=torch.float8_e5m2),
                  v_cache=_fake(2, 100, 2, 128, dtype=torch.float8_e5m2)), TypeError, "float8_e4m3fn"),
    (lambda: _bad(window=(-3, 0)), ValueError, "window"),
])
def test_named_errors(make, exc, match):
    with FakeTensorMode():
        kw = make()
        with pytest.raises(exc, match=match):
            ck.flash_attn_with_kvcache(**kw)


def test_merge_named_errors():
    with FakeTensorMode():
        o, lse = _fake(2, 3, 4, 64, dtype=torch.float32), _fake(2, 4, 3, dtype=torch.float32)
        with pytest.raises(ValueError, match="lse_b must be"):
            ck.merge_attention_states(o, lse, o, _fake(2, 3, 4, dtype=torch.float32))
        with pytest.raises(TypeError, match="lse_a must be float32"):
            ck.merge_attention_states(o, lse.half(), o, lse)
        with pytest.raises(ValueError, match="5-D"):
            ck.merge_attention_states_many(o, lse)
        with pytest.raises(ValueError, match="multiple of 4"):
            ck.merge_attention_states_many(_fake(2, 2, 3, 4, 66, dtype=torch.float32),
                                           _fake(2, 2, 4, 3, dtype=torch.float32))


# --- the compiled kernels -----------------------------------------------------------------------------------------
def _census(name, overrides, tmp_path):
    spec = catalog.get(name)
    _, files = compile_with_artifacts(spec, spec.resolve(overrides), str(tmp_path))
    ptx = files["ptx"].read_text()
    return ptx, lambda pat: len(re.findall(pat, ptx, re.M))


@pytest.mark.parametrize("over,boxes", [({}, 1), ({"page_size": 16, "split": True, "mask": "causal",
                                                   "fused_merge": True}, 8),
                                        ({"page_size": 48, "head_dim": 256, "mask": "band", "softcap": True,
                                          "split": True}, 4)])
def test_decode_ptx(over, boxes, tmp_path):
    """Per K/V tile: `boxes` TMA boxes a page each, times D / 64 column blocks, for K and for V; D / 16 + tile_n / 16
    WGMMAs; Q gathered in 16-byte vectors; no local memory."""
    ptx, count = _census("flash_decode", over, tmp_path)
    d = over.get("head_dim", 128)
    tile_n = 128 if d <= 128 else 64
    assert count(r"^\s*cp\.async\.bulk\.tensor\.4d") == 2 * boxes * (d // 64)
    assert count(r"^\s*wgmma\.mma_async") == d // 16 + tile_n // 16
    assert count(r"^\s*ld\.global\.v4") >= d // 16  # Q
    assert "ld.local" not in ptx and "st.local" not in ptx
    # the fused merge of a split variant: one counter add, the partials released and acquired at gpu scope
    fused = over.get("fused_merge", False)
    assert count(r"atom\.global\.add") == (1 if fused else 0)
    assert count(r"fence\.acq_rel\.gpu") == (2 if fused else 0)
    assert count(r"griddepcontrol\.wait") == 1
    # the split's first tiles prefetched into L2 (one K and one V prefetch a box) before the PDL wait
    first_wait = ptx.find("griddepcontrol.wait")
    early = ptx[:first_wait]
    assert len(re.findall(r"cp\.async\.bulk\.prefetch\.tensor\.4d\.L2", early)) == 2 * boxes * (d // 64)
    assert "cp.async.bulk.prefetch.tensor" not in ptx[first_wait:]


@pytest.mark.parametrize("over", [{"kv_scale": "head"}, {"kv_scale": "token", "page_size": 64, "split": True},
                                  {"kv_scale": "token", "head_dim": 256, "page_size": 16}])
def test_decode_fp8_ptx(over, tmp_path):
    """FP8 KV: e4m3 tiles by TMA (128-byte rows: one box a page part per 128 of D), widened pairwise to fp16 (one
    cvt per two elements of K and V), per-token scales as fp16x2 multiplies, fp16 WGMMAs; no local
    memory."""
    ptx, count = _census("flash_decode", over, tmp_path)
    d = over.get("head_dim", 128)
    tile_n = 128 if d <= 128 else 64
    page = over.get("page_size", 0)
    boxes = 1 if page == 0 else tile_n // math.gcd(page, tile_n)
    assert count(r"^\s*cp\.async\.bulk\.tensor\.4d") == 2 * boxes * max(1, d // 128)
    # (K's widening appears twice: the first tile's before the loop, the next tile's under the P V WGMMA)
    widen = 3 * tile_n * d // 256
    assert count(r"cvt\.rn\.f16x2\.e4m3x2") == widen
    assert count(r"mul\.(rn\.)?f16x2") == (widen if over["kv_scale"] == "token" else 0)
    assert count(r"^\s*wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16") == d // 16 + tile_n // 16
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.parametrize("over", [{"kv_scale": "head", "swap_rows": 8},
                                  {"kv_scale": "token", "swap_rows": 16, "page_size": 16, "mask": "causal"},
                                  {"kv_scale": "head", "swap_rows": 8, "head_dim": 256, "split": True},
                                  {"swap_rows": 8, "split": True}])
def test_decode_swapped_ptx(over, tmp_path):
    """Swapped operands: m64 n(swap_rows) k16 WGMMAs with A from registers, (tile_n / 64) (D / 16) for S^T and
    (D / 64) (tile_n / 16) for O^T; an FP8 tile widened once (one cvt per two elements of K and V, K's twice in the
    code: the first tile's and the next tile's under P V), byte permutes pairing V's keys; K in 16-byte loads and a
    key's V part in one load; no local memory; two warpgroup barriers a tile (the column max, P^T)."""
    ptx, count = _census("flash_decode", over, tmp_path)
    d = over.get("head_dim", 128)
    tile_n = 128 if d <= 128 else 64
    n = over["swap_rows"]
    fp8 = "kv_scale" in over
    kt = "f16" if fp8 else "bf16"
    mmas = count(rf"^\s*wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.{kt}\.{kt} \{{%r\d+, ")
    assert mmas == (tile_n // 64) * (d // 16) + (d // 64) * (tile_n // 16)
    assert count(r"^\s*wgmma\.mma_async") == mmas
    elems = tile_n * d // 128  # a thread's K (or V) elements of a tile
    if fp8:
        assert count(r"cvt\.rn\.f16x2\.e4m3x2") == elems // 2 * 2 + elems // 2  # K twice, V once
        assert count(r"prmt\.b32") == elems // 4  # V: four elements of a key pair a permute
    assert count(r"^\s*ld\.shared\.v4") >= 2 * (tile_n // 64) * (d * (1 if fp8 else 2) // 64)
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.skipif(__import__("shutil").which("ptxas") is None, reason="needs a CUDA 13 ptxas for its advisories")
@pytest.mark.parametrize("over", [{"kv_scale": "head", "swap_rows": 8},
                                  {"kv_scale": "token", "swap_rows": 16, "page_size": 64, "split": True}])
def test_decode_swapped_wgmma_not_serialized(over):
    """ptxas keeps the swapped-operand WGMMAs asynchronous: the register A operands are pinned before each group's
    fence (no C7513), and no group is left in flight across the loop's back edge (no C7514), no spills."""
    from perf.ptxas_check import check

    report = check("flash_decode", over)
    assert not re.search(r"C751[234]", report), report
    assert "0 bytes spill stores" in report, report


def test_merge_schedule_choice():
    """The chunk covers the states up to 8; lanes grow only while the rows give few threads, up to one round trip."""
    from schedules.decode import MergeSchedule, choose_merge

    assert choose_merge(2, 1 << 20, 128, 132) == MergeSchedule(lanes=1, chunk=2)
    assert choose_merge(8, 1 << 20, 128, 132) == MergeSchedule(lanes=1, chunk=8)
    assert choose_merge(16, 32, 128, 132) == MergeSchedule(lanes=2, chunk=8)  # B1 L32k: one round trip
    assert choose_merge(128, 32, 128, 132) == MergeSchedule(lanes=16, chunk=8)
    assert choose_merge(128, 32, 512, 132).row_threads(512) <= 1024
    with pytest.raises(ValueError, match="lanes"):
        MergeSchedule(lanes=3)


@pytest.mark.parametrize("over", [{"lanes": 4, "chunk": 8}, {"chunk": 2}])
def test_merge_chunk_loads_issued_together(over, tmp_path):
    """A chunk's LSE and O loads all come before the first exp (one round trip a chunk), and with lanes the
    partial states combine by shuffles (6 values a butterfly step)."""
    ptx, count = _census("merge_attention_states", over, tmp_path)
    body = ptx[ptx.index(".entry"):]
    first_exp = body.index("ex2.approx")
    assert len(re.findall(r"ld\.global(\.nc)?\.v4", body[:first_exp])) == over["chunk"]
    lanes = over.get("lanes", 1)
    assert count(r"shfl\.sync\.bfly") == 6 * (lanes.bit_length() - 1)


def test_merge_ptx(tmp_path):
    ptx, count = _census("merge_attention_states", {}, tmp_path)
    assert count(r"^\s*ld\.global(\.nc)?\.v4\.(b32|f32)") >= 1  # one 16-byte fp32 vector per state
    assert "ld.local" not in ptx
