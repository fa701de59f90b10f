"""CPU: SiLU / SwiGLU compile for sm_90a with 128-bit global accesses where aligned, sigmoid by the hardware
reciprocal for 16-bit outputs, and no local memory."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import check_census

CASES = [
    ("swiglu.silu_fwd", {}), ("swiglu.silu_bwd", {}), ("swiglu.swiglu_fwd", {}), ("swiglu.swiglu_bwd", {}),
    ("swiglu.swiglu_bwd", {"dtype": "fp32"}), ("swiglu.swiglu_fwd", {"aligned": False}),
]


def _id(case):
    name, over = case
    return name + "".join(f",{k}={v}" for k, v in over.items())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_census(case, tmp_path):
    name, over = case
    spec = catalog.get(name)
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    check_census(name, over, report, files)
