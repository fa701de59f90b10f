"""Shared-memory tile layouts that keep column-wise accesses free of bank conflicts (lesson 9).

Shared memory has 32 banks of 4 bytes; a warp's access is served in one pass only if its lanes hit
distinct banks (or the same word). A row-major tile whose rows are 128 bytes puts every row's chunk
`j` in the same 4 banks, so reading one 16-byte chunk from each of 8 consecutive rows (a column
walk, what a transpose does) is an 8-way conflict. Two cures, both used by `cute_kernels.transpose.kernels` and
meant for the GEMM and the bank-conflict study tool:

- `padded_tile`: rows `cols + pad` elements apart; a 16-byte pad shifts each row by 4 banks.
- `swizzled_tile`: the CuTe `Swizzle<3, 4, 3>` (on byte addresses) composed with the row-major tile:
  the 16-byte chunk index of an element is XORed with its row mod 8, so 8 consecutive rows' chunk
  `j` land in 8 distinct bank groups with no wasted bytes. For 128-byte rows this is exactly TMA's
  128-byte swizzle mode, so the same tile can be filled and drained by TMA.

Allocate tiles with `allocate_tile`: it puts a swizzle on the shared-memory pointer, where it acts on
byte addresses (as TMA, WGMMA and the GEMM's tiles expect). Passing the composed layout itself to
`SmemAllocator.allocate_tensor` makes the swizzle act on element offsets instead: for 2- and 4-byte
elements that is a different permutation (bits 5-7 or 6-8 of the byte address), which neither
matches TMA's 128-byte mode nor removes the conflicts.

The functions build layouts and must be called while tracing (inside `@cute.jit`/`@cute.kernel`).
`chunk_elems` is the number of elements in 16 bytes.
"""

from __future__ import annotations

import cutlass.cute as cute

BANKS = 32
BANK_BYTES = 4


def chunk_elems(dtype) -> int:
    return 128 // dtype.width


def padded_tile(rows: int, cols: int, pad: int):
    """(rows, cols) row-major with a row stride of `cols + pad` elements."""
    return cute.make_layout((rows, cols), stride=(cols + pad, 1))


def padded_tile_elems(rows: int, cols: int, pad: int) -> int:
    return rows * (cols + pad)


def swizzle_128b():
    """The 128-byte swizzle of TMA and WGMMA: XOR the 16-byte chunk index (address bits 4-6) with
    the 128-byte row index mod 8 (bits 7-9). A swizzle composed with a shared-memory tile acts on the
    byte address in the DSL (as `make_smem_layout_atom(K_SW128, dtype)` shows: `S<3,4,3>` for every
    element width), so it is the same functor for every dtype."""
    return cute.make_swizzle(3, 4, 3)


def swizzled_tile(rows: int, cols: int, dtype):
    """(rows, cols) row-major, rows of exactly 128 bytes, under `swizzle_128b` (rows % 8 == 0)."""
    assert cols * dtype.width == 1024 and rows % 8 == 0, "swizzled_tile: rows must be 128 bytes, rows % 8 == 0"
    return cute.make_composed_layout(swizzle_128b(), 0, cute.make_layout((rows, cols), stride=(cols, 1)))


def allocate_tile(smem, dtype, layout, byte_alignment: int = 1024):
    """A tile of `layout` (from `padded_tile` or `swizzled_tile`) from `smem` (a `SmemAllocator`); a
    swizzle goes on the pointer, so it acts on byte addresses (see the module docstring)."""
    if isinstance(layout, cute.ComposedLayout):
        return smem.allocate_tensor(dtype, layout.outer, byte_alignment=byte_alignment, swizzle=layout.inner)
    return smem.allocate_tensor(dtype, layout, byte_alignment=byte_alignment)


def allocate_tiles(smem, dtype, layout, count: int, byte_alignment: int = 1024):
    """`count` tiles of a swizzled `layout` (`swizzled_tile`) back to back, as one (rows, cols, count)
    tensor: tile c is `t[None, None, c]` for a runtime c too (pipeline stages). A tile is a whole number
    of 1 KiB swizzle periods, so the swizzle on the pointer treats every tile alike."""
    inner = layout.outer
    rows, cols = inner.shape
    assert rows * cols * dtype.width % (1024 * 8) == 0, "allocate_tiles: a tile must be a multiple of 1 KiB"
    staged = cute.make_layout((rows, cols, count), stride=(*inner.stride, rows * cols))
    return smem.allocate_tensor(dtype, staged, byte_alignment=byte_alignment, swizzle=layout.inner)


def bank_of(byte_offset: int) -> int:
    """Host-side helper for studies: the bank a byte offset falls in."""
    return (byte_offset // BANK_BYTES) % BANKS
