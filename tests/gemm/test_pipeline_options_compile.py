"""CPU: the bf16 GEMM's pipeline options (docs/kernels/gemm.md, "How it got here": the pipeline options) compile for
sm_90a and are what they claim in SASS, with the default's K loop.

* `wg_epilogue`: cooperative, each consumer warpgroup stores its own 64 rows of the tile: 128-thread
  named barriers (ids 1 + warpgroup) instead of the 256-thread barrier 1, (64, 32) sub-tiles in two
  sets of `epi_stages` buffers (the same bytes), the accumulator stored through a one-warpgroup
  MMA's C partition (register for register the warpgroup's part of the two-warpgroup partition:
  `tests/gemm/_probe.py`).
* 2x2 clusters: A and B both multicast; the persistent grid holds 32 clusters of 4 on 132 SMs.
* `epi_stages=2` at 128x192: 5 A/B stages instead of 4.
* the kernel's shared storage is exactly `GemmSchedule.smem_bytes`, and every schedule the op or the
  bench launches passes the catalogue's check.
"""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.gemm import params_for, schedule_of
from schedules.gemm import (
    SMEM_BYTES,
    GemmSchedule,
    candidates,
    default_schedule,
    estimate,
    grid,
    pipeline_variants,
)
from tests.helpers import assert_within_registers, sass_or_skip

SPEC = catalog.get("gemm")
CONFIGS = {
    "default": {},
    "wg_epilogue": {"wg_epilogue": True},
    "c2x2": {"cluster_n": 2},
    "c2x2_wg_epilogue": {"cluster_n": 2, "wg_epilogue": True},
    "w192": {"tile_n": 192},
    "w192_e2": {"tile_n": 192, "epi_stages": 2},
    "w192_wg_epilogue": {"tile_n": 192, "wg_epilogue": True},
    "pp64x128_c2x2": {"schedule": "pingpong", "tile_m": 64, "tile_n": 128, "cluster_n": 2},
    # QuACK's default sm90 tile: 192 accumulators a thread under the consumers' 232 registers (R215)
    "pp128x192": {"schedule": "pingpong", "tile_m": 128, "tile_n": 192},
}
STAGES = {"default": 4, "wg_epilogue": 4, "c2x2": 4, "c2x2_wg_epilogue": 4, "w192": 4, "w192_e2": 5,
          "w192_wg_epilogue": 4, "pp64x128_c2x2": 8, "pp128x192": 4}
CONSUMER_REGS = 232
SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (4096, 14336, 4096), (4096, 4096, 14336),
          (4096, 2112, 7168), (4096, 24576, 1536), (4096, 7168, 16384), (16384, 8192, 1024), (128, 7168, 2048),
          (64, 4096, 4096), (769, 2112, 1032), (1, 96, 16), (5125, 96, 7)]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
            for name, over in CONFIGS.items()}


def _sass(artifacts, name):
    return sass_or_skip(*artifacts[name])


def _sched(name):
    return schedule_of(SPEC.resolve(CONFIGS[name]))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_census(artifacts, name):
    report, _ = artifacts[name]
    assert not report.spills, report.format()
    assert report.ptx_census["ld/st.local"] == 0
    sass = _sass(artifacts, name)
    assert_within_registers(report, sass, CONSUMER_REGS)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stage_ring_and_epilogue(artifacts, name):
    s = _sched(name)
    assert s.num_stages(2, 2) == STAGES[name]
    ptx = artifacts[name][1]["ptx"].read_text()
    assert len(re.findall(r"mbarrier\.init\.shared\.b64", ptx)) == 2 * STAGES[name]  # full + empty per stage
    sass = _sass(artifacts, name)
    assert re.search(rf"UISETP\.NE\.U32\.AND UP0, UPT, UR\d+, {hex(STAGES[name])}, UPT", sass)  # the ring wraps
    # the TMA store pipeline: a buffer is reused once at most epi_stages - 1 stores are in flight
    assert set(re.findall(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", sass)) == {hex(s.epi_stages - 1), "0x0"}
    # one TMA store per sub-tile a storing group writes: its rows of the tile (cooperative: split over
    # the groups; ping-pong: the whole tile) in epi_tile pieces
    rows = s.tile_m // (s.consumer_wgs // s.store_wgs) if s.kind == "cooperative" else s.tile_m
    subs = rows // s.epi_tile[0] * (s.tile_n // s.epi_tile[1])
    assert artifacts[name][0].sass_census["UTMASTG (TMA store)"] == subs
    bars = re.findall(r"BAR\.SYNC\.DEFER_BLOCKING (\w+), (0x[0-9a-f]+) ;", sass)
    if s.kind == "pingpong":  # the mainloop turn: named barrier 3 + warpgroup over both warpgroups
        assert [n for _, n in bars].count("0x100") == 1
        bars = [b for b in bars if b[1] != "0x100"]
    assert len(bars) == 2 * subs  # two per sub-tile: buffer written, store issued
    if s.store_wgs == 1:  # per-warpgroup barriers: id 1 + warpgroup (a register), 128 threads
        assert {n for _, n in bars} == {"0x80"}
    else:
        assert set(bars) == {("0x1", "0x100")}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_storage_is_the_smem_accounting(name):
    """The kernel's Storage struct (mbarriers padded to 1 KiB, A and B stages, the epilogue buffers,
    each 1024-aligned) is exactly `smem_bytes`, which the catalogue checks against 227 KiB."""
    from cute_kernels.jit import compile_fn
    from cute_kernels.target import current_arch

    p = SPEC.resolve(CONFIGS[name])
    fn, args = SPEC.build(p)
    compile_fn(fn, args, current_arch())
    s = schedule_of(p)
    assert fn.storage.size_in_bytes() == s.smem_bytes(2, 2) <= SMEM_BYTES


def test_multicast(artifacts):
    loads = {name: sorted(re.findall(r"UTMALDG\.3D(\.MULTICAST)?", _sass(artifacts, name)))
             for name in ("default", "c2x2", "c2x2_wg_epilogue", "pp64x128_c2x2")}
    assert loads["default"] == ["", ".MULTICAST"]  # 2x1: A local, B multicast
    assert loads["c2x2"] == loads["c2x2_wg_epilogue"] == loads["pp64x128_c2x2"] == [".MULTICAST", ".MULTICAST"]


def _k_loop(sass):
    """Opcodes of the consumer's steady K-loop block: from the label before the full-barrier wait
    that precedes `WARPGROUP.DEPBAR.LE gsb0, 0x1` to the back-edge branch after it."""
    lines = sass.splitlines()
    dep = next(i for i, ln in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln)
    start = max(i for i in range(dep) if re.match(r"^\.L_x_\d+:", lines[i].strip())
                and "TRYWAIT" in lines[i + 1] + lines[i + 2] + lines[i + 3] + lines[i + 4] + lines[i + 5]
                + lines[i + 6] + lines[i + 7] + lines[i + 8])
    end = next(i for i in range(dep, len(lines)) if re.search(r"\bBRA\b", lines[i]))
    ops = []
    for ln in lines[start:end + 1]:
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][\w.]*)", ln)
        if m:
            ops.append(m.group(2))
    return ops


