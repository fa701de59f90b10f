"""CPU: ping-pong `k_interleave` (both consumer warpgroups on every 64-row tile, alternate K-blocks, partials
summed through warpgroup 1's half of the epilogue buffers) compiles for sm_90a without spills for the bf16 and
FP8 GEMMs, uses the exchange's named barriers (6: partial written, 7: partial read) and none of the ping-pong
turn barriers (3, 4), keeps the shared memory of the plain schedule, and the specs refuse what it cannot run."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.gemm import GemmSchedule
from tests.helpers import sass_or_skip

CASES = [("gemm", {"tile_n": 64, "cluster_m": 1, "cluster_n": 2}), ("gemm", {"tile_n": 32, "cluster_m": 2}),
         ("gemm", {"tile_n": 64, "cluster_m": 1, "bias": True, "activation": "silu", "out_dtype": "fp32"}),
         ("fp8_gemm", {"tile_n": 64, "cluster_m": 1}), ("fp8_gemm", {"tile_n": 16, "cluster_m": 2}),
         ("fp8_gemm", {"tile_n": 32, "cluster_m": 1, "sb_ahead": True})]


def _compile(name, over, tmp_path):
    spec = catalog.get(name)
    p = spec.resolve({"schedule": "pingpong", "tile_m": 64, **over})
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    return report, sass_or_skip(report, files)


@pytest.mark.parametrize("name,over", CASES, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for n, o in CASES])
def test_compiles_with_the_exchange(name, over, tmp_path):
    report, sass = _compile(name, {**over, "k_interleave": True}, tmp_path / "ki")
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    assert report.ptx_census["wgmma.mma_async"] > 0
    bars = set(re.findall(r"BAR\.(?:SYNC(?:\.DEFER_BLOCKING)?|ARV) (0x[0-9a-f]+)", sass))
    assert {"0x6", "0x7"} <= bars and not {"0x3", "0x4"} & bars, bars
    plain, sass0 = _compile(name, over, tmp_path / "plain")
    assert not {"0x6", "0x7"} & set(re.findall(r"BAR\.(?:SYNC(?:\.DEFER_BLOCKING)?|ARV) (0x[0-9a-f]+)", sass0))


def test_refusals():
    for bad in (dict(kind="cooperative", tile_m=128, tile_n=128), dict(kind="pingpong", tile_m=64, tile_n=128),
                dict(kind="pingpong", tile_m=128, tile_n=64), dict(kind="pingpong", tile_m=64, tile_n=64, split_k=2)):
        with pytest.raises(ValueError, match="k_interleave"):
            GemmSchedule(**bad, k_interleave=True)
    fp8 = catalog.get("fp8_gemm")
    base = {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1, "k_interleave": True}
    for opt in ("promote_overlap", "wg_turns", "promote_halves"):
        with pytest.raises(ValueError, match="k_interleave|wg_turns|promote_halves"):
            fp8.check(fp8.resolve({**base, opt: True}))
    fp8.check(fp8.resolve({**base, "sb_ahead": True}))  # the B scales a K-block ahead: allowed (clamped)
    with pytest.raises(ValueError, match="k_interleave"):  # 3 epilogue buffers: 12 KiB < the 16 KiB partial
        fp8.check(fp8.resolve({**base, "epi_stages": 3}))
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, k_interleave=True)
    assert s.exchange_fits(2) and str(s).count("_ki") == 1


@pytest.mark.parametrize("stages", [2, 4, 8, 10, 16])
def test_ring_positions_cover_every_stage_once(stages):
    """The kernel's bookkeeping, modelled: at tile t (ring base kbase = sum of the earlier tiles' K-blocks)
    warpgroup w reads the positions of parity w, kbase + k0, + 2, ... (k0 = (w - kbase) & 1; (K - k0 + 1) // 2 of
    them), its state built from the position (`gemm._ring_state`: stage pos mod stages, phase pos div stages mod 2).
    Every position the producer fills is read by exactly one warpgroup, each warpgroup's in order, the built state
    equals the one a consumer stepping one stage at a time from 0 would hold there, and (the ring being even) every
    stage belongs to one warpgroup across all tiles, odd K-block counts included: each of its parity waits follows
    its own previous read of that stage, one phase back."""
    def stepped(pos):  # PipelineState.advance() pos times from the consumer's start (index 0, phase 0)
        index = phase = 0
        for _ in range(pos):
            index += 1
            if index == stages:
                index, phase = 0, phase ^ 1
        return index, phase

    for ks in ([1], [2], [3, 1, 4], [9, 9], [56, 7, 1, 2], [7, 7, 7, 7]):
        kbase, seen, owner = 0, [], {}
        for k in ks:
            for w in (0, 1):
                k0 = (w - kbase) & 1
                mine = (k - k0 + 1) // 2
                pos = [kbase + k0 + 2 * j for j in range(mine)]
                assert all(p < kbase + k for p in pos)
                for p in pos:
                    assert (p % stages, (p // stages) % 2) == stepped(p)
                    assert owner.setdefault(p % stages, w) == w, (p, w)
                seen += pos
            kbase += k
        assert sorted(seen) == list(range(kbase))


def test_default_only_where_switched_on(monkeypatch):
    """`K_INTERLEAVE_DEFAULT` per family: FP8 on (session 15: 1.10x at M <= 128 on the H200), bf16 off (0.93x at
    64x4096x4096). Switched on, the small-M defaults whose grid gives each CTA at most one tile interleave, the
    others do not (8192^3, the 128x7168 ping-pong 64x128 tile)."""
    import schedules.gemm as G
    from schedules.fp8_gemm import default_fp8_schedule

    assert G.K_INTERLEAVE_DEFAULT == {"bf16": False, "fp8": True}
    shapes = [(64, 4096, 4096), (64, 2112, 7168), (128, 7168, 2048), (8192, 8192, 8192), (1024, 4096, 4096)]
    for m, n, k in shapes:
        assert not G.default_schedule(m, n, k).k_interleave
    assert default_fp8_schedule(64, 2112, 7168).k_interleave  # narrowed to 64x16: 132 tiles
    assert default_fp8_schedule(64, 4096, 7168).k_interleave and default_fp8_schedule(128, 4096, 7168).k_interleave
    assert not default_fp8_schedule(1024, 4096, 4096).k_interleave
    assert not default_fp8_schedule(128, 7168, 16384).k_interleave  # ping-pong 64x128: no room for the partial
    monkeypatch.setitem(G.K_INTERLEAVE_DEFAULT, "bf16", True)
    monkeypatch.setitem(G.K_INTERLEAVE_DEFAULT, "fp8", False)
    G.default_schedule.cache_clear()
    default_fp8_schedule.cache_clear()
    try:
        assert G.default_schedule(64, 4096, 4096).k_interleave  # 64 tiles of 64x64 on 132 SMs
        assert not G.default_schedule(8192, 8192, 8192).k_interleave
        assert not G.default_schedule(128, 7168, 2048).k_interleave  # ping-pong 64x128: no room for the partial
        assert not default_fp8_schedule(64, 2112, 7168).k_interleave
    finally:
        G.default_schedule.cache_clear()
        default_fp8_schedule.cache_clear()


def test_deep_default_ring():
    """`schedules.gemm.deepened`: a 64-row default tile on a grid of one tile a CTA gets the deepest ring that fits
    (64x64 bf16: 12 stages of 16 KiB beside 32 KiB of output buffers; session 15: 1.06x at 64x4096x4096); the
    grids of more than a wave, split-K and 128-row tiles keep the automatic depth."""
    import dataclasses

    from schedules.gemm import GemmSchedule, deepened, default_schedule, on_one_wave

    d = deepened(GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2), 64, 4096)
    assert (d.tile_m, d.tile_n, d.stages) == (64, 64, 12) and d.fits(2, 2)
    assert not dataclasses.replace(d, stages=13).fits(2, 2) and not d.fits(2, 4)  # fp32 out: `_gemm_cuda` falls back
    assert on_one_wave(d, 64, 4096)
    # the default there since session 16: narrowed to 64x32 (`schedules.gemm.narrowed`), 16 stages of 12 KiB
    d = default_schedule(64, 4096, 4096)
    assert (d.tile_m, d.tile_n, d.stages) == (64, 32, 16) and d.fits(2, 2) and on_one_wave(d, 64, 4096)
    assert default_schedule(64, 8192, 8192).tile_n == 64  # 64x32 would be 256 tiles: more than a wave
    for m, n, k in [(8192, 8192, 8192), (4096, 2112, 7168), (128, 7168, 2048), (4096, 4096, 4096)]:
        s = default_schedule(m, n, k)
        assert s.stages == 0 or s.split_k > 1, s


def test_interleaved_rings_are_even():
    """Under `k_interleave` each stage must be read by one warpgroup (a parity wait can pass on the previous fill when
    the stage alternates between two unordered warpgroups): odd counts are refused by name, and the automatic depth
    and the deep rings (bf16 and FP8) come out even, while the other schedules keep odd depths."""
    import dataclasses

    from schedules.fp8_gemm import deep_fp8, fp8_schedule, fp8_stages, smem_bytes
    from schedules.gemm import SMEM_BYTES, deepest_ring

    with pytest.raises(ValueError, match="k_interleave needs an even number of stages"):
        GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, stages=11, k_interleave=True)
    with pytest.raises(ValueError, match="even number of stages"):
        fp8_schedule("pingpong", 64, 32, cluster_m=1, stages=15, k_interleave=True)
    ki = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, k_interleave=True)
    assert [ki.ring_stages(f) for f in (1, 2, 3, 5, 7, 8, 9, 15)] == [2, 2, 2, 4, 6, 8, 8, 8]
    assert [ki.ring_stages(f, cap=16) for f in (11, 15, 16, 17)] == [10, 14, 16, 16]
    plain = dataclasses.replace(ki, k_interleave=False)
    assert [plain.ring_stages(f) for f in (3, 5, 7, 9)] == [3, 5, 7, 8]
    for tn in (16, 32, 64):
        s = fp8_schedule("pingpong", 64, tn, cluster_m=1, k_interleave=True)
        assert fp8_stages(s) % 2 == 0
        deep = deep_fp8(s)
        assert deep.stages % 2 == 0 and smem_bytes(deep) <= SMEM_BYTES
        # the next even depth does not fit: the deepest even ring, not one short of an odd one
        assert deep.stages == 16 or smem_bytes(dataclasses.replace(deep, stages=deep.stages + 2)) > SMEM_BYTES
        odd = deepest_ring(dataclasses.replace(s, k_interleave=False), s.stages,
                           lambda c: smem_bytes(c) <= SMEM_BYTES)
        assert odd.stages >= deep.stages  # without k_interleave any depth that fits
    bf = deepest_ring(ki, 8, lambda c: c.fits(2, 2))
    assert bf.stages % 2 == 0 and bf.fits(2, 2)


@pytest.mark.parametrize("tile_n", [16, 32, 64])
def test_fp8_deep_ring_compiles(tile_n, tmp_path):
    """`schedules.fp8_gemm.deep_fp8` on the interleaved small-M FP8 tiles (16 / 14 / 10 stages, even): the catalogue takes
    the depth, the kernel's shared memory is what `smem_bytes` counts (within the SM's), no spills."""
    from schedules.fp8_gemm import deep_fp8, fp8_schedule, smem_bytes
    from schedules.gemm import SMEM_BYTES

    deep = deep_fp8(fp8_schedule("pingpong", 64, tile_n, cluster_m=1, k_interleave=True))
    assert deep.stages == {16: 16, 32: 14, 64: 10}[tile_n] and smem_bytes(deep) <= SMEM_BYTES
    report, _ = _compile("fp8_gemm", {"tile_n": tile_n, "cluster_m": 1, "k_interleave": True, "stages": deep.stages},
                         tmp_path)
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
