"""CPU: ArgMax compiles for sm_90a with 128-bit loads where aligned, the row heads of unaligned rows, shuffles in
the row reduction, and no local memory."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import check_census

CASES = [
    ("argmax.rows", {}), ("argmax.rows", {"threads_per_row": 4, "dtype": "fp32"}), ("argmax.rows", {"keys_out": True}),
    ("argmax.rows", {"dtype": "key", "aligned": False, "threads_per_row": 32}),
    # rows not 16-byte aligned (odd lengths): a scalar head per row, then 128-bit vectors
    ("argmax.rows", {"aligned": False, "row_head": True}),
    ("argmax.rows", {"aligned": False, "row_head": True, "keys_out": True, "dtype": "fp16", "index64": True}),
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
