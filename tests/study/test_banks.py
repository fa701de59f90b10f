"""CPU: the shared-memory bank model against cases worked out by hand.

Banks: 32 x 4 bytes; a phase's cost is the largest number of distinct 4-byte words one bank must
deliver (same word = broadcast). Expected values are derived in the comments.
"""

import pytest

from cute_kernels.study import atoms, banks
from cute_kernels.study.banks import count, make_tile, phase_wavefronts


def test_fp32_32x32_column_read_is_32_way():
    # thread t reads (t, 0): byte 128*t -> bank 0 for every thread, 32 distinct words
    c = count(make_tile(32, 32, 4), "col")
    assert (c.phases, c.wavefronts, c.ways) == (1, 32, 32)


def test_padding_to_33_columns_is_conflict_free():
    # row stride 33 words: thread t's word 33t lands in bank t
    c = count(make_tile(32, 32, 4, pad=1), "col")
    assert c.conflict_free and c.wavefronts == 1


def test_128_byte_swizzle_makes_ldmatrix_conflict_free_on_bf16_rows_of_64():
    # rows of 128 B: without swizzle the 8 rows of a matrix all start in bank 0 -> 8-way per phase
    plain = count(make_tile(64, 64, 2), "ldmatrix")
    assert (plain.phases, plain.wavefronts, plain.ways) == (4, 32, 8)
    # SW128 (S<3,4,3> on bytes): row r's chunk c moves to c ^ (r % 8): 8 rows, 8 distinct chunks
    sw = count(make_tile(64, 64, 2, swizzle=(3, 4, 3)), "ldmatrix")
    assert sw.conflict_free and (sw.phases, sw.wavefronts) == (4, 4)


def test_smaller_swizzles_leave_conflicts():
    # SW64 XORs 2 bits (row % 4): 8 rows share 4 chunks -> 2-way; SW32 1 bit -> 4-way
    assert count(make_tile(64, 64, 2, swizzle=(2, 4, 3)), "ldmatrix").ways == 2
    assert count(make_tile(64, 64, 2, swizzle=(1, 4, 3)), "ldmatrix").ways == 4


def test_padding_for_16_byte_rows():
    # +16 B: row r starts at bank 4r (mod 32): 8 rows -> 8 disjoint groups of 4 banks
    assert count(make_tile(64, 64, 2, pad=8), "ldmatrix").conflict_free
    # +4 B: row r starts at bank r, its 16 bytes cover banks r..r+3 -> bank 3 holds rows 0..3: 4-way
    assert count(make_tile(64, 64, 2, pad=2), "ldmatrix").ways == 4


def test_row_reads_are_conflict_free_and_wide_accesses_split_into_phases():
    assert count(make_tile(32, 32, 4), "row").conflict_free
    # bf16: each thread reads one 4-byte word (2 elements) -> 32 words, 1 phase
    assert count(make_tile(8, 64, 2), "row").phases == 1
    # fp64: 8-byte accesses, 16 threads per phase -> 2 phases, each 128 contiguous bytes
    c = count(make_tile(8, 32, 8), "row")
    assert (c.phases, c.wavefronts) == (2, 2)


def test_bf16_column_read_shares_words_by_broadcast():
    # 16 rows: threads 0..15 read col 0, threads 16..31 col 1 -> same word as col 0 (broadcast)
    # rows of 128 B all in bank 0: 16 distinct words -> 16-way
    assert count(make_tile(16, 64, 2), "col").ways == 16


def test_broadcast_is_free():
    t = make_tile(8, 32, 4)
    phase = [(th, 0, 0, 4) for th in range(32)]          # every thread reads the same word
    assert phase_wavefronts(t, phase) == 1
    phase = [(th, th % 2, 0, 4) for th in range(32)]     # two words, both in bank 0
    assert phase_wavefronts(t, phase) == 2


def test_swizzle_acts_on_byte_addresses():
    # as in the PTX the DSL emits for a swizzled smem tensor: bf16 (1,0) -> byte 128 ^ 16 = 144
    t = make_tile(8, 64, 2, swizzle=(3, 4, 3))
    assert t.byte_addr(1, 0) == 144 and t.bank(1, 0) == 4
    assert t.byte_addr(0, 8) == 16 and t.byte_addr(1, 8) == 128
    assert t.byte_addr(7, 63) == 7 * 128 + ((7 ^ 7) << 4) + 14
    # each row is a permutation of the same 8 chunks
    for r in range(8):
        assert sorted(t.byte_addr(r, c) % 128 for c in range(0, 64, 8)) == list(range(0, 128, 16))


def test_stmatrix_same_cost_as_ldmatrix():
    t = make_tile(16, 64, 2)
    assert count(t, "stmatrix").per_phase == count(t, "ldmatrix").per_phase


def test_wgmma_reads_of_the_dsl_atoms_are_conflict_free():
    # the DSL's atoms keep each core matrix (8 rows x 16 B) in 8 distinct bank groups
    for kind in ("K_SW32", "K_SW64", "K_SW128", "K_INTER"):
        tile = atoms.as_tile(atoms.smem_atom(kind, "bf16"), "bf16")
        assert count(tile, "wgmma-k").conflict_free, kind
    for kind in ("MN_SW64", "MN_SW128"):
        tile = atoms.as_tile(atoms.smem_atom(kind, "bf16"), "bf16")
        assert tile.rows == 8                    # drawn as (K, MN): MN contiguous
        assert count(tile, "wgmma-mn").conflict_free, kind


def test_wgmma_k_without_swizzle_is_8_way():
    # 64 rows x 64 bf16 (128-B rows) plain: a core matrix's 8 rows start in bank 0 -> 8-way
    c = count(make_tile(64, 64, 2), "wgmma-k")
    assert c.phases == 16 and c.ways == 8


def test_comparison_table():
    text = banks.format_table(32, 32, 4, patterns=["col", "ldmatrix"])
    lines = {line.split()[0]: line for line in text.splitlines()[2:-1]}
    assert "32/1 32-way" in lines["no"]
    assert "1/1 ok" in text.splitlines()[3]          # pad +4B: conflict-free column read


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="pattern"):
        count(make_tile(8, 8, 4), "diagonal")
    with pytest.raises(ValueError, match="dtype"):
        banks.dtype_bytes("fp7")
    with pytest.raises(ValueError, match="tile"):
        make_tile(0, 8, 2)
    with pytest.raises(ValueError, match="swizzle"):
        make_tile(8, 8, 8, swizzle=(3, 2, 3))
