"""CPU: `perf.ncu_pcs.summarize` reads an ncu source page (SASS, CSV) whatever its sample columns are
called, ranks instructions by samples, and totals each stall column."""

from perf.ncu_pcs import summarize

CSV = '''"Kernel Name","kernel_cutlass_x"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_barrier","stall_long_sb"
"0x100","LDG.E.128 R4, desc[UR4][R2.64]","10","8","0","8"
"0x110","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ","40","5","0","0"
"0x120","BAR.SYNC.DEFER_BLOCKING 0x2, 0x100","300","300","290","0"
"0x130","FMUL R5, R5, R6","1,200","20","0","0"
'''


def test_ranks_by_samples_and_totals_stall_columns():
    out = summarize(CSV, top=2, context=1)
    lines = out.splitlines()
    assert lines[0].startswith("4 SASS instructions, 1550 samples")
    assert any("stall_barrier: 290 (18.7 %)" in line for line in lines)
    tops = [line for line in lines if line.startswith(">>")]
    assert "FMUL" in tops[0] and "BAR.SYNC" in tops[1]
    assert "stall_barrier=290" in tops[1]
    neighbours = [line for line in lines if line.startswith("   ") and "HGMMA" in line]
    assert neighbours  # the instruction before the barrier, shown for context


def test_missing_header_is_reported():
    assert "no source-page header" in summarize("a,b\n1,2\n")
