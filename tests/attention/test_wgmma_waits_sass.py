"""CPU: where the consumers wait for their WGMMAs, read from the SASS (docs/kernels/attention.md,
"How it got here": "The loop").

* No schedule makes ptxas serialize the WGMMAs (C7514/C7512: one WARPGROUP.ARRIVE and one
  WARPGROUP.DEPBAR per HGMMA, the tensor cores idle between them). The first draft of `double_p` did,
  silently: it read O after a `wait_group(1)` that retired a group of the previous iteration.
* The default overlap: ptxas hoists the `wait_group(0)` for P_j V_j (program order: after the softmax of
  S_{j+1}) above every exponential of the block, so the softmax runs after P_j V_j, not under it.
  This describes ptxas's schedule, the reason `double_p` exists; if it changes, update the doc.
* `double_p`: from the wait for S_{j+1} (`DEPBAR.LE gsb0, 0x1`) to the block's last exponential
  there is no other WGMMA wait; all 66 of them lie in that stretch (D = 128, tile_n = 128).
* `double_p` fits every head dim: no spills, consumers' registers < 240 (32 more for the second P).
* The 192-row overlap at D = 64 (three consumers, 160 registers), split and not: no spills, WGMMAs grouped.
"""

import re

import pytest

from tests.helpers import compiled_sass

VARIANTS = {
    "one_loop": {"head_dim": 128, "split_mask": False},  # the overlap's walk in one loop (default until 8301b88)
    "no_overlap": {"head_dim": 128, "overlap": False},
    "dp128": {"head_dim": 128, "double_p": True},
    "dp64": {"head_dim": 64, "double_p": True},
    "dp96": {"head_dim": 96, "double_p": True},
    "dp192": {"head_dim": 192, "double_p": True},
    "dp256": {"head_dim": 256, "mask": "causal", "double_p": True},
    # three consumers at 160 registers: the overlap fits once P's conversion is pinned (`pinned_p`);
    # unpinned it spilled 256-336 B and serialized every WGMMA
    "ov192": {"head_dim": 64, "tile_m": 192, "overlap": True, "mask": "causal"},
    "ov192_one_loop": {"head_dim": 64, "tile_m": 192, "overlap": True, "split_mask": False},
    # persistent (session 22): the tile walk wraps each role's loops; the WGMMAs must stay grouped inside it
    "persistent": {"head_dim": 128, "persistent": True},
    "persistent_dp256": {"head_dim": 256, "mask": "causal", "double_p": True, "persistent": True},
    "skip_dp256": {"head_dim": 256, "double_p": True, "skip_rescale": True},
    "skip_split128": {"head_dim": 128, "mask": "causal", "skip_rescale": True},
    "dynamic_dp256": {"head_dim": 256, "mask": "causal", "double_p": True, "persistent": True, "dynamic": True,
                      "l2_groups": True},
}
MUFU_PER_BLOCK = 2 * (128 // 4) + 2  # two rows x 32 columns per thread, + the two rescale factors


@pytest.fixture(scope="module", params=list(VARIANTS))
def compiled(request, tmp_path_factory):
    return (request.param, *compiled_sass("flash_attn", VARIANTS[request.param], tmp_path_factory.mktemp("fa_waits")))


def _steady_regions(ins):
    """Each stretch from a wait for 'all but one WGMMA group' to the next mbarrier wait."""
    regions = []
    for i, (op, args) in enumerate(ins):
        if op == "WARPGROUP.DEPBAR.LE" and args.endswith("0x1"):
            j = next(k for k in range(i + 1, len(ins)) if ins[k][0].startswith("SYNCS.PHASECHK"))
            regions.append(ins[i + 1:j])
    return regions


def test_wgmmas_not_serialized(compiled):
    name, p, report, ins = compiled
    hgmma = sum(1 for op, _ in ins if op.startswith("HGMMA"))
    arrive = sum(1 for op, _ in ins if op == "WARPGROUP.ARRIVE")
    assert hgmma > 0 and arrive < hgmma / 2, (name, hgmma, arrive)
    assert report.sass_census["LDL/STL (spills)"] == 0 and not report.spills, report.format()
    top = max(int(r) for _, args in ins for r in re.findall(r"\bR(\d+)\b", args))
    assert top < (160 if p["tile_m"] == 192 else 240), (name, top)


def test_where_the_softmax_waits(compiled):
    name, p, report, ins = compiled
    if p["head_dim"] != 128:
        pytest.skip("the exponential count is for D = 128, tile_n = 128")
    if p["persistent"] or p["split_mask"]:
        pytest.skip("the split walk's waits are checked per loop in test_attention_split_compile")
    regions = _steady_regions(ins)
    if name == "no_overlap":
        assert not regions  # waits for everything (DEPBAR.LE 0) after each GEMM
        return
    assert regions, name
    for reg in regions:
        ops = [op for op, _ in reg]
        mufu = [i for i, op in enumerate(ops) if op == "MUFU.EX2"]
        waits = [i for i, op in enumerate(ops) if op == "WARPGROUP.DEPBAR.LE"]
        assert len(mufu) == MUFU_PER_BLOCK, (name, len(mufu))
        if name == "one_loop":
            # ptxas put the wait for P_j V_j before the first exponential
            assert len(waits) == 1 and waits[0] < mufu[0], (name, waits, mufu[0])
        else:
            # double_p: the whole softmax runs under P_j V_j (the last step's stretch runs on into the
            # tail, whose wait for the last P V follows the exponentials)
            assert all(w > mufu[-1] for w in waits), (name, waits, mufu[-1])
    if name == "dp128":
        assert len(regions) == 2  # the two steps of a pass
