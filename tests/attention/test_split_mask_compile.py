"""CPU: the masked / unmasked loop split (`AttentionSchedule.split_mask`) and FA4's row-sum order
(`sum_from_corr`), read from the SASS (docs/kernels/attention.md, "How it got here":
"The loop").

* `mask_split` gives exactly `block_needs_mask`'s blocks as runs (checked block by block on Python
  ints over tiles, lengths, windows): the unmasked loop may skip the mask only if this holds.
* split_mask compiles at every mask kind without spills (consumer registers < 240), the WGMMAs not
  serialized; one steady region (from `DEPBAR.LE gsb0, 0x1` to the next mbarrier wait) per loop, each
  with the block's 66 MUFU.EX2 (D = 128, tile_n = 128; a left-bounded window: three loops at D <= 128,
  two above, where ptxas serialized the WGMMAs of three; D = 256 does not fit: serialized with two); the interior loop has no mask code (~380
  instructions per block, the default's 527) and its wait for P_j V_j comes after the first row's max,
  not before the max as in the default.
* sum_from_corr: the instructions after the block's last MUFU.EX2 shrink from 74 (corr's ex2 and the
  64 FMULs of the O rescale last) to at most 24 (8-21 measured).
"""

import re

import pytest

from collectives.attention_mask import MaskKind, block_needs_mask, mask_split, n_block_range
from cute_kernels import catalog
from schedules.attention import default_schedule
from tests.attention.test_wgmma_waits_sass import _steady_regions as steady_regions
from tests.helpers import compiled_sass

