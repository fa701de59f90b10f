"""CPU: ArgMax compiles for sm_90a with 128-bit loads where aligned, the row heads of unaligned rows, shuffles in
the row reduction, and no local memory."""

import pytest

from tests.helpers import case_id, compile_and_check_census

CASES = [
    ("argmax.rows", {}), ("argmax.rows", {"threads_per_row": 4, "dtype": "fp32"}), ("argmax.rows", {"keys_out": True}),
    ("argmax.rows", {"dtype": "key", "aligned": False, "threads_per_row": 32}),
    # rows not 16-byte aligned (odd lengths): a scalar head per row, then 128-bit vectors
    ("argmax.rows", {"aligned": False, "row_head": True}),
    ("argmax.rows", {"aligned": False, "row_head": True, "keys_out": True, "dtype": "fp16", "index64": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_census(case, tmp_path):
    compile_and_check_census(case, tmp_path)
