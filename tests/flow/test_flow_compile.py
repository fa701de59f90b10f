"""CPU: the flow kernels compile for sm_90a with 128-bit global accesses where aligned (the mixed fp32-state /
bf16-velocity update with 64-bit k loads), no local memory in the maps, and the time embedding's accurate sincos
(not the MUFU approximations)."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import case_id

CASES = [
    ("flow.update", {}), ("flow.update", {"terms": 4, "dtype": "fp32", "k_dtype": "fp32"}),
    ("flow.update", {"terms": 2, "cfg": True}), ("flow.update", {"terms": 4, "cfg": True, "dtype": "fp32"}),
    ("flow.update", {"aligned": False, "terms": 3}), ("flow.update", {"index64": True, "terms": 2}),
    ("flow.diffusion_step", {}), ("flow.diffusion_step", {"kind": "ddpm", "noisy": True, "clip": True}),
    ("flow.diffusion_step", {"prediction": "v_prediction", "batched": True, "dtype": "fp32"}),
    ("flow.diffusion_step", {"prediction": "sample", "clip": True, "aligned": False, "batched": True}),
    ("flow.diffusion_step", {"kind": "ddpm", "index64": True, "batched": True, "noisy": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_maps(case, tmp_path):
    name, over = case
    spec = catalog.get(name)
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    ptx = files["ptx"].read_text()
    assert not report.spills and "ld.local" not in ptx, report.format()
    census = report.ptx_census
    if p["aligned"]:
        assert census["st.global.v4 (128-bit)"] > 0
        if name == "flow.update" and p["k_dtype"] != p["dtype"] and "fp32" in (p["dtype"], p["k_dtype"]):
            assert census["ld.global.v4 (128-bit)"] > 0 and "ld.global.v2.b32" in ptx  # 16-bit k: 64-bit loads
        else:
            assert census["ld.global.v4 (128-bit)"] > 0
    else:
        assert census["ld.global.v4 (128-bit)"] == 0


@pytest.mark.parametrize("over", [{}, {"flip": True, "out_dtype": "bf16"}])
def test_timestep_embedding(over, tmp_path):
    """Accurate functions: libdevice's sincos (no sin.approx / cos.approx) and expf (its ex2.approx after an exact
    range reduction, as torch's expf); the only local memory is sincos's reduction table for huge arguments, which
    the catalogue entry names."""
    spec = catalog.get("flow.timestep_embedding")
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    ptx = files["ptx"].read_text()
    assert "sin.approx" not in ptx and "cos.approx" not in ptx
    assert report.kernels[0].registers <= 64
    if report.spills:
        assert spec.local_memory_note(p)
