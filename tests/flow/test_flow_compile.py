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
    """Accurate functions without local memory: `collectives.trig.sincos` (its reduction in fp64, no sin.approx /
    cos.approx, no Payne-Hanek table) and libdevice's expf (its ex2.approx after an exact range reduction, as
    torch's expf)."""
    spec = catalog.get("flow.timestep_embedding")
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    ptx = files["ptx"].read_text()
    assert "sin.approx" not in ptx and "cos.approx" not in ptx and "cvt.f64.f32" in ptx
    assert not report.spills and "ld.local" not in ptx, report.format()
    assert report.kernels[0].registers <= 64


def test_sincos_algorithm():
    """`collectives.trig.sincos` replayed in numpy with the kernel's roundings (fp64 reduction, fp32 polynomials):
    within 2 ulps of the correctly rounded sin / cos (plus 2^-26 absolute near zeros) over the arguments a time
    embedding meets."""
    import math

    import numpy as np

    from collectives import trig

    f32 = np.float32
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-4, 4, 4000), rng.uniform(-1e5, 1e5, 4000), np.float32(np.pi) * np.arange(-40, 40),
                         [0.0, 1e-30, -1e-8, 0.5, 1000.0, 1.6e6]]).astype(f32)
    for x in xs:
        x64 = float(x)
        k = math.floor(x64 * trig.TWO_OVER_PI + 0.5)
        r = f32((x64 - k * trig.PIO2_HI) - k * trig.PIO2_LO)
        z = f32(r * r)
        s = f32(f32(f32(f32(f32(f32(f32(trig.S[0]) * z) + f32(trig.S[1])) * z) + f32(trig.S[2])) * z) * r) + r
        c = f32(f32(f32(f32(f32(f32(f32(f32(trig.C[0]) * z) + f32(trig.C[1])) * z) + f32(trig.C[2])) * z) * z)
                - f32(f32(0.5) * z)) + f32(1.0)
        q = k & 3
        sin_x, cos_x = [(s, c), (c, -s), (-s, -c), (-c, s)][q]
        for got, want in ((sin_x, math.sin(x64)), (cos_x, math.cos(x64))):
            ulp = float(np.spacing(f32(abs(want))))
            assert abs(float(got) - want) <= 2 * ulp + 2.0**-26, (x, got, want)
