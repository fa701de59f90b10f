"""CPU: the FP8 GEMM's `sb_smem` option and wide tiles (128x192, 128x160, ping-pong 64x192 / 64x160) compile for
sm_90a and
do what they claim in SASS.

* sb_smem: the tile's B-scale rows are copied into shared memory during the first K-block (LDG
  before its wait, STS + the two warpgroups' named barrier after its QGMMAs); the K loop has no
  LDG, reads sb with an LDS before the stage wait and sa right after it, so every sa * sb FMUL
  takes shared-loaded inputs issued before the K-block's first QGMMA.
* wide tiles: 4 QGMMA.64x192x32 (64x160x32) per K-block, one FFMA per accumulator element (96 / 80),
  the B-scale block chosen per column class with one FSEL per row and offset-dependent class, no
  spills, registers under the consumers' 232.
* the column-class thresholds agree with (n0 % 128 + column) // 128 for every offset and column.
* default_fp8_schedule adds the wide tiles to its search from M = WIDE_MIN_M only (measured there).
"""

import math
import re

import pytest

from collectives.block_scales import BLOCK, second_block_threshold, spans_two_blocks, wide_tile
from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.fp8_gemm import (
    DEFAULT_FP8_TILES,
    FP8_TILES,
    WIDE_FP8_TILES,
    WIDE_MIN_M,
    acc_per_thread,
    default_fp8_schedule,
    fp8_schedule,
    overlap_error,
    sb_smem_error,
)
from tests.helpers import assert_within_registers, sass_instructions, sass_or_skip

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "default": {},
    "sb_smem": {"sb_smem": True},
    "sb_smem_overlap": {"sb_smem": True, "promote_overlap": True},
    "sb_smem_contiguous": {"sb_smem": True, "grouping": "contiguous", "cluster_m": 1, "cluster_n": 2},
    "sb_smem_masked": {"sb_smem": True, "grouping": "masked"},
    "wide192": {"tile_n": 192},
    "wide192_sb_smem": {"tile_n": 192, "sb_smem": True},
    "wide160": {"tile_n": 160},
    # ping-pong 64-row tiles of the same widths: each warpgroup promotes its own tile while the other's WGMMAs run
    "pingpong_wide192": {"schedule": "pingpong", "tile_m": 64, "tile_n": 192},
    "pingpong_wide160": {"schedule": "pingpong", "tile_m": 64, "tile_n": 160},
}
CONSUMER_REGS = 232


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
            for name, over in CONFIGS.items()}


def _blocks(ops):
    """K-block segments: (first QGMMA index, index of the DEPBAR that waits for its group)."""
    segs, start = [], None
    for i, (op, args) in enumerate(ops):
        if op.startswith("QGMMA") and "!UPT" in args:  # scale-d = 0: a K-block's first QGMMA
            start = i
        if op == "WARPGROUP.DEPBAR.LE" and start is not None:
            segs.append((start, i))
            start = None
    return segs


def _sass_ops(artifacts, name):
    return sass_instructions(sass_or_skip(*artifacts[name]))


def _acc(name):
    p = SPEC.resolve(CONFIGS[name])
    return acc_per_thread(fp8_schedule(p["schedule"], p["tile_m"], p["tile_n"]))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_census(artifacts, name):
    report, files = artifacts[name]
    assert not report.spills, report.format()
    assert report.ptx_census["ld/st.local"] == 0
    ptx = files["ptx"].read_text()
    tile_n = SPEC.resolve(CONFIGS[name])["tile_n"]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_n}k32\.f32\.e4m3\.e4m3", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{CONSUMER_REGS};", ptx)
    sass = sass_or_skip(report, files)
    assert_within_registers(report, sass, CONSUMER_REGS)


@pytest.mark.parametrize("name", [n for n in CONFIGS if "overlap" not in n])
def test_qgmma_and_ffma_per_k_block(artifacts, name):
    """4 QGMMAs (K = 128 = 4 x 32) per K-block of the tile's width, then one FFMA per accumulator
    element before the next K-block."""
    ops = _sass_ops(artifacts, name)
    tile_n = SPEC.resolve(CONFIGS[name])["tile_n"]
    segs = _blocks(ops)
    assert len(segs) == (2 if "sb_smem" in name else 1)  # sb_smem peels K-block 0
    for a, b in segs:
        q = [op for op, _ in ops[a:b] if op.startswith("QGMMA")]
        assert q == [f"QGMMA.64x{tile_n}x32.F32.E4M3.E4M3"] * 4, q
        ffma = 0
        for op, _ in ops[b + 1:]:
            if op.startswith("QGMMA") or op == "EXIT" or op.startswith("STSM"):
                break
            ffma += op == "FFMA"
        assert ffma == _acc(name), f"{ffma} FFMAs after a K-block, expected {_acc(name)}"