@pytest.mark.parametrize("name", ["wg_epilogue", "c2x2", "c2x2_wg_epilogue", "w192_e2", "w192_wg_epilogue"])
def test_k_loop_is_the_defaults(artifacts, name):
    """The options change the epilogue, the smem ring or the multicast, not the K loop: 4 HGMMAs of
    the tile's width, one stage wait, one wait for <= 1 WGMMA group, one release arrive."""
    ops = _k_loop(_sass(artifacts, name))
    tile_n = _sched(name).tile_n
    assert [op for op in ops if op.startswith("HGMMA")] == [f"HGMMA.64x{tile_n}x16.F32.BF16"] * 4
    assert ops.count("WARPGROUP.ARRIVE") == 1 and ops.count("WARPGROUP.DEPBAR.LE") == 1
    assert sum(op.startswith("SYNCS.ARRIVE") for op in ops) == 1
    assert sum(op.startswith("SYNCS.PHASECHK") for op in ops) == 1
    base = _k_loop(_sass(artifacts, "w192" if tile_n == 192 else "default"))
    assert sorted(op for op in ops if op.startswith(("HGMMA", "WARPGROUP", "SYNCS", "BAR"))) == sorted(
        op for op in base if op.startswith(("HGMMA", "WARPGROUP", "SYNCS", "BAR")))
    assert abs(len(ops) - len(base)) <= 4, (len(ops), len(base))


