"""CPU: `perf.loop_mix.loops` finds each backward branch whose body holds WGMMAs in nvdisasm's text, with its
span, HGMMA count and opcode mix; predicated instructions count by their opcode, loops without HGMMA are left out."""

from perf.loop_mix import loops

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
.L_x_2:
        /*0030*/                   FMUL R5, R5, R6 ;
        /*0040*/              @!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR22+0x28], RZ ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR8].tnspB, R88 ;
        /*0070*/               @P2 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
"""


def test_loops_with_wgmma_and_their_mix():
    total, found = loops(SASS)
    assert total["HGMMA"] == 2 and total["SYNCS"] == 1 and total["BRA"] == 2 and sum(total.values()) == 9
    assert len(found) == 1  # the inner loop (0x30-0x50) holds no HGMMA
    start, end, hgmma, n, mix = found[0]
    assert (start, end, hgmma, n) == (0x10, 0x70, 2, 7)
    assert mix["UIADD3"] == 1 and mix["FMUL"] == 1 and mix["BRA"] == 2