@pytest.mark.parametrize("name", ["sb_smem", "wide192_sb_smem", "sb_smem_contiguous", "sb_smem_masked"])
def test_sb_smem_k_loop(artifacts, name):
    """Staging in K-block 0 (LDG before its QGMMAs, STS + BAR.SYNC after them, LDS after the
    barrier); the K loop (from block 0's DEPBAR to the loop block's) has no LDG, and every sa * sb
    FMUL of the loop block comes after its first QGMMA with all its LDS issued before that QGMMA."""
    ops = _sass_ops(artifacts, name)
    (a0, b0), (a1, b1) = _blocks(ops)
    head = ops[:a0]
    assert any(op.startswith("LDG") for op, _ in head[-60:]), "the B-scale row's loads before K-block 0"
    first = [op for op, _ in ops[a0:b0 + 1]]
    sts = [i for i, op in enumerate(first) if op == "STS"]
    bar = [i for i, op in enumerate(first) if op == "BAR.SYNC.DEFER_BLOCKING"]
    last_q = max(i for i, op in enumerate(first) if op.startswith("QGMMA"))
    assert sts and bar and last_q < min(sts) and max(sts) < bar[0], first
    loop = ops[b0:b1 + 1]
    assert not [op for op, _ in loop if op.startswith("LDG")], "an LDG in the K loop"
    q1 = a1 - b0  # the loop block's first QGMMA, in loop coordinates
    lds = [i for i, (op, _) in enumerate(loop) if op.startswith("LDS")]
    fmul = [i for i, (op, _) in enumerate(loop) if op == "FMUL"]
    assert len(lds) >= 3 and max(lds) < q1, "sb and sa LDS issued before the K-block's first QGMMA"
    assert fmul and min(fmul) > q1, "an FMUL gating the K-block's first QGMMA"


def test_default_reads_sb_from_global_in_the_loop(artifacts):
    """The contrast: option off, the K loop's sb is an LDG at the top of the K-block."""
    ops = _sass_ops(artifacts, "default")
    (a, _), = _blocks(ops)
    back = [op for op, _ in ops[max(0, a - 80):a]]
    assert any(op.startswith("LDG") for op in back)


@pytest.mark.parametrize("name,sel", [("wide192", 2), ("wide160", 6)])
def test_wide_column_classes(artifacts, name, sel):
    """One FSEL per row slot (2) and offset-dependent column class (192: cols 64-127; 160: 3)."""
    ops = _sass_ops(artifacts, name)
    (a, b), = _blocks(ops)
    body = [op for op, _ in ops[a - 60:b + 1 + 2 * _acc(name)]]
    assert body.count("FSEL") == sel
    assert body.count("FMUL") == 4  # 2 rows x 2 blocks


@pytest.mark.parametrize("tile_n", [160, 192, 96, 144])
def test_thresholds_match_blocks(tile_n):
    """For every offset o = n0 % 128 a tile can start at and every column c (and each thread's
    columns: c + 0..7 within an 8-group), 'in the second block' == (o + c) // 128 == 1."""
    assert wide_tile(tile_n) and spans_two_blocks(tile_n)
    g = math.gcd(tile_n, BLOCK)
    starts = {(t * tile_n) % BLOCK for t in range(BLOCK)}
    assert starts == set(range(0, BLOCK, g))
    for o in starts:
        for c in range(tile_n):
            blk = (o + c) // BLOCK
            assert blk in (0, 1)
            for c0 in range(c - c % 8, c - c % 8 + 8):  # thread 0's column of the same group
                assert (o >= second_block_threshold(c0, tile_n)) == (blk == 1), (o, c, c0)
    assert not spans_two_blocks(176) and not spans_two_blocks(224)


def test_schedules_and_errors():
    assert FP8_TILES == DEFAULT_FP8_TILES + WIDE_FP8_TILES
    assert fp8_schedule("cooperative", 128, 192).stages == 4
    assert fp8_schedule("cooperative", 128, 160).stages == 5
    shapes = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (200, 320)]
    for m in (1, 64, 128, 769, 1023):  # below WIDE_MIN_M: the 64/128-column tiles only (or the narrowed
        for n, k in shapes:  # 32 / 16 of a 64x64 tile on a grid below a wave: `_narrowed`)
            assert default_fp8_schedule(m, n, k).tile_n in (16, 32, 64, 128)
            assert default_fp8_schedule(m, n, k, wide=True).tile_n in (16, 32, 64, 128, 160, 192)
    # from WIDE_MIN_M the wide tiles join (the M = 4096 measurement: a wide tile at five of six shapes)
    picks = [default_fp8_schedule(4096, n, k).tile_n for n, k in shapes[:6]]
    assert sum(t in (160, 192) for t in picks) == 5, picks
    assert default_fp8_schedule(4096, 4096, 7168).tile_n == 128
    assert default_fp8_schedule(4096, 2112, 7168, wide=False).tile_n in (64, 128)
    assert default_fp8_schedule(WIDE_MIN_M, 7168, 16384) == default_fp8_schedule(WIDE_MIN_M, 7168, 16384, wide=True)
    assert fp8_schedule("pingpong", 64, 192).tile_n == 192  # a warpgroup's 64 rows, as the cooperative 128-row tile
    with pytest.raises(ValueError, match="cooperative 128-row tile and the ping-pong 64-row tile"):
        fp8_schedule("cooperative", 256, 192)
    with pytest.raises(ValueError, match="tile_n must divide"):
        fp8_schedule("cooperative", 128, 176)
    err = overlap_error(fp8_schedule("cooperative", 128, 192))
    assert "promote_overlap=True cannot be combined with tile_n=192" in err
    with pytest.raises(ValueError, match="promote_overlap=True cannot be combined with tile_n=192"):
        SPEC.check(SPEC.resolve({"tile_n": 192, "promote_overlap": True}))
    assert "sb_smem=True needs schedule='cooperative'" in sb_smem_error(fp8_schedule("pingpong", 64, 128))
    with pytest.raises(ValueError, match="sb_smem=True needs schedule='cooperative'"):
        SPEC.check(SPEC.resolve({"schedule": "pingpong", "tile_m": 64, "sb_smem": True}))
    assert sb_smem_error(fp8_schedule()) is None and sb_smem_error(fp8_schedule("cooperative", 128, 192)) is None
    assert SPEC.resolve()["sb_smem"] is False and SPEC.resolve()["tile_n"] == 128
