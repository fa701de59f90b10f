"""CPU: FlashAttention's schedule math, the mask's block ranges against a brute-force check of the
rule, and the torch op in fake mode (shapes, named errors, the autograd stub)."""

import dataclasses
import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from collectives.attention_mask import MaskKind, block_needs_mask, n_block_range, visible
from schedules.attention import (
    HEAD_DIMS,
    AttentionSchedule,
    block_coords,
    candidates,
    default_schedule,
    grid,
    tile_coords,
)


# --- schedule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_default_schedules_fit(d):
    s = default_schedule(d)
    assert s.fits(d) and s.num_stages(d) >= 2 and s.threads == 128 * (1 + s.consumer_wgs)
    assert s.smem_bytes(d) <= 232448
    assert s.accumulators(d) <= (208 if s.double_p else 192)  # S + O + P per thread under the 240-register budget
    cs = candidates(d)
    assert cs[0] == s and len(set(cs)) == len(cs) and all(c.fits(d) for c in cs)


def test_stage_counts_and_errors():
    assert default_schedule(128).num_stages(128) == 3  # Q 32 KiB + 3 x (K + V) 64 KiB (O reuses Q)
    assert default_schedule(64).num_stages(64) == 4
    assert AttentionSchedule(tile_n=128).kv_stage_bytes(128) == 65536
    with pytest.raises(ValueError, match="tile_m"):
        AttentionSchedule(tile_m=256)
    with pytest.raises(ValueError, match="tile_m 192"):
        AttentionSchedule(kind="fa2", tile_m=192)
    # three consumers: 512 threads, FA3's 32 + 3 x 160 registers, turns round robin; the synchronous
    # walk and the overlap fit D = 64 at tile_n 128 (128 accumulators), not D = 96
    t = AttentionSchedule(tile_m=192)
    assert t.consumer_wgs == 3 and t.threads == 512 and t.pingpong and (t.producer_regs, t.consumer_regs) == (32, 160)
    assert t.fits(64) and not t.fits(96) and AttentionSchedule(tile_m=192, overlap=True).fits(64)
    assert AttentionSchedule(tile_m=192, tile_n=64, overlap=True).fits(64)
    assert not AttentionSchedule(tile_m=192, overlap=True, double_p=True).fits(64)  # 160 accumulators
    assert AttentionSchedule(tile_m=128).consumer_regs == 240 and AttentionSchedule(tile_m=64).producer_regs == 24
    with pytest.raises(ValueError, match="tile_n"):
        AttentionSchedule(tile_n=72)
    with pytest.raises(ValueError, match="register budget"):
        AttentionSchedule(consumer_regs=248, producer_regs=24)
    with pytest.raises(ValueError, match="head_dim"):
        default_schedule(80)
    assert not AttentionSchedule(tile_n=256).fits(256)


def test_fa2_and_overlap_schedules():
    s = AttentionSchedule(kind="fa2")
    assert not s.pingpong and not s.warp_specialized and s.threads == 256 and s.consumer_wgs == 2
    assert s.num_stages(128) == 2 and s.prefetch == 1 and s.fits(128)
    assert AttentionSchedule(kind="fa2", stages=1).prefetch == 0  # load, wait, compute
    assert AttentionSchedule(kind="fa2", stages=3).prefetch == 2
    s64 = AttentionSchedule(kind="fa2", tile_m=64)
    assert s64.threads == 128 and s64.consumer_wgs == 1 and s64.q_bytes(128) == 16384
    f64 = AttentionSchedule(tile_m=64)
    assert f64.threads == 256 and not f64.pingpong and f64.warp_specialized
    assert AttentionSchedule().pingpong and AttentionSchedule().threads == 384 and AttentionSchedule().prefetch == 0
    ov = AttentionSchedule(overlap=True)
    assert ov.accumulators(128) == AttentionSchedule().accumulators(128)  # P_j in its own bf16 registers
    assert str(ov) == "fa3_128x128_s0_wg2_pp_ov" and str(AttentionSchedule()) == "fa3_128x128_s0_wg2_pp"
    assert AttentionSchedule(pingpong=True) == AttentionSchedule()  # None resolves to the kind's default
    with pytest.raises(ValueError, match="pingpong"):
        AttentionSchedule(kind="fa2", pingpong=True)
    with pytest.raises(ValueError, match="pingpong"):
        AttentionSchedule(tile_m=64, pingpong=True)
    with pytest.raises(ValueError, match="overlap"):
        AttentionSchedule(kind="fa2", overlap=True)
    dp = AttentionSchedule(overlap=True, double_p=True)
    assert str(dp) == "fa3_128x128_s0_wg2_pp_ov_dp" and dp != ov and dp.accumulators(128) == 160 + 32
    assert AttentionSchedule(tile_n=80, overlap=True, double_p=True).accumulators(256) == 208  # fits: 225 regs
    with pytest.raises(ValueError, match="double_p"):
        AttentionSchedule(double_p=True)  # a variant of the overlap
    with pytest.raises(ValueError, match="kind"):
        AttentionSchedule(kind="fa1")
    with pytest.raises(ValueError, match="stages"):
        AttentionSchedule(stages=5)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_candidate_lists(d):
    """The list `cute-kernels schedules attention` times: default first, <= 24, both kinds, ping-pong
    and overlap on and off, both tile_m; each round-trips through the catalogue's params."""
    from cute_kernels.attention import FLASH_ATTN, params_for, schedule_of

    cs = candidates(d, causal=True)
    assert cs[0] == default_schedule(d, True) and 10 <= len(cs) <= 24
    assert len({str(c) for c in cs}) == len(cs) and all(c.fits(d) for c in cs)
    assert {c.kind for c in cs} == {"fa3", "fa2"} and {c.tile_m for c in cs} == ({64, 128, 192} if d == 64 else {64, 128})
    assert {c.overlap for c in cs} == {True, False} and {c.pingpong for c in cs} == {True, False}
    assert len(candidates(d, limit=5)) == 5
    for c in cs:
        p = FLASH_ATTN.resolve(params_for(c, head_dim=d, mask="causal"))
        assert schedule_of(p) == c