@pytest.mark.parametrize("tile_n,a_mn", [(256, False), (192, False), (128, True)])
def test_wg_epilogue_register_layout(tile_n, a_mn):
    """A thread of consumer warpgroup w holds, register for register, the (row + 64 w, column) of the
    one-warpgroup MMA's C partition for thread t % 128: storing through that partition writes the
    warpgroup's 64 rows with the default's values."""
    import cutlass.cute as cute

    from cute_kernels.jit import compile_fn  # noqa: F401  (sets up the DSL target)
    from tests.gemm import _probe as probe

    cute.compile(probe.probe, tile_n, a_mn)
    for t, shape2, shape1, c2, c1 in probe.OUT[(tile_n, a_mn)]:
        assert shape2 == shape1 and len(c2) == tile_n // 2
        assert c2 == [(r + 64 * (t // 128), c) for r, c in c1], f"thread {t}"


def test_schedules_and_catalogue():
    we = GemmSchedule(wg_epilogue=True)
    assert we.epi_tile == (64, 32) and we.epi_buffers == 8 and we.epi_bytes(2) == GemmSchedule().epi_bytes(2)
    assert str(we) == "cooperative_128x256x64_c2x1_s0_we_r8_p" and str(GemmSchedule()) == (
        "cooperative_128x256x64_c2x1_s0_r8_p")  # the default's name is unchanged
    assert GemmSchedule(tile_n=192, epi_stages=2).num_stages(2, 2) == 5
    assert GemmSchedule(tile_n=192, epi_stages=3).num_stages(2, 2) == 5
    assert GemmSchedule(epi_stages=2).num_stages(2, 2) == 4  # 128x256: 48 KiB stages, no 5th fits
    for bad in ({"kind": "pingpong", "tile_n": 128}, {"split_k": 2}, {"tile_m": 256, "tile_n": 128}):
        with pytest.raises(ValueError, match="wg_epilogue"):
            GemmSchedule(wg_epilogue=True, **bad)
    with pytest.raises(ValueError, match="5 stages \\+ 4 epilogue buffers need"):
        SPEC.resolve({"stages": 5})
    assert SPEC.resolve({"stages": 5, "tile_n": 192, "epi_stages": 2})["stages"] == 5
    assert SPEC.resolve()["epi_stages"] == 4 and SPEC.resolve()["wg_epilogue"] is False


def test_clusters_of_four_fit_the_gpcs():
    """132 SMs hold 32 clusters of 4 (GPCs of 16-18 SMs), not 33: the grid and the wave model use 32,
    which at the power-of-two shapes is no loss (2048 tiles of 128x256 at 8192^3: 16 rounds either
    way)."""
    c22 = GemmSchedule(cluster_n=2)
    assert grid(64, 32, 1, c22, 132) == (2, 2, 32) and grid(64, 32, 1, GemmSchedule(), 132) == (2, 1, 66)
    assert estimate(c22, 8192, 8192, 8192) == estimate(GemmSchedule(), 8192, 8192, 8192)
    assert estimate(c22, 4096, 4096, 4096) == estimate(GemmSchedule(), 4096, 4096, 4096)
    # the ops' one entry point (bf16, FP8, grouped): grid's count, 4-CTA clusters capped by the
    # occupancy query (no GPU here: its GPC-bound fallback)
    from schedules.gemm import launch_clusters

    assert launch_clusters(64, 32, 1, c22, 132) == 32 and launch_clusters(64, 32, 1, GemmSchedule(), 132) == 66
    assert launch_clusters(2, 2, 1, c22, 132) == 1


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_launched_schedules_pass_the_catalogue(m, n, k):
    """Every schedule the op (default), the bench (its option columns) or the schedule search
    (candidates) launches is a valid catalogue config with the same schedule back."""
    d = default_schedule(m, n, k)
    variants = pipeline_variants(d, m, n)
    cs = candidates(m, n, k)
    assert cs[0] == d and len(cs) <= 32 and len(set(cs)) == len(cs)
    assert all(v in cs for v in variants.values())
    for s in [d, *variants.values(), *cs]:
        p = SPEC.resolve(params_for(s))
        SPEC.check(p)
        assert schedule_of(p) == s
    if m >= 1024 and n >= 4096:  # the short-K shapes default to ping-pong (no wg_epilogue there)
        even = -(-m // d.tile_m) % 2 == 0 and -(-n // d.tile_n) % 2 == 0  # 2x2 clusters need even tile counts
        want = {"c2x2", "wg_epilogue", "c2x2 wg_epilogue"} if d.kind == "cooperative" else {"c2x2"} if even else set()
        assert want <= set(variants)
    # ping-pong 128x192 (`_TILE_EFF`, session 14) where it won on the H200: the square 8192^3, the short-K shapes
    # (ping-pong hides the epilogue: `_COOP_EPILOGUE_K`, session 8) and 4096x2112x7168 (11 tiles of 192 columns)
    if (m, n, k) in ((8192, 8192, 8192), (16384, 8192, 1024), (4096, 24576, 1536), (4096, 2112, 7168)):
        assert d.kind == "pingpong" and (d.tile_m, d.tile_n) == (128, 192)
    if (m, n, k) == (4096, 2112, 7168):
        assert set(variants) == {"5 stages"}  # 11 N tiles: no 2x2; ping-pong: no wg_epilogue


@pytest.mark.parametrize("over", [{}, {"schedule": "pingpong", "tile_n": 192, "bias": True, "activation": "silu"},
                                  {"schedule": "pingpong", "tile_m": 64, "tile_n": 128, "split_k": 3,
                                   "split_fixup": True}], ids=["coop", "pp128x192_bias_silu", "pp64x128_fixup"])
def test_fp32_output(tmp_path, over):
    """An fp32 output (session 14): stmatrix moves 16-bit elements only, so the accumulator goes to the
    epilogue's smem buffers by plain 64-bit stores (WGMMA's accumulator pairs), then the same TMA stores;
    the smem accounting counts 4-byte outputs (ping-pong 128x192 keeps 4 A/B stages: 230400 B)."""
    from cute_kernels.jit import compile_fn
    from cute_kernels.target import current_arch

    p = SPEC.resolve({"out_dtype": "fp32", **over})
    report, files = compile_with_artifacts(SPEC, p, str(tmp_path))
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    sass = sass_or_skip(report, files)
    assert "STSM" not in sass and "STS.64" in sass and "UTMASTG" in sass
    fn, args = SPEC.build(p)
    compile_fn(fn, args, current_arch())
    s = schedule_of(p)
    storage = getattr(fn, "__self__", fn).storage  # the split-K builds are methods of the kernel object
    assert storage.size_in_bytes() == s.smem_bytes(2, 4) <= SMEM_BYTES
