"""CPU: FlashAttention compiles for sm_90a with what each schedule is made of and no local memory:
fa3 (WGMMA, TMA loads and stores, setmaxnreg hand-over, named barriers for the ping-pong and the
epilogue), fa3 with the intra-warpgroup overlap (twice the WGMMA sites, consumer registers < 240),
fa2 (no producer warpgroup, no setmaxnreg, TMA issued in line); and the two register-layout facts
the kernel rests on, checked element by element."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import highest_register

VARIANTS = [
    {"head_dim": 128},
    {"head_dim": 64, "mask": "causal"},
    # masks with a right bound walk the L2 groups' order (the ops' default since session 24)
    {"head_dim": 96, "mask": "window", "softcap": True, "dtype": "fp16", "l2_groups": True},
    {"head_dim": 192, "mask": "band", "l2_groups": True},
    {"head_dim": 256, "mask": "causal"},
    {"head_dim": 128, "pingpong": False},
    {"head_dim": 128, "overlap": True},
    {"head_dim": 256, "mask": "causal", "overlap": True},
    {"head_dim": 64, "overlap": True, "pingpong": False, "softcap": True},
    # the overlap with two P buffers: three GEMM sites per kind (first block, the two steps of a pass, last)
    {"head_dim": 128, "double_p": True},
    {"head_dim": 256, "mask": "causal", "double_p": True},
    {"head_dim": 64, "mask": "band", "softcap": True, "double_p": True, "pingpong": False},
    {"head_dim": 128, "mask": "causal", "varlen": True, "double_p": True},
    {"head_dim": 128, "tile_m": 64},
    {"head_dim": 128, "schedule": "fa2"},
    {"head_dim": 64, "mask": "causal", "schedule": "fa2", "tile_m": 64},
    {"head_dim": 256, "mask": "window", "schedule": "fa2", "stages": 1},
    # varlen: cu_seqlens read on the device, TMA loads at the sequence's offset, O by predicated st.global
    {"head_dim": 128, "varlen": True},
    {"head_dim": 64, "mask": "causal", "varlen": True, "overlap": True},
    {"head_dim": 256, "mask": "causal", "varlen": True, "double_p": True, "skip_rescale": True},  # the D = 256 default
    {"head_dim": 96, "mask": "band", "varlen": True, "softcap": True, "dtype": "fp16", "tile_m": 64},
    {"head_dim": 128, "mask": "window", "varlen": True, "schedule": "fa2"},
    # three consumer warpgroups (512 threads, setmaxnreg 32 / 160, turns round robin), the synchronous walk
    {"head_dim": 64, "tile_m": 192, "overlap": False},
    {"head_dim": 64, "tile_m": 192, "overlap": False, "mask": "causal", "varlen": True},
    {"head_dim": 64, "tile_m": 192, "overlap": False, "mask": "band", "lazy_rescale": True, "pingpong": False},
    {"head_dim": 64, "tile_m": 192, "tile_n": 64, "mask": "causal"},  # the overlap + split at 64-key blocks
    # the overlap at 192 x 128 (160 registers: P converted opaquely, `acc_as_a_operand`), split and not
    {"head_dim": 64, "tile_m": 192, "overlap": True},
    {"head_dim": 64, "tile_m": 192, "overlap": True, "split_mask": False, "mask": "causal"},
    # the grid launched heads first (H_q, B, q_tiles): block index z is the q tile (session 21)
    {"head_dim": 128, "mask": "causal", "heads_first": True},
    {"head_dim": 64, "mask": "causal", "varlen": True, "heads_first": True, "schedule": "fa2"},
    # persistent (session 22): one CTA per SM walks the tiles, both roles carrying their ring positions
    {"head_dim": 128, "persistent": True},
    {"head_dim": 128, "mask": "causal", "persistent": True, "heads_first": True},
    {"head_dim": 64, "mask": "causal", "tile_m": 192, "persistent": True},
    {"head_dim": 256, "mask": "causal", "double_p": True, "persistent": True},
    {"head_dim": 128, "overlap": False, "persistent": True},
    # FA3's order on a 1-D grid: heads in L2-sized groups, q slowest in a group (session 22); and walked persistently
    {"head_dim": 128, "mask": "causal", "l2_groups": True},
    {"head_dim": 64, "mask": "causal", "tile_m": 192, "l2_groups": True, "persistent": True},
    {"head_dim": 128, "mask": "causal", "schedule": "fa2", "l2_groups": True},
    # O's rescale skipped where no row's max moved (session 23): a vote and a branch around the rescale
    {"head_dim": 128, "mask": "causal", "skip_rescale": True},
    {"head_dim": 256, "double_p": True, "skip_rescale": True},
    # the persistent walk with its tiles handed out by an atomic counter (session 23; test_dynamic_handout_ptx)
    {"head_dim": 128, "persistent": True, "dynamic": True},
    {"head_dim": 256, "mask": "causal", "double_p": True, "persistent": True, "dynamic": True, "l2_groups": True},
]


def _id(v):
    return ",".join(f"{k}={x}" for k, x in v.items())


@pytest.fixture(scope="module", params=VARIANTS, ids=[_id(v) for v in VARIANTS])
def compiled(request, tmp_path_factory):
    spec = catalog.get("flash_attn")
    p = spec.resolve(request.param)
    report, files = compile_with_artifacts(spec, p, str(tmp_path_factory.mktemp("fa")))
    sass = files["sass"].read_text() if "sass" in files else None
    return request.param, p, report, files["ptx"].read_text(), sass


def test_schedule_ingredients(compiled):
    over, p, report, ptx, sass_text = compiled
    census = report.ptx_census
    d = p["head_dim"]
    from cute_kernels.attention import schedule_of

    s = schedule_of(p)
    # S = Q K^T: D/16 WGMMAs; O += P V: tile_n/16 (one 64 x N instruction each, per consumer warpgroup);
    # the overlap issues each twice (first block / steady state, steady state / last block), with two P
    # buffers three times (the walk runs in pairs of steps with the buffers' roles fixed)
    per_block = d // 16 + s.tile_n // 16
    if s.split_mask:  # the default at D <= 192: one loop body per mask run (exact counts: test_attention_split_compile)
        assert census["wgmma.mma_async"] % per_block == 0 and census["wgmma.mma_async"] >= 3 * per_block
    else:
        assert census["wgmma.mma_async"] == per_block * (3 if s.double_p else 2 if s.overlap else 1), report.format()
    assert census["cp.async.bulk.tensor"] >= (3 if p["varlen"] else 4)  # Q, K, V loads (+ the O store)
    k = report.kernels[0]
    assert k.threads is None or k.threads[0] == s.threads
    if s.warp_specialized:  # 24 / 240 with one or two consumer warpgroups, 32 / 160 with three
        assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{s.producer_regs}\b", ptx)
        assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{s.consumer_regs}\b", ptx)
        assert s.producer_regs * 128 + s.consumer_regs * 128 * s.consumer_wgs <= 65536
    else:  # fa2: no producer warpgroup, no register hand-over; every thread may use up to 255
        assert "setmaxnreg" not in ptx and census["setmaxnreg"] == 0
        assert s.threads == 128 * s.consumer_wgs and k.registers <= 255
    if sass_text is not None:  # the consumers' registers stay under setmaxnreg's 240 (fa3) / 255 (fa2)
        top = highest_register(sass_text)
        assert top < (s.consumer_regs if s.warp_specialized else 255), top
    if p["varlen"]:
        # O from registers: D / 4 stores of two adjacent columns per thread (+ its 2 LSE rows), none
        # narrower; cu_seqlens_q/k[b], [b + 1]: 4 loads; no TMA store (it would clobber the next sequence)
        assert len(re.findall(r"st\.global\.b32", ptx)) == d // 4 + 2 and "st.global.b16" not in ptx
        assert len(re.findall(r"ld\.global\.b32", ptx)) == 4 and not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)
    else:
        assert re.search(r"bar\.sync\s+%r\d+, 128;", ptx)  # the epilogue's per-warpgroup barrier (id 1 + wg)
    if s.pingpong:
        assert len(re.findall(r"bar\.arrive\s+%r\d+, 256;", ptx)) >= 2  # ping-pong turns (ids 4 + wg)
        assert re.search(r"bar\.sync\s+%r\d+, 256;", ptx)
    else:
        assert "bar.arrive" not in ptx
    assert census["ld/st.local"] == 0 and not report.spills, report.format()
    assert "cvt.rn.bf16x2.f32" in ptx or "cvt.rn.f16x2.f32" in ptx  # P packed two at a time
    if p["softcap"]:
        assert "tanh.approx.f32" in ptx
    sass = report.sass_census
    if sass is not None:
        assert sass["HGMMA/QGMMA"] > 0 and sass["UTMALDG (TMA load)"] >= 3
        assert (sass["UTMASTG (TMA store)"] == 0) if p["varlen"] else (sass["UTMASTG (TMA store)"] >= 1)
        assert sass["LDL/STL (spills)"] == 0


@pytest.mark.parametrize("d,wgs", [(64, 3), (96, 2), (128, 2), (128, 1), (192, 2), (256, 2)])
def test_q_fragment_is_the_stage_indexed_partition(d, wgs):
    """`FlashAttnFwd.q_fragment` (session 24): each consumer warpgroup's Q operand, partitioned with one MMA atom per
    warpgroup over ((64, wgs), D), holds element for element the coordinates of the old partition (one warpgroup's
    MMA over (64, D, wgs), the stage indexed by the warpgroup), in the same order; and the regrouped smem layout maps
    ((r, w), c) to the offset the staged one gives (r, c, w). Same addresses, fewer instructions."""
    import cutlass.cute as cute

    from cute_kernels.jit import compile_fn  # noqa: F401  (sets up the DSL target)
    from tests.attention import _probe as probe

    cute.compile(probe.q_probe, d, wgs)
    res, offsets = probe.OUT[("q", d, wgs)]
    for w, (old, new, old_layout, new_layout) in enumerate(res):
        assert len(old) == len(new) == 64 * d and old_layout.split(":")[0] == new_layout.split(":")[0]
        assert all(o == (n[0][0], n[1], n[0][1]) for o, n in zip(old, new)), w
        assert all(o[2] == w for o in old)
    assert all(a == b for a, b in offsets) and len(offsets) == 36 * wgs


@pytest.mark.parametrize("tile_n,d", [(128, 128), (80, 256), (96, 192), (128, 64)])
def test_register_layouts(tile_n, d):
    """acc_rows_view: each view row is one matrix row, a quad of lanes holds whole rows together;
    acc_a_view: the accumulator regrouped as the P V WGMMA's A operand holds, register for register,
    the (row, column) that operand expects."""
    import cutlass.cute as cute

    from cute_kernels.jit import compile_fn  # noqa: F401  (sets up the DSL target)
    from tests.attention import _probe as probe

    cute.compile(probe.probe, tile_n, d)
    res = {t: (rows, a, c) for t, rows, a, c in probe.OUT[(tile_n, d)]}
    for t, (rows, a, c) in res.items():
        assert a == c, f"thread {t}: P as A operand != accumulator regrouped"
        for row in rows:
            assert len({r for r, _ in row}) == 1, f"thread {t}: a view row spans matrix rows"
        assert len(rows) == 2 and len(rows[0]) == tile_n // 4
    quad = [res[t][0] for t in (0, 1, 2, 3)]
    for i in range(2):
        cols = sorted(col for rows in quad for _, col in rows[i])
        assert cols == list(range(tile_n)), "a quad of lanes must hold whole rows"
        assert len({rows[i][0][0] for rows in quad}) == 1


def test_dynamic_handout_ptx(compiled):
    """`dynamic` (session 23): one relaxed atomic add on the counter per fetch, broadcast from lane 0 by a shuffle, and
    the consumers' extra wait on Q's full barrier (the tile index comes with Q); the other walks have no atomics."""
    over, p, report, ptx, sass_text = compiled
    atoms = re.findall(r"atom\.global(?:\.relaxed\.gpu)?\.add\.u32", ptx)
    if p["dynamic"]:
        assert len(atoms) == 1 and re.search(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, 0, 31", ptx)
    else:
        assert not atoms


def test_skip_rescale_votes(compiled):
    """`skip_rescale` (session 23): every O rescale of the overlap sits behind a warp vote on corr == 1 (one per
    rescale site: the one-buffer overlap's step, or the two-buffer overlap's two steps and its last block); the
    default has no vote in its overlap."""
    over, p, report, ptx, sass_text = compiled
    votes = len(re.findall(r"vote\.sync\.all\.pred", ptx))
    if p["skip_rescale"]:
        assert votes >= (3 if p["double_p"] else 1), votes
    elif p["overlap"] and not p["lazy_rescale"]:
        assert votes == 0, votes