def test_catalogue_params_for_fa2():
    from cute_kernels.attention import FLASH_ATTN, schedule_of

    # the pingpong and overlap params' defaults follow the schedule: off for fa2, overlap off under lazy_rescale;
    # a combination asked for explicitly that the schedule cannot build is refused, never rewritten
    p = FLASH_ATTN.resolve({"schedule": "fa2"})
    assert p["pingpong"] is False and p["overlap"] is False and schedule_of(p) == AttentionSchedule(kind="fa2")
    assert FLASH_ATTN.resolve({"lazy_rescale": True})["overlap"] is False
    for off in ({"overlap": False}, {"schedule": "fa2"}, {"lazy_rescale": True}):  # double_p needs the overlap
        assert FLASH_ATTN.resolve(off)["double_p"] is False
        with pytest.raises(ValueError, match="double_p"):
            FLASH_ATTN.resolve({"double_p": True, **off})
    assert schedule_of(FLASH_ATTN.resolve({"double_p": True})) == AttentionSchedule(overlap=True, double_p=True)
    assert FLASH_ATTN.resolve({})["overlap"] is True and schedule_of(FLASH_ATTN.resolve({})) == default_schedule(128)
    with pytest.raises(ValueError, match="overlap"):
        AttentionSchedule(kind="fa2", overlap=True)


def test_gpu_test_schedules_resolve():
    """Every schedule tests/attention/test_forward_gpu.py runs passes the catalogue's checks (smem and registers
    fit its head dim): a misfit shows up here, not as a ValueError in the GPU session."""
    from cute_kernels.attention import FLASH_ATTN, params_for
    from tests.attention import test_forward_gpu as g

    cases = [(d, n) for d, _ in g.SCHEDULE_CASES for n in g.SCHEDULE_NAMES]
    cases += [(256, n) for n in g.D256_NAMES] + [(128, n) for n in g.AGREE_NAMES]
    for d, name in cases:
        FLASH_ATTN.resolve(params_for(g._schedule(name, d), head_dim=d))


def test_grid_and_lpt_order():
    s = default_schedule(128)
    assert grid(1000, 16, 2, s) == (8, 16, 2)
    assert grid(1, 1, 1, s) == (1, 1, 1)
    assert [tile_coords(x, 0, 0, 8, True)[0] for x in range(8)] == list(range(7, -1, -1))
    assert [tile_coords(x, 3, 1, 8, False) for x in range(2)] == [(0, 3, 1), (1, 3, 1)]