MUFU_PER_BLOCK = 2 * (128 // 4) + 2  # D = 128, tile_n = 128: two rows x 32 columns + two rescale factors


def test_mask_split_is_exact():
    cases = 0
    for tm, tn in [(128, 128), (64, 80), (128, 96), (64, 176)]:
        for sq in (1, 5, 77, 128, 129, 300, 1000):
            for sk in (1, 50, 128, 257, 1000):
                for left, right in [(-1, -1), (-1, 0), (64, 32), (200, -1), (0, 0), (5, -1), (-1, 300), (1000, 7),
                                    (-1, -200)]:
                    kind = MaskKind(left >= 0, right >= 0)
                    for m in range(-(-sq // tm)):
                        n_min, n_max = n_block_range(m, tm, tn, sq, sk, left, right, kind)
                        lo, hi = mask_split(n_min, n_max, m, tm, tn, sq, sk, left, right, kind)
                        assert n_min <= lo <= hi <= max(n_min, n_max)
                        for n in range(n_min, n_max):
                            cases += 1
                            need = block_needs_mask(n, m, tm, tn, sq, sk, left, right, kind)
                            assert need == (n < lo or n >= hi), (tm, tn, sq, sk, left, right, m, n, lo, hi)
    assert cases > 5000


VARIANTS = {
    "one_loop": {"head_dim": 128, "split_mask": False},  # the default until the split measured faster
    "split": {"head_dim": 128, "split_mask": True},
    "split_sum": {"head_dim": 128, "split_mask": True, "sum_from_corr": True},
    "sum": {"head_dim": 128, "sum_from_corr": True, "split_mask": False},
    "split_causal": {"head_dim": 128, "mask": "causal", "split_mask": True},
    "split_band": {"head_dim": 128, "mask": "band", "split_mask": True, "sum_from_corr": True},
    "split_d64_causal_varlen": {"head_dim": 64, "mask": "causal", "varlen": True, "split_mask": True},
    "split_d96_window_softcap_fp16": {"head_dim": 96, "mask": "window", "softcap": True, "dtype": "fp16",
                                      "split_mask": True, "pingpong": False},
    "split_d192_band": {"head_dim": 192, "mask": "band", "split_mask": True, "sum_from_corr": True},
    "sum_d256_causal": {"head_dim": 256, "mask": "causal", "sum_from_corr": True},
    # D = 256 with 64-key blocks (176 accumulators, the split's limit): two loop bodies without serialized
    # WGMMAs (6 ARRIVE for 60 HGMMA; at tile_n 80 every HGMMA had its own), FA4's d > 128 order (no ping-pong)
    "split_d256_n64_causal_nopp": {"head_dim": 256, "tile_n": 64, "mask": "causal", "split_mask": True,
                                   "pingpong": False},
    # three consumers at 160 registers: the split overlap keeps its WGMMAs asynchronous at 64-key blocks
    # (at 80-96 ptxas serialized most of them)
    "split_m192_n64_causal": {"head_dim": 64, "tile_m": 192, "tile_n": 64, "mask": "causal", "split_mask": True},
    "sum_no_overlap_lazy": {"head_dim": 128, "lazy_rescale": True, "sum_from_corr": True},
    "sum_double_p": {"head_dim": 128, "double_p": True, "sum_from_corr": True},
    # the default's split walk inside the persistent tile loop (session 22)
    "split_persistent": {"head_dim": 128, "split_mask": True, "persistent": True},
    "split_causal_persistent": {"head_dim": 128, "mask": "causal", "split_mask": True, "persistent": True},
}


def _steady_regions(ins):
    """Each stretch from a wait for 'all but one WGMMA group' to the next mbarrier wait (one per loop), as opcodes."""
    return [[op for op, _ in region] for region in steady_regions(ins)]


def _loops(p):
    """split_mask's loops: key end / right edge, interior, and a left-edge run at D <= 128 (above, ptxas
    serialized every WGMMA with three loops: the left run shares the interior's loop and branch)."""
    return 3 if p["mask"] in ("window", "band") and p["head_dim"] <= 128 else 2


@pytest.fixture(scope="module", params=list(VARIANTS))
def compiled(request, tmp_path_factory):
    return (request.param, *compiled_sass("flash_attn", VARIANTS[request.param], tmp_path_factory.mktemp("fa_split")))


def test_resolves():
    spec = catalog.get("flash_attn")
    # D = 256: ptxas serialized the WGMMAs of the split: one loop by default there (the split elsewhere), and an
    # explicit split is refused with the reason
    assert spec.resolve({"head_dim": 256})["split_mask"] is False
    with pytest.raises(ValueError, match="does not fit head_dim 256"):
        spec.resolve({"split_mask": True, "head_dim": 256})
    assert spec.resolve({})["split_mask"] is True and spec.resolve({"head_dim": 192})["split_mask"] is True
    for off in ({"overlap": False}, {"schedule": "fa2"}, {"lazy_rescale": True}, {"double_p": True}):
        assert spec.resolve(off)["split_mask"] is False  # the default follows the schedule
        with pytest.raises(ValueError, match="split_mask"):
            spec.resolve({"split_mask": True, **off})
    assert spec.resolve({"sum_from_corr": True, "schedule": "fa2"})["sum_from_corr"] is True


def test_compiles_clean(compiled):
    name, p, report, ins = compiled
    hgmma = sum(1 for op, _ in ins if op.startswith("HGMMA"))
    arrive = sum(1 for op, _ in ins if op == "WARPGROUP.ARRIVE")
    assert hgmma > 0 and arrive < hgmma / 2, (name, hgmma, arrive)  # not serialized (C7514)
    assert report.sass_census["LDL/STL (spills)"] == 0 and not report.spills, report.format()
    top = max(int(r) for _, args in ins for r in re.findall(r"\bR(\d+)\b", args))
    assert top < 240, (name, top)
    # GEMM sites: the first S, one S + P V per loop, the last P V
    per_block = p["head_dim"] // 16 + (p["tile_n"] or default_schedule(p["head_dim"]).tile_n) // 16
    loops = _loops(p) if p["split_mask"] else 1 if p["overlap"] else 0
    if p["double_p"]:
        loops = 2
    assert report.ptx_census["wgmma.mma_async"] == per_block * (1 + loops), (name, report.ptx_census)


def test_where_the_block_waits(compiled):
    name, p, report, ins = compiled
    if p["head_dim"] != 128 or p["lazy_rescale"]:
        pytest.skip("the exponential count is for D = 128, tile_n = 128, with the overlap")
    regions = _steady_regions(ins)
    loops = _loops(p) if p["split_mask"] else 1
    if p["double_p"]:
        loops = 2
    assert len(regions) == loops, (name, [len(r) for r in regions])
    for reg in regions:
        assert reg.count("MUFU.EX2") == MUFU_PER_BLOCK, (name, reg.count("MUFU.EX2"))
        mufu = [i for i, op in enumerate(reg) if op == "MUFU.EX2"]
        tail = len(reg) - 1 - mufu[-1]
        if p["sum_from_corr"]:
            assert tail <= (32 if p["double_p"] else 24), (name, tail)  # corr on the sum's chain: its ex2 and the O rescale no longer last
        elif not p["double_p"]:
            assert tail >= 60, (name, tail)  # the 64 FMULs of the O rescale after the last exponential
    if p["split_mask"]:
        # the interior loop: no mask code (the default's block is ~527 instructions), the wait for
        # P_j V_j after the first row's max (the default: before it, right after the mask branch)
        interior = min(regions, key=len)
        assert len(interior) < 400, (name, [len(r) for r in regions])
        wait = interior.index("WARPGROUP.DEPBAR.LE")
        assert interior[:wait].count("FMNMX") >= 32, (name, interior[:wait].count("FMNMX"))
    if name == "one_loop":
        wait = regions[0].index("WARPGROUP.DEPBAR.LE")
        assert regions[0][:wait].count("FMNMX") < 32 and "MUFU.EX2" not in regions[0][:wait]

