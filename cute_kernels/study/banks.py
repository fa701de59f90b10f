"""Shared-memory banks: where each element of a tile lands, and how many conflicts a warp meets.

The model (Hopper, and every NVIDIA GPU since Maxwell):

- Shared memory has 32 banks, each 4 bytes wide; byte address `a` is in bank `(a // 4) % 32`.
- A warp's shared-memory instruction is served in *phases* of at most 128 bytes: 4-byte (or
  narrower) accesses serve all 32 threads in one phase; 8-byte accesses one half-warp (16 threads)
  per phase; 16-byte accesses one quarter-warp (8 threads) per phase. `ldmatrix`/`stmatrix` .x4
  move four 8x8 matrices of 16-byte rows; each matrix is one phase: the 8 row addresses given by
  threads 8j..8j+7 for matrix j.
- Within a phase, threads that touch the *same* 4-byte word are served together (broadcast); a
  bank that must deliver k *distinct* words makes the phase take k wavefronts. A k-way conflict
  is a phase whose busiest bank holds k distinct words; conflict-free means one wavefront per
  phase.
- WGMMA reads its shared-memory operands itself (no thread addresses); its unit is the core
  matrix, 8 rows of 16 contiguous bytes. The exact order in which the tensor core fetches core
  matrices is not documented; we model one core matrix per phase. A layout whose core matrices
  spread their 8 rows over 8 different 16-byte bank groups is conflict-free under any order, which
  is what the swizzled atoms guarantee.

A tile here is ROWS x COLS elements whose contiguous dimension is COLS (row-major; for an MN-major
WGMMA operand the rows are K and the columns M or N). Its element offsets come from a CuTe layout
(row-major, padded or any `Layout`) evaluated by the DSL; a swizzle `S<B,M,S>` then acts on the
*byte* address, as it does on the DSL's swizzled shared-memory pointers (and in TMA's
hardware swizzle): bits [M, M+B) are XORed with bits [M+S, M+S+B).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from cute_kernels.study.layout import Layout, check_swizzle, evaluate, in_dsl

BANKS = 32
BANK_BYTES = 4
PHASE_BYTES = BANKS * BANK_BYTES

DTYPE_BYTES = {"fp8": 1, "e4m3": 1, "e5m2": 1, "int8": 1, "bf16": 2, "fp16": 2, "f16": 2, "fp32": 4,
               "f32": 4, "tf32": 4, "int32": 4, "fp64": 8, "f64": 8}

# the swizzles the SMEM atoms use, named by the width of the row they permute (in bytes)
SWIZZLES = {"SW32": (1, 4, 3), "SW64": (2, 4, 3), "SW128": (3, 4, 3)}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}") from None


def bank(byte_addr: int) -> int:
    return (byte_addr // BANK_BYTES) % BANKS


# ----------------------------------------------------------------------------------------------
# tiles

@dataclass(frozen=True)
class SmemTile:
    """A ROWS x COLS tile of `esize`-byte elements in shared memory.

    `layout` maps (row, col) to an element offset; `swizzle` (B, M, S) acts on byte addresses.
    `addr` holds the byte address of every element, computed once by the DSL.
    """

    name: str
    rows: int
    cols: int
    esize: int
    layout: Layout
    swizzle: tuple[int, int, int] | None = None
    addr: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    def byte_addr(self, r: int, c: int) -> int:
        return self.addr[r][c]

    def bank(self, r: int, c: int) -> int:
        return bank(self.addr[r][c])


def _byte_addresses(layout: Layout, swizzle, esize: int, rows: int, cols: int):
    """Byte address of each (row, col): the swizzle composed with the layout scaled to bytes,
    evaluated by the DSL."""
    def scale(t):
        return tuple(scale(x) for x in t) if isinstance(t, tuple) else t * esize

    byte_layout = Layout(layout.shape, scale(layout.stride), swizzle, 0)
    offs = evaluate(byte_layout)
    return tuple(tuple(offs[r + rows * c] for c in range(cols)) for r in range(rows))


def make_tile(rows: int, cols: int, esize: int, *, pad: int = 0, swizzle=None, name: str | None = None,
              layout: Layout | None = None) -> SmemTile:
    """A row-major tile (row stride `cols + pad` elements), optionally swizzled; or any (row, col)
    `layout` of that shape."""
    if rows <= 0 or cols <= 0:
        raise ValueError(f"tile must be at least 1x1, got {rows}x{cols}")
    if esize not in (1, 2, 4, 8):
        raise ValueError(f"esize must be 1, 2, 4 or 8 bytes, got {esize}")
    if layout is None:
        layout = Layout((rows, cols), (cols + pad, 1))
    elif layout.size != rows * cols:
        raise ValueError(f"layout {layout} has {layout.size} elements, tile is {rows}x{cols}")
    if swizzle is not None:
        b, m, s = swizzle
        check_swizzle(b, m, s)
        if (1 << m) < esize:
            raise ValueError(f"swizzle S<{b},{m},{s}> moves units of {1 << m} bytes, smaller than one element")
    if name is None:
        name = "no swizzle" if swizzle is None and not pad else (f"pad +{pad * esize}B" if pad else
                                                                  f"S<{swizzle[0]},{swizzle[1]},{swizzle[2]}>")
    addr = _byte_addresses(layout, swizzle, esize, rows, cols)
    return SmemTile(name, rows, cols, esize, layout, swizzle, addr)


# ----------------------------------------------------------------------------------------------
# warp access patterns: each returns phases; a phase is a list of (thread, row, col, nbytes)

Access = tuple[int, int, int, int]


def _phases(accesses: list[Access], width: int) -> list[list[Access]]:
    per = max(1, PHASE_BYTES // max(width, BANK_BYTES))
    return [accesses[i:i + per] for i in range(0, len(accesses), per)]


def row_read(tile: SmemTile, row: int = 0, vec_bytes: int = 4) -> list[list[Access]]:
    """32 threads read consecutive `vec_bytes` chunks of the tile in row order, from `row` on."""
    vec = max(vec_bytes, tile.esize)
    per = vec // tile.esize
    acc = []
    for t in range(32):
        e = row * tile.cols + t * per
        r, c = divmod(e, tile.cols)
        acc.append((t, r % tile.rows, c, vec))
    return _phases(acc, vec)


def col_read(tile: SmemTile, col: int = 0) -> list[list[Access]]:
    """Thread t reads one element of column `col`, row t (wrapping to the next column after the
    last row)."""
    acc = [(t, t % tile.rows, (col + t // tile.rows) % tile.cols, tile.esize) for t in range(32)]
    return _phases(acc, tile.esize)


def _matrix_rows(tile: SmemTile, row0: int, col0: int, matrices: list[tuple[int, int]]):
    """Phases of 8 rows x 16 bytes, one per (row block, 16-byte column chunk) in `matrices`."""
    per = 16 // tile.esize
    phases = []
    for j, (rb, cb) in enumerate(matrices):
        phase = []
        for i in range(8):
            r = (row0 + 8 * rb + i) % tile.rows
            c = (col0 + cb * per) % tile.cols
            phase.append((8 * j + i, r, c, 16))
        phases.append(phase)
    return phases


def ldmatrix(tile: SmemTile, row0: int = 0, col0: int = 0) -> list[list[Access]]:
    """ldmatrix .x4 of a 16 x (32 bytes) block: matrices (rows 0-7, chunk 0), (rows 8-15, chunk 0),
    (rows 0-7, chunk 1), (rows 8-15, chunk 1), the order of an MMA A fragment."""
    return _matrix_rows(tile, row0, col0, [(0, 0), (1, 0), (0, 1), (1, 1)])


def stmatrix(tile: SmemTile, row0: int = 0, col0: int = 0) -> list[list[Access]]:
    """stmatrix .x4: the same four 8x16-byte matrices as ldmatrix, stored (epilogue to SMEM)."""
    return ldmatrix(tile, row0, col0)


def wgmma_k(tile: SmemTile) -> list[list[Access]]:
    """A K-major WGMMA operand, one k-block (32 bytes of K: 16 bf16, 32 fp8) of 64 rows (M or N):
    core matrices of 8 rows x 16 bytes, 8 row blocks x 2 K chunks."""
    row_blocks = max(1, min(64, tile.rows) // 8)
    chunks = max(1, min(32, tile.cols * tile.esize) // 16)
    return _matrix_rows(tile, 0, 0, [(rb, cb) for cb in range(chunks) for rb in range(row_blocks)])


def wgmma_mn(tile: SmemTile) -> list[list[Access]]:
    """An MN-major WGMMA operand (rows = K, columns = M or N contiguous), one k-block: 32 bytes of
    K worth of rows, 64 elements of M/N: core matrices of 8 K-rows x 16 bytes of M/N."""
    k_rows = max(8, 32 // tile.esize)
    row_blocks = max(1, min(k_rows, tile.rows) // 8)
    chunks = max(1, min(64 * tile.esize, tile.cols * tile.esize) // 16)
    return _matrix_rows(tile, 0, 0, [(rb, cb) for rb in range(row_blocks) for cb in range(chunks)])


PATTERNS: dict[str, Callable[[SmemTile], list[list[Access]]]] = {
    "row": row_read,
    "col": col_read,
    "ldmatrix": ldmatrix,
    "stmatrix": stmatrix,
    "wgmma-k": wgmma_k,
    "wgmma-mn": wgmma_mn,
}


# ----------------------------------------------------------------------------------------------
# counting

@dataclass(frozen=True)
class Conflicts:
    """The cost of one access pattern on one tile.

    `phases`: phases the instruction needs; `wavefronts`: what they take (>= phases);
    `ways`: the worst phase's busiest bank (distinct words); `per_phase`: wavefronts of each phase.
    """

    pattern: str
    tile: str
    phases: int
    wavefronts: int
    ways: int
    per_phase: tuple[int, ...]

    @property
    def conflict_free(self) -> bool:
        return self.wavefronts == self.phases


def phase_wavefronts(tile: SmemTile, phase: list[Access]) -> int:
    """Distinct 4-byte words per bank in one phase; the busiest bank sets the wavefronts."""
    words: dict[int, set[int]] = {}
    for _t, r, c, nbytes in phase:
        # an access of n bytes covers n / esize consecutive elements of the row; each element is
        # placed by the layout and the swizzle on its own (a swizzle of units smaller than the
        # access splits it)
        for k in range(max(1, nbytes // tile.esize)):
            a = tile.byte_addr(r, (c + k) % tile.cols)
            for w in range(a // BANK_BYTES, (a + tile.esize - 1) // BANK_BYTES + 1):
                words.setdefault(w % BANKS, set()).add(w)
    return max((len(s) for s in words.values()), default=0)


def count(tile: SmemTile, pattern: str) -> Conflicts:
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    phases = PATTERNS[pattern](tile)
    per = tuple(phase_wavefronts(tile, p) for p in phases)
    return Conflicts(pattern, tile.name, len(phases), sum(per), max(per), per)


def comparison_tiles(rows: int, cols: int, esize: int, extra_swizzle=None) -> list[SmemTile]:
    """The variants compared side by side: none, padding by 4 and by 16 bytes, SW32/64/128, and
    the swizzle asked for if it is not one of those."""
    tiles = [make_tile(rows, cols, esize)]
    for pad_bytes in (4, 16):
        if pad_bytes >= esize:
            tiles.append(make_tile(rows, cols, esize, pad=pad_bytes // esize))
    for name, sw in SWIZZLES.items():
        tiles.append(make_tile(rows, cols, esize, swizzle=sw, name=f"{name} S<{sw[0]},{sw[1]},{sw[2]}>"))
    if extra_swizzle is not None and tuple(extra_swizzle) not in SWIZZLES.values():
        tiles.append(make_tile(rows, cols, esize, swizzle=tuple(extra_swizzle)))
    return tiles


def format_table(rows: int, cols: int, esize: int, extra_swizzle=None, patterns=None) -> str:
    """Wavefronts per pattern for each tile variant ('1x' = conflict-free)."""
    patterns = list(patterns or PATTERNS)
    tiles = comparison_tiles(rows, cols, esize, extra_swizzle)
    head = f"{'tile ' + str(rows) + 'x' + str(cols):<22}" + "".join(f"{p:>14}" for p in patterns)
    lines = [head, "-" * len(head)]
    for t in tiles:
        cells = []
        for p in patterns:
            c = count(t, p)
            cells.append(f"{c.wavefronts}/{c.phases} {c.ways}-way" if c.ways > 1 else f"{c.wavefronts}/{c.phases} ok")
        lines.append(f"{t.name:<22}" + "".join(f"{x:>14}" for x in cells))
    lines.append("cells: wavefronts/phases and the worst phase's conflict degree (ok = conflict-free)")
    return "\n".join(lines)


def swizzle_dsl_string(swizzle) -> str:
    """The DSL's own spelling of a swizzle (checks that the DSL accepts it)."""
    import cutlass.cute as cute

    return in_dsl(lambda: str(cute.make_swizzle(*swizzle)))