def test_heads_first_grid_runs_longest_first():
    """`heads_first` (session 21): the grid (H_q, B, q_tiles). In launch order (block x fastest, then y, z) the causal
    tiles' K/V block counts never grow over the whole grid; the default grid orders them within each (head, batch)
    only (head 0's shortest tile launches before head 1's longest). Both grids cover every tile once."""
    import dataclasses

    from collectives.attention_mask import MaskKind, n_block_range

    sq = sk = 1000
    heads, batch = 3, 2
    for hf in (False, True):
        s = dataclasses.replace(default_schedule(128), heads_first=hf)
        gx, gy, gz = grid(sq, heads, batch, s)
        q_tiles = -(-sq // s.tile_m)
        assert (gx, gy, gz) == ((heads, batch, q_tiles) if hf else (q_tiles, heads, batch))
        order = [tile_coords(*block_coords(x, y, z, hf), q_tiles, True)
                 for z in range(gz) for y in range(gy) for x in range(gx)]
        assert sorted(order) == sorted((m, h, b) for m in range(q_tiles) for h in range(heads) for b in range(batch))
        work = []
        for m, _, _ in order:
            lo, hi = n_block_range(m, s.tile_m, s.tile_n, sq, sk, -1, 0, MaskKind(left=False, right=True))
            work.append(hi - lo)
        assert (work == sorted(work, reverse=True)) == hf, (hf, work[:12])


def test_persistent_walk_keeps_the_launch_order():
    """`persistent` (session 22): CTA x of X visits tiles x, x + X, ... of the one-CTA-a-tile launch order. Over all
    CTAs every tile comes once; merged by step (every CTA's first tile, then every CTA's second, ...) the walk is
    the launch order itself, with and without `heads_first`; no CTA gets more than one tile beyond another."""
    import dataclasses

    from schedules.attention import PersistentWalk, persistent_ctas

    for sq, heads, batch, sms in ((1000, 3, 2, 132), (8192, 16, 2, 132), (17, 1, 1, 132), (4096, 5, 3, 7)):
        for hf in (False, True):
            s = dataclasses.replace(default_schedule(128), heads_first=hf, persistent=True)
            q_tiles = -(-sq // s.tile_m)
            ctas = persistent_ctas(q_tiles, heads, batch, sms)
            assert ctas == min(sms, q_tiles * heads * batch)
            gx, gy, gz = grid(sq, heads, batch, dataclasses.replace(s, persistent=False))
            launch = [block_coords(x, y, z, hf) for z in range(gz) for y in range(gy) for x in range(gx)]
            walks = [PersistentWalk(q_tiles, heads, batch, c, ctas) for c in range(ctas)]
            counts = [w.count() for w in walks]
            assert max(counts) - min(counts) <= 1 and sum(counts) == len(launch)
            merged = [walks[c].coords(i, hf) for i in range(max(counts)) for c in range(ctas) if i < counts[c]]
            assert merged == launch


def _handout(total, ctas, asks):
    """The kernel's `dynamic` protocol on the host: CTA x starts on tile x; each CTA that asks (`asks` yields CTA
    indices, in the order their producers reach `take_tile`) gets ctas + the counter's old value while that is below
    `total`, and stops at its first refusal. Returns each CTA's tiles and the counter after the launch (the fetch
    that returned total - 1 reset it)."""
    tiles, done, counter, fetches = [[x] for x in range(ctas)], set(), 0, 0
    for x in asks:
        if x in done:
            continue
        old, counter, fetches = counter, counter + 1, fetches + 1
        if old == total - 1:
            counter = 0  # take_tile: the launch's last fetch
        if ctas + old < total:
            tiles[x].append(ctas + old)
        else:
            done.add(x)
        if len(done) == ctas:
            break
    assert fetches == total  # every CTA asks until refused: the reset comes after the last fetch, never before
    return tiles, counter


def test_dynamic_handout_covers_every_tile_once():
    """`dynamic` (session 23): whatever order the CTAs ask in (round robin, one CTA hogging the counter, random), every
    tile of the walk is computed once, the counter is 0 after the launch (the next launch starts clean without a
    memset), and the tile indices decode (`linear_coords`) to the launch order's tiles; `dynamic` needs `persistent`."""
    import itertools
    import random

    from schedules.attention import AttentionSchedule, linear_coords, persistent_ctas

    rng = random.Random(0)
    for q_tiles, heads, batch, sms in ((8, 3, 2, 132), (64, 16, 2, 132), (1, 1, 1, 132), (43, 5, 3, 7), (3, 2, 1, 6)):
        total = q_tiles * heads * batch
        ctas = persistent_ctas(q_tiles, heads, batch, sms)
        orders = [itertools.cycle(range(ctas)), itertools.chain([0] * (total + 1), itertools.cycle(range(ctas))),
                  (rng.randrange(ctas) for _ in itertools.count())]
        for asks in orders:
            tiles, counter = _handout(total, ctas, asks)
            assert counter == 0
            assert sorted(t for ts in tiles for t in ts) == list(range(total))
        for hf, group in ((False, None), (True, None), (False, 2)):
            coords = [linear_coords(t, q_tiles, heads, batch, hf, group) for t in range(total)]
            assert sorted(coords) == sorted((m, h, b) for m in range(q_tiles) for h in range(heads) for b in range(batch))
    with pytest.raises(ValueError, match="dynamic"):
        AttentionSchedule(overlap=True, dynamic=True)


def test_l2_groups_order():
    """`l2_groups` (session 22): block index t of the 1-D grid is tile `grouped_coords(t, ...)`. Every tile comes once;
    the (batch, head) pairs come in groups whose K/V fit L2_KV_BYTES (a group holds whole GQA head sets); within a
    group the causal tiles' work never grows (longest first), and the next group starts after the last one ends."""
    from collectives.attention_mask import MaskKind, n_block_range
    from schedules.attention import L2_KV_BYTES, grouped_coords, l2_group_heads

    for sq, sk, heads, kv_heads, batch, d in ((1000, 1000, 6, 6, 2, 128), (8192, 8192, 16, 16, 2, 128),
                                              (4096, 4100, 32, 8, 4, 64), (300, 70000, 4, 1, 3, 256), (17, 17, 1, 1, 1, 64)):
        s = dataclasses.replace(default_schedule(d), l2_groups=True)
        q_tiles = -(-sq // s.tile_m)
        group = l2_group_heads(sk, d, heads // kv_heads)
        assert group % (heads // kv_heads) == 0 and group >= 1
        kv_group = group // (heads // kv_heads)
        assert kv_group & (kv_group - 1) == 0  # a power of two (the tail: test_l2_groups_balance_the_causal_tail)
        assert kv_group == 1 or kv_group * 2 * sk * d * 2 <= L2_KV_BYTES
        gx, gy, gz = grid(sq, heads, batch, s)
        assert (gy, gz) == (1, 1) and gx == q_tiles * heads * batch
        order = [tile_coords(*grouped_coords(t, q_tiles, heads, batch, group), q_tiles, True) for t in range(gx)]
        assert sorted(order) == sorted((m, h, b) for m in range(q_tiles) for h in range(heads) for b in range(batch))
        pairs = [b * heads + h for _, h, b in order]
        for start in range(0, heads * batch, group):
            members = set(range(start, min(start + group, heads * batch)))
            idx = [i for i, p in enumerate(pairs) if p in members]
            assert idx == list(range(idx[0], idx[0] + len(idx)))  # a group's tiles are contiguous
            work = []
            for i in idx:
                m = order[i][0]
                lo, hi = n_block_range(m, s.tile_m, s.tile_n, sq, sk, -1, 0, MaskKind(left=False, right=True))
                work.append(hi - lo)
            assert work == sorted(work, reverse=True)


def _finish(order, work, workers=132):
    """When the last of the tiles in `order` (each `work[t]` long) ends, handed in order to the first free worker (the
    block scheduler and the `dynamic` walk alike)."""
    import heapq

    free = [0.0] * workers
    for t in order:
        heapq.heappush(free, heapq.heappop(free) + work[t])
    return max(free)


def test_l2_groups_balance_the_causal_tail():
    """Session 23's evidence for the power-of-two groups (`l2_group_heads`). ncu at D = 256 causal, B2 S8k H8: the same
    tensor-pipe cycles as FA4, but the SMs were active 89.6 % of the elapsed cycles (the busiest SM 1.278 M cycles,
    the idlest 1.059 M) against FA4's 97.9 %. A list-scheduling model of the FA3-shaped causal suite (132 SMs, a tile's
    work = its K/V blocks + 1.5 for its prologue and epilogue) says why: the plain order (one head's tiles longest
    first, head after head) starts the last heads' longest tiles when the other SMs are nearly done (0.898 of the
    ideal at that shape; the ncu ratio was 0.896). L2 groups of 3 heads (24 MiB / 8 MiB) end in a group of 1: 0.865
    (measured 677.3 against 702.4 TFLOP/s). Groups rounded down to a power of two divide B x H = 16: 0.996. Every
    suite shape from 2k keys reaches >= 0.95 with the groups (the plain order: 0.88-0.97 at D = 128 / 256)."""
    from collectives.attention_mask import MaskKind, n_block_range
    from schedules.attention import grouped_coords, l2_group_heads

    causal = MaskKind(left=False, right=True)
    for d in (64, 128, 256):
        for sk in (2048, 4096, 8192, 16384):
            heads = (16384 // sk) * (2048 // d)  # B x H of the suite (batch x seqlen = 16k, hidden 2048)
            s = default_schedule(d, True, sk)
            q_tiles = -(-sk // s.tile_m)
            work = {}
            for m in range(q_tiles):
                lo, hi = n_block_range(m, s.tile_m, s.tile_n, sk, sk, -1, 0, causal)
                for h in range(heads):
                    work[(m, h)] = hi - lo + 1.5
            ideal = sum(work.values()) / 132
            plain = [(q_tiles - 1 - m, h) for h in range(heads) for m in range(q_tiles)]
            group = l2_group_heads(sk, d, 1)
            grouped = []
            for t in range(q_tiles * heads):
                mi, h, _ = grouped_coords(t, q_tiles, heads, 1, group)
                grouped.append((q_tiles - 1 - mi, h))
            eff_plain, eff_grouped = ideal / _finish(plain, work), ideal / _finish(grouped, work)
            assert eff_grouped >= 0.95, (d, sk, group, eff_grouped)
            assert eff_grouped >= eff_plain - 0.005, (d, sk, eff_grouped, eff_plain)
            if d == 256 and sk == 8192:
                assert group == 2 and abs(eff_plain - 0.898) < 0.01 and eff_grouped > 0.99


# --- masks: block ranges vs brute force ------------------------------------------------------------
def _kind(left, right):
    return MaskKind(left=left >= 0, right=right >= 0)


def _cases():
    seqs = [(1, 1), (17, 17), (1, 300), (300, 1), (128, 128), (129, 257), (257, 129), (64, 1000), (1000, 64)]
    windows = [(-1, -1), (-1, 0), (5, 0), (0, 0), (70, -1), (-1, 33), (100, 3), (0, 200)]
    tiles = [(128, 128), (128, 80), (128, 96)]
    return list(itertools.product(seqs, windows, tiles))


@pytest.mark.parametrize("seqs,window,tiles", _cases())
def test_block_ranges_match_brute_force(seqs, window, tiles):
    sq, sk = seqs
    left, right = window
    tm, tn = tiles
    kind = _kind(left, right)
    n_blocks = -(-sk // tn)
    for m in range(-(-sq // tm)):
        rows = range(m * tm, min(m * tm + tm, sq))
        vis_blocks = {j // tn for i in rows for j in range(sk) if visible(i, j, sq, sk, left, right)}
        n_min, n_max = n_block_range(m, tm, tn, sq, sk, left, right, kind)
        assert 0 <= n_min and n_max <= n_blocks
        assert all(n_min <= n < n_max for n in vis_blocks), (m, n_min, n_max, sorted(vis_blocks))
        if vis_blocks:
            assert n_max - 1 == max(vis_blocks)  # tight at the end (the diagonal side)
        for n in range(n_min, n_max):
            cols = range(n * tn, n * tn + tn)
            masked = any(not visible(i, j, sq, sk, left, right) for i in rows for j in cols)
            assert bool(block_needs_mask(n, m, tm, tn, sq, sk, left, right, kind)) == masked, (m, n)


def test_causal_is_bottom_right_aligned():
    # seqlen_q = 2, seqlen_k = 5: the last query sees every key, the first all but the last.
    assert [visible(0, j, 2, 5, -1, 0) for j in range(5)] == [True] * 4 + [False]
    assert all(visible(1, j, 2, 5, -1, 0) for j in range(5))
    # seqlen_q = 5 > seqlen_k = 2: the first 3 queries see nothing.
    assert not any(visible(i, j, 5, 2, -1, 0) for i in range(3) for j in range(2))
    assert n_block_range(0, 128, 128, 5, 2, -1, 0, MaskKind(right=True)) == (0, 1)


def test_skipped_blocks_with_a_long_causal_sequence():
    """Causal at 64k: the CTA of q tile m visits m + 1 blocks (tile_m == tile_n), half the square."""
    sq = sk = 65536 + 17
    kind = MaskKind(right=True)
    total = sum(n_block_range(m, 128, 128, sq, sk, -1, 0, kind)[1] for m in range(-(-sq // 128)))
    n = -(-sq // 128)
    assert total == n * (n + 1) // 2


# --- the op in fake mode ---------------------------------------------------------------------------
def _fake(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_mode_shapes():
    with FakeTensorMode():
        q, k, v = _fake(2, 100, 8, 128), _fake(2, 300, 2, 128), _fake(2, 300, 2, 128)
        out, lse = torch.ops.cute_kernels.flash_attn(q, k, v, True, -1, -1, None, 0.0)
        assert out.shape == (2, 100, 8, 128) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        out = ck.flash_attn(q.half(), k.half(), v.half(), window=(32, 0))
        assert out.shape == q.shape and out.dtype == torch.float16
        out, lse = ck.flash_attn(q, k, v, return_lse=True, softcap=30.0)
        assert lse.shape == (2, 8, 100)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: (_fake(1, 8, 2, 80), _fake(1, 8, 2, 80), _fake(1, 8, 2, 80)), ValueError, "head dim"),
    (lambda: (_fake(1, 8, 2, 64), _fake(1, 8, 2, 64, dtype=torch.float16), _fake(1, 8, 2, 64)), TypeError,
     "k has dtype"),
    (lambda: (_fake(1, 8, 3, 64), _fake(1, 8, 2, 64), _fake(1, 8, 2, 64)), ValueError, "multiple of key/value heads"),
    (lambda: (_fake(1, 8, 2, 64).float(), _fake(1, 8, 2, 64).float(), _fake(1, 8, 2, 64).float()), TypeError,
     "q has dtype float32"),
    (lambda: (_fake(1, 64, 2, 8).transpose(1, 3), _fake(1, 8, 2, 64), _fake(1, 8, 2, 64)), ValueError,
     "contiguous last dim"),
    (lambda: (_fake(1, 8, 2, 64), _fake(1, 8, 2, 64), _fake(1, 9, 2, 64)), ValueError, "same shape"),
    (lambda: (_fake(8, 2, 64), _fake(1, 8, 2, 64), _fake(1, 8, 2, 64)), ValueError, "4-D"),
    (lambda: (_fake(2, 8, 2, 64), _fake(1, 8, 2, 64), _fake(1, 8, 2, 64)), ValueError, "batch sizes"),
])
def test_named_errors(make, exc, match):
    with FakeTensorMode():
        q, k, v = make()
        with pytest.raises(exc, match=match):
            ck.flash_attn(q, k, v)


def test_argument_errors():
    with FakeTensorMode():
        q = _fake(1, 8, 2, 64)
        with pytest.raises(ValueError, match="window"):
            ck.flash_attn(q, q, q, window=(-2, 0))
        with pytest.raises(ValueError, match="window must be a pair"):
            ck.flash_attn(q, q, q, window=5)
        with pytest.raises(ValueError, match="softmax_scale"):
            ck.flash_attn(q, q, q, softmax_scale=-1.0)
        with pytest.raises(ValueError, match="softcap"):
            ck.flash_attn(q, q, q, softcap=-1.0)


def test_backward_ops_fake_mode():
    """The backward ops' fake impls: dq, dk, dv shaped like q, k, v; a wrong dout named (shape, dtype)."""
    with FakeTensorMode():
        q, k, v = _fake(2, 100, 8, 128), _fake(2, 300, 2, 128), _fake(2, 300, 2, 128)
        out, lse = _fake(2, 100, 8, 128), _fake(2, 8, 100, dtype=torch.float32)
        dq, dk, dv = torch.ops.cute_kernels.flash_attn_bwd(out, q, k, v, out, lse)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dq.dtype == q.dtype
        with pytest.raises(ValueError, match="dout must have the output's shape"):
            torch.ops.cute_kernels.flash_attn_bwd(_fake(2, 50, 8, 128), q, k, v, out, lse)
        with pytest.raises(TypeError, match="dout has dtype float16"):
            torch.ops.cute_kernels.flash_attn_bwd(_fake(2, 100, 8, 128, dtype=torch.float16), q, k, v, out, lse)
        qv, kv = _fake(1000, 8, 128), _fake(1500, 2, 128)
        cu = _fake(5, dtype=torch.int32)
        dq, dk, dv = torch.ops.cute_kernels.flash_attn_varlen_bwd(qv, qv, kv, kv, qv, _fake(8, 1000, dtype=torch.float32),
                                                                 None, cu, cu, 600, 900, True)
        assert dq.shape == qv.shape and dk.shape == kv.shape


def test_cpu_tensor_gets_a_named_device_error():
    x = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        ck.flash_attn(x, x, x)


# --- varlen in fake mode: shapes and named errors (the offsets' values are trusted, as in FA) --------
def _cu(n, dtype=torch.int32):
    return torch.empty(n, dtype=dtype, device="cuda")


def test_varlen_fake_mode_shapes():
    with FakeTensorMode():
        q, k, v = _fake(1000, 8, 128), _fake(1500, 2, 128), _fake(1500, 2, 128)
        out, lse = torch.ops.cute_kernels.flash_attn_varlen(q, k, v, _cu(5), _cu(5), 600, 900, True, -1, -1, None,
                                                            0.0)
        assert out.shape == (1000, 8, 128) and out.dtype == torch.bfloat16
        assert lse.shape == (8, 1000) and lse.dtype == torch.float32  # FA's varlen LSE: (heads, total_q)
        out = ck.flash_attn_varlen(q.half(), k.half(), v.half(), _cu(3), _cu(3), 500, 500, window=(32, 0))
        assert out.shape == q.shape and out.dtype == torch.float16
        out, lse = ck.flash_attn_varlen(q, k, v, _cu(2), _cu(2), 1000, 1500, return_lse=True, softcap=30.0)
        assert lse.shape == (8, 1000)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: (_fake(8, 2, 80), _fake(8, 2, 80), _fake(8, 2, 80), _cu(2), _cu(2)), ValueError, "head dim"),
    (lambda: (_fake(1, 8, 2, 64), _fake(8, 2, 64), _fake(8, 2, 64), _cu(2), _cu(2)), ValueError,
     "q must be 3-D"),
    (lambda: (_fake(8, 3, 64), _fake(8, 2, 64), _fake(8, 2, 64), _cu(2), _cu(2)), ValueError,
     "multiple of key/value heads"),
    (lambda: (_fake(8, 2, 64), _fake(8, 2, 64), _fake(9, 2, 64), _cu(2), _cu(2)), ValueError, "same shape"),
    (lambda: (_fake(8, 2, 64), _fake(8, 2, 64), _fake(8, 2, 64), _cu(2, torch.int64), _cu(2)), TypeError,
     "cu_seqlens_q must be int32"),
    (lambda: (_fake(8, 2, 64), _fake(8, 2, 64), _fake(8, 2, 64), _cu(2), _cu(2).float()), TypeError,
     "cu_seqlens_k must be int32"),
    (lambda: (_fake(8, 2, 64), _fake(8, 2, 64), _fake(8, 2, 64), _cu(0), _cu(0)), ValueError, "length B \\+ 1 >= 1"),
    (lambda: (_fake(8, 2, 64), _fake(8, 2, 64), _fake(8, 2, 64), torch.empty(1, 2, dtype=torch.int32, device="cuda"), _cu(2)),
     ValueError,
     "cu_seqlens_q must be 1-D"),
    (lambda: (_fake(8, 2, 64), _fake(8, 2, 64), _fake(8, 2, 64), _cu(3), _cu(2)), ValueError,
     "same length B \\+ 1"),
])
def test_varlen_named_errors(make, exc, match):
    with FakeTensorMode():
        q, k, v, cu_q, cu_k = make()
        with pytest.raises(exc, match=match):
            ck.flash_attn_varlen(q, k, v, cu_q, cu_k, 8, 8)


def test_varlen_argument_errors():
    with FakeTensorMode():
        q, cu = _fake(8, 2, 64), _cu(2)
        with pytest.raises(ValueError, match="max_seqlen_q must be >= 0"):
            ck.flash_attn_varlen(q, q, q, cu, cu, -1, 8)
        with pytest.raises(ValueError, match="window"):
            ck.flash_attn_varlen(q, q, q, cu, cu, 8, 8, window=(0, -2))
        with pytest.raises(ValueError, match="softcap"):
            ck.flash_attn_varlen(q, q, q, cu, cu, 8, 8, softcap=-1.0)


def test_varlen_cpu_tensor_errors():
    x, cu = torch.randn(4, 2, 64, dtype=torch.bfloat16), torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        ck.flash_attn_varlen(x, x, x, cu, cu, 4, 4)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        torch.ops.cute_kernels.flash_attn_varlen_bwd(x, x, x, x, x, torch.zeros(2, 4), None, cu, cu, 4, 4)


# --- the schedule search's command line (CPU: prints the candidates) --------------------------------
def _cli(*args):
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run([sys.executable, "-m", "cute_kernels", *args], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command times the candidates")
def test_cli_schedules_attention_lists_candidates():
    r = _cli("schedules", "attention", "--shape", "2", "8192", "16", "128", "--causal")
    assert r.returncode == 0, r.stderr
    lines = [ln.strip() for ln in r.stdout.splitlines()[1:]]
    assert "B=2 S=8192 H=16 D=128 causal" in r.stdout
    assert lines[0] == f"{default_schedule(128, True)}  (default)"
    assert [ln.split()[0] for ln in lines] == [str(c) for c in candidates(128, True)]
    r = _cli("schedules", "attention", "--shape", "1", "512", "8", "64", "--limit", "6")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 7, r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command times the candidates")
def test_cli_schedules_attention_backward_lists_candidates():
    from schedules.attention_bwd import candidates_bwd, default_bwd_schedule

    r = _cli("schedules", "attention", "--shape", "8", "2048", "32", "64", "--backward")
    assert r.returncode == 0, r.stderr
    lines = [ln.strip() for ln in r.stdout.splitlines()[1:]]
    assert "backward candidates" in r.stdout and lines[0] == f"{default_bwd_schedule(64)}  (default)"
    assert [ln.split()[0] for ln in lines] == [str(c) for c in candidates_bwd(64)]
    r = _cli("schedules", "gemm", "--shape", "64", "64", "64", "--backward")
    assert r.returncode != 0 and "--backward is for attention" in r.stderr


def test_cli_schedules_attention_errors():
    r = _cli("schedules", "attention", "--shape", "2", "8192", "16")
    assert r.returncode != 0 and "takes 4 sizes B S H D" in r.stderr
    r = _cli("schedules", "attention", "--shape", "2", "8192", "16", "80")
    assert r.returncode != 0 and "D must be one of" in r.stderr


@pytest.mark.parametrize("d", [64, 128, 256])
def test_schedule_replays_finish(d):
    """The timeline replay of docs/figures/make_attention_figures.py runs each candidate's loops as the
    kernel orders them (stage ring, in-line loads, ping-pong turns incl. the last hand-over, overlap):
    none deadlocks for 0 to 7 K/V blocks, and every block's two GEMMs run once per warpgroup. A token
    model: it checks the order of the turns and the ring's block accounting, not mbarrier parities or
    the producer's tails (the GPU smoke test `test_smoke_every_schedule_finishes` covers those)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "figures" / "make_attention_figures.py"
    spec = importlib.util.spec_from_file_location("make_attention_figures", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for s in candidates(d):
        for blocks in range(8):
            bars = mod.replay(s, blocks)
            gemms = [b for b in bars if b[0] == "tensor cores"]
            assert len(gemms) == 2 * blocks * s.consumer_wgs, (str(s), blocks)


def test_default_d64_by_keys():
    """D = 64: 192-row tiles (three consumers) except causal below 4096 keys (measured on the H200)."""
    assert default_schedule(64).tile_m == 192 and default_schedule(64, False, 512).tile_m == 192
    assert default_schedule(64).overlap and default_schedule(64).split_mask  # session 10: 1.036x the synchronous walk
    assert default_schedule(64, True, 8192).tile_m == 192 and default_schedule(64, True).tile_m == 192
    short = default_schedule(64, True, 1024)
    assert short.tile_m == 128 and short.overlap and short.split_mask
    assert default_schedule(256).double_p
    assert default_schedule(256).skip_rescale and not default_schedule(192).skip_rescale  # session 24
    # a causal mask changes only the tile order (L2 groups, session 24) from 2048 keys (1024 at D = 256), at D = 192
    # on the dynamic persistent grid; varlen keeps the plain order
    for d in (96, 128, 192, 256):
        plain = default_schedule(d, varlen=True)  # one CTA a tile
        for sk in (None, 512, 1024, 8192):
            grouped = sk is None or sk >= (1024 if d == 256 else 2048)
            late = d in (96, 128)  # V's stage released a step late under a causal mask (session 25)
            want = dataclasses.replace(plain, l2_groups=grouped, persistent=grouped and d == 192,
                                       dynamic=grouped and d == 192, late_v_release=late)
            assert default_schedule(d, True, sk) == want, (d, sk)
            assert default_schedule(d, True, sk, varlen=True) == dataclasses.replace(plain, late_v_release=late)
    assert not short.l2_groups and not short.persistent
    # D = 192 without a mask walks the dynamic persistent grid too (session 25), in the plain order; varlen does not
    full = default_schedule(192)
    assert full.persistent and full.dynamic and not full.l2_groups
    assert full == dataclasses.replace(default_schedule(192, varlen=True), persistent=True, dynamic=True)
    assert all(not default_schedule(d).persistent for d in (96, 128, 256))
    # late_v_release: D = 96 under every mask, D = 128 causal; not where the ring has two stages (D = 192: 0.62x)
    assert default_schedule(96).late_v_release and not default_schedule(128).late_v_release
    assert not any(default_schedule(d, c).late_v_release for d in (64, 192, 256) for c in (False, True))
    long = default_schedule(64, True, 8192)
    assert long.l2_groups and long.dynamic and not default_schedule(64, True, 8192, varlen=True).l2_groups
