"""CPU: SiLU / SwiGLU compile for sm_90a with 128-bit global accesses where aligned, sigmoid by the hardware
reciprocal for 16-bit outputs, and no local memory."""

import pytest

from tests.helpers import case_id, compile_and_check_census

CASES = [
    ("swiglu.silu_fwd", {}), ("swiglu.silu_bwd", {}), ("swiglu.swiglu_fwd", {}), ("swiglu.swiglu_bwd", {}),
    ("swiglu.swiglu_bwd", {"dtype": "fp32"}), ("swiglu.swiglu_fwd", {"aligned": False}),
    ("swiglu.swiglu_fwd", {"strided": True}), ("swiglu.swiglu_bwd", {"strided": True}),
    ("swiglu.swiglu_fwd", {"strided": True, "aligned": False}), ("swiglu.swiglu_fwd", {"strided": True, "index64": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_census(case, tmp_path):
    compile_and_check_census(case, tmp_path)
