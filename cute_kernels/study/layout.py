"""CuTe layouts on the CPU: parse "(4,8):(8,1)", evaluate, and run the layout algebra through the DSL.

The algebra itself is never reimplemented here. Every operation (composition, complement, coalesce,
right_inverse, the divides and the products) runs inside a `@cute.jit` trace of the real DSL
(nvidia-cutlass-dsl 4.8.1). With static shapes and strides the DSL computes layouts, sizes and
offsets as Python ints while it traces, so a trace that stores them in a Python list hands them
back without any GPU (see `in_dsl`). DSL objects never leave the trace (they hold MLIR values whose
context dies with it); what comes back is this module's plain `Layout` record.

Notation, as CuTe prints it: `shape:stride`, tuples nest, a bare int is a rank-1 layout, and
`S<B,M,S> o OFF o shape:stride` is a swizzled (composed) layout. A layout maps a coordinate to an
offset; a 1-D index is turned into a coordinate colexicographically (the leftmost mode varies
fastest), so `(4,8):(8,1)` maps index 5 to coordinate (1,1) and offset 9.

Evaluating `S<B,M,S> o 0 o L` as a function applies the swizzle to L's offsets in L's own units
(elements). On a shared-memory pointer the same swizzle acts on *byte* addresses (checked in the
PTX the DSL emits: element (1,0) of a bf16 `S<3,4,3>` tile is stored at byte 128 ^ 16). `banks.py`
uses the byte meaning; this module keeps the DSL's function meaning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Union

from cute_kernels import target  # noqa: F401  (sets the DSL's arch before cutlass is imported)

IntTuple = Union[int, tuple]


# ----------------------------------------------------------------------------------------------
# the record

def _fmt(t: IntTuple) -> str:
    if isinstance(t, tuple):
        return "(" + ",".join(_fmt(x) for x in t) + ")"
    return str(t)


def _product(t: IntTuple) -> int:
    if isinstance(t, tuple):
        p = 1
        for x in t:
            p *= _product(x)
        return p
    return int(t)


def _flatten(t: IntTuple) -> list[int]:
    if isinstance(t, tuple):
        return [y for x in t for y in _flatten(x)]
    return [int(t)]


def _congruent(a: IntTuple, b: IntTuple) -> bool:
    if isinstance(a, tuple) != isinstance(b, tuple):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_congruent(x, y) for x, y in zip(a, b))
    return True


def check_swizzle(b: int, m: int, s: int) -> None:
    """CuTe's Swizzle<B,M,S> XORs the B bits at [M+|S|, M+|S|+B) into the B bits at [M, M+B): it needs B >= 0,
    M >= 0 and |S| >= B (the two bit ranges apart). The DSL silently makes any other triple S<0,4,3>; refuse it."""
    if b < 0 or m < 0 or abs(s) < b:
        raise ValueError(f"swizzle S<{b},{m},{s}> is not a swizzle: it needs B >= 0, M >= 0 and |S| >= B (B bits at "
                         f"[M+|S|, M+|S|+B) XORed into [M, M+B)); e.g. S<3,4,3>, the 128-byte swizzle of 16-byte units")


@dataclass(frozen=True)
class Layout:
    """A static CuTe layout: nested `shape` and `stride` tuples of ints, optionally swizzled.

    `swizzle` is (B, M, S) for `S<B,M,S> o offset o shape:stride`, None for a plain layout.
    """

    shape: IntTuple
    stride: IntTuple
    swizzle: tuple[int, int, int] | None = None
    offset: int = 0

    def __post_init__(self):
        if not _congruent(self.shape, self.stride):
            raise ValueError(f"shape {_fmt(self.shape)} and stride {_fmt(self.stride)} are not congruent")
        if self.swizzle is not None:
            check_swizzle(*self.swizzle)

    def __str__(self) -> str:
        plain = f"{_fmt(self.shape)}:{_fmt(self.stride)}"
        if self.swizzle is None:
            return plain
        b, m, s = self.swizzle
        return f"S<{b},{m},{s}> o {self.offset} o {plain}"

    @property
    def rank(self) -> int:
        return len(self.shape) if isinstance(self.shape, tuple) else 1

    @property
    def size(self) -> int:
        return _product(self.shape)

    def mode(self, i: int) -> "Layout":
        if not isinstance(self.shape, tuple):
            if i != 0:
                raise IndexError(f"a rank-1 layout has no mode {i}")
            return Layout(self.shape, self.stride)
        return Layout(self.shape[i], self.stride[i])

    @property
    def outer(self) -> "Layout":
        """The layout without its swizzle."""
        return Layout(self.shape, self.stride)

    @property
    def cosize(self) -> int:
        """One past the largest offset of the unswizzled layout (strides >= 0 assumed)."""
        return sum((n - 1) * d for n, d in zip(_flatten(self.shape), _flatten(self.stride))) + 1


# ----------------------------------------------------------------------------------------------
# parsing

_TOKEN = re.compile(r"\s*(\d+|[(),:\[\]])")


def _parse_tuple(text: str) -> IntTuple:
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ValueError(f"cannot parse {text!r}: expected ints, commas and parentheses")
    pos = 0

    def item():
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"cannot parse {text!r}: ends too early")
        tok = tokens[pos]
        if tok == "(":
            pos += 1
            items = [item()]
            while pos < len(tokens) and tokens[pos] == ",":
                pos += 1
                items.append(item())
            if pos >= len(tokens) or tokens[pos] != ")":
                raise ValueError(f"cannot parse {text!r}: expected ')'")
            pos += 1
            return tuple(items)
        if tok.isdigit():
            pos += 1
            return int(tok)
        raise ValueError(f"cannot parse {text!r}: unexpected {tok!r}")

    out = item()
    if pos != len(tokens):
        raise ValueError(f"cannot parse {text!r}: trailing {''.join(tokens[pos:])!r}")
    return out


def compact_left(shape: IntTuple) -> IntTuple:
    """The column-major (LayoutLeft) strides CuTe gives a shape without strides."""
    running = 1

    def go(s):
        nonlocal running
        if isinstance(s, tuple):
            return tuple(go(x) for x in s)
        d = running if s != 1 else 0
        running *= s
        return d

    return go(shape)


_SWIZZLE = re.compile(r"^\s*Sw?<\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*>\s*o\s*(?:(\d+)\s*o\s*)?(.*)$")


def parse(text: str) -> Layout:
    """Parse CuTe notation: "(4,8):(8,1)", "8:1", "((2,2),4):((1,4),8)", "(4,8)" (column-major),
    "S<3,4,3> o 0 o (8,64):(64,1)" (swizzled; "Sw<..>" and a missing offset are accepted)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"layout: expected text like '(4,8):(8,1)', got {text!r}")
    m = _SWIZZLE.match(text)
    if m:
        inner = parse(m.group(5))
        return Layout(inner.shape, inner.stride, (int(m.group(1)), int(m.group(2)), int(m.group(3))),
                      int(m.group(4) or 0))
    if ":" in text:
        shape_text, stride_text = text.split(":", 1)
        shape, stride = _parse_tuple(shape_text), _parse_tuple(stride_text)
    else:
        shape = _parse_tuple(text)
        stride = compact_left(shape)
    if not _congruent(shape, stride):
        raise ValueError(f"layout {text!r}: shape {_fmt(shape)} and stride {_fmt(stride)} are not congruent")
    if any(n <= 0 for n in _flatten(shape)):
        raise ValueError(f"layout {text!r}: every extent must be positive")
    return Layout(shape, stride)


Tiler = Union[Layout, tuple]


def parse_tiler(text: str) -> Tiler:
    """A tiler for the divides and products: a layout ("4:2"), a shape tuple ("(2,4)": one
    stride-1 tile per mode) or a bracketed tuple of layouts ("[2:1,4:2]", one per mode)."""
    text = text.strip()
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError(f"tiler {text!r}: missing ']'")
        parts, depth, cur = [], 0, ""
        for ch in text[1:-1]:
            depth += ch == "("
            depth -= ch == ")"
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        return tuple(parse(p) for p in parts)
    if ":" in text or text.startswith("S"):
        return parse(text)
    shape = _parse_tuple(text)
    return shape if isinstance(shape, tuple) else Layout(shape, 1)


# ----------------------------------------------------------------------------------------------
# the DSL bridge

def in_dsl(fn: Callable[[], Any]) -> Any:
    """Run `fn()` inside a `@cute.jit` trace and return its result.

    `fn` may call any layout function of the DSL; it must return plain Python values (ints,
    tuples, strings, `Layout` records), never DSL objects.
    """
    import cutlass.cute as cute

    box: dict[str, Any] = {}

    @cute.jit
    def _trace():
        box["out"] = fn()

    _trace()
    return box["out"]


def to_dsl(x: Any):
    """Inside a trace: a `Layout` (or tiler tuple, or int) as the DSL object."""
    import cutlass.cute as cute

    if isinstance(x, Layout):
        outer = cute.make_layout(x.shape, stride=x.stride)
        if x.swizzle is None:
            return outer
        return cute.make_composed_layout(cute.make_swizzle(*x.swizzle), x.offset, outer)
    if isinstance(x, tuple):
        return tuple(to_dsl(y) for y in x)
    return x


def _plain(t):
    if isinstance(t, tuple):
        return tuple(_plain(x) for x in t)
    if not isinstance(t, int):
        raise TypeError(f"expected a static int, got {t!r}: the layout is not static")
    return int(t)


def from_dsl(obj) -> Layout:
    """Inside a trace: a static DSL layout (plain or composed) as a `Layout` record."""
    import cutlass.cute as cute

    if isinstance(obj, cute.ComposedLayout):
        inner, outer = obj.inner, obj.outer
        if not isinstance(inner, cute.Swizzle):
            raise TypeError(f"only swizzle o offset o layout compositions are supported, got {obj}")
        return Layout(_plain(outer.shape), _plain(outer.stride),
                      (int(inner.num_bits), int(inner.num_base), int(inner.num_shift)), int(obj.offset))
    return Layout(_plain(obj.shape), _plain(obj.stride))


def _eval_all(dl, n: int) -> list[int]:
    return [int(dl(i)) for i in range(n)]


def evaluate(layout: Layout) -> list[int]:
    """Offsets of the 1-D indices 0..size-1, computed by the DSL (swizzle included)."""
    return in_dsl(lambda: _eval_all(to_dsl(layout), layout.size))


def offset_at(layout: Layout, coord: IntTuple) -> int:
    """The offset of one (nested) coordinate, computed by the DSL."""
    return in_dsl(lambda: int(to_dsl(layout)(coord)))


# ----------------------------------------------------------------------------------------------
# the grid a layout is drawn as

@dataclass(frozen=True)
class Grid:
    """A layout laid out for printing: cell (r, c) holds the offset of coordinate
    (r, c) (rank 2), of c (rank 1: one row), or of (r, c as an index into modes 1..) (rank > 2)."""

    layout: Layout
    rows: int
    cols: int
    values: tuple[tuple[int, ...], ...]


def grid_dims(layout: Layout) -> tuple[int, int]:
    if layout.rank == 1:
        return 1, layout.size
    rows = _product(layout.shape[0])
    return rows, layout.size // rows


def grid(layout: Layout, offsets: list[int] | None = None) -> Grid:
    rows, cols = grid_dims(layout)
    offs = offsets if offsets is not None else evaluate(layout)
    # 1-D index r + rows*c is coordinate (r, c) colexicographically (for rank 1: the cell c).
    values = tuple(tuple(offs[r + rows * c] for c in range(cols)) for r in range(rows))
    return Grid(layout, rows, cols, values)


def format_grid(g: Grid, title: str | None = None) -> str:
    """The grid as text, in the spirit of CuTe's print_layout."""
    width = max(len(str(v)) for row in g.values for v in row)
    width = max(width, len(str(g.cols - 1)), 2)
    lines = [title or str(g.layout)]
    lab = len(str(g.rows - 1)) + 1
    lines.append(" " * (lab + 1) + " ".join(f"{c:>{width}}" for c in range(g.cols)))
    sep = " " * (lab + 1) + "+".join("-" * width for _ in range(g.cols))
    lines.append(sep)
    for r, row in enumerate(g.values):
        lines.append(f"{r:>{lab}}|" + " ".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# thread-value layouts

@dataclass(frozen=True)
class TVGrid:
    """Who owns each element of an M x N tile under a (thread, value) -> tile-index layout.

    `owner[m][n]` is (thread, value), or None where no (thread, value) maps. The tile index is
    column-major over (M, N), as in CuTe's MMA layouts: index = m + M * n.
    """

    layout: Layout
    m: int
    n: int
    threads: int
    values_per_thread: int
    owner: tuple[tuple[tuple[int, int] | None, ...], ...]


def tv_grid(tv: Layout, tile_mn: tuple[int, int], offsets: list[int] | None = None) -> TVGrid:
    if tv.rank != 2:
        raise ValueError(f"a thread-value layout has rank 2 (thread, value), got {tv}")
    M, N = tile_mn
    T = _product(tv.shape[0])
    V = _product(tv.shape[1])
    offs = offsets if offsets is not None else evaluate(tv)
    owner: list[list[tuple[int, int] | None]] = [[None] * N for _ in range(M)]
    for v in range(V):
        for t in range(T):
            idx = offs[t + T * v]
            m, n = idx % M, (idx // M) % N
            if owner[m][n] is None:
                owner[m][n] = (t, v)
    return TVGrid(tv, M, N, T, V, tuple(tuple(r) for r in owner))


# ----------------------------------------------------------------------------------------------
# the algebra, step by step

@dataclass(frozen=True)
class Step:
    """One line of a derivation: a label, the layout it produced, and what it means. `tiles` (the divides): the
    tile of each cell of the layout's grid (`grid`), drawn as one color and one outline a tile; `text`: how the
    step prints when it is not a layout (a by-mode tiler)."""

    label: str
    layout: Layout
    note: str = ""
    tiles: tuple[tuple[int, ...], ...] | None = None
    text: str | None = None

    def __str__(self) -> str:
        return self.text or str(self.layout)


def _result_tiles(layout: Layout, by_mode: bool) -> tuple[tuple[int, ...], ...]:
    """The tile of each cell of a divide's result grid. A by-mode logical_divide gives ((t0, n0), (t1, n1)): row r
    is in-tile coordinate r % size(t0) of tile row r // size(t0), column c likewise; every other divide gives
    (tile, rest...): each column of the grid is one tile."""
    rows, cols = grid_dims(layout)
    if by_mode and isinstance(layout.shape, tuple):
        modes = layout.shape if layout.rank > 1 else (layout.shape[0],)
        t = [_product(m[0]) if isinstance(m, tuple) else 1 for m in modes]
        if layout.rank == 1:
            return (tuple(c // t[0] for c in range(cols)),)
        n0 = rows // t[0]
        return tuple(tuple(r // t[0] + n0 * (c // t[1]) for c in range(cols)) for r in range(rows))
    return tuple(tuple(c for c in range(cols)) for _ in range(rows))


OPS = ("composition", "complement", "coalesce", "right_inverse", "logical_divide", "zipped_divide",
       "tiled_divide", "logical_product", "blocked_product", "raked_product")

_NOTES = {
    "composition": "R(i) = A(B(i)): B picks which of A's indices, A maps them to offsets",
    "complement": "the layout of the offsets A does not reach, ordered, up to the cotarget",
    "coalesce": "same function, fewest modes: adjacent modes merge when stride_i * shape_i == stride_i+1",
    "right_inverse": "A(R(i)) == i for every i of R's domain",
    "logical_divide": "A o (B, complement(B, size A)): mode 0 = one tile (what B selects), mode 1 = the tiles",
    "zipped_divide": "logical_divide per mode, then the tile modes gathered into mode 0, the rest into mode 1",
    "tiled_divide": "zipped_divide with the rest-modes unpacked: (tile, rest_0, rest_1, ...)",
    "logical_product": "(A, complement(A, size A * cosize B) o B): mode 0 = A, mode 1 = B's copies of A",
    "blocked_product": "per mode (A_i, B_i) with A varying fastest: copies of A laid out as blocks",
    "raked_product": "per mode (B_i, A_i) with B varying fastest: copies of A interleaved (raked)",
}


def _tiler_str(t: Tiler) -> str:
    if isinstance(t, Layout):
        return str(t)
    return "<" + ", ".join(str(x) for x in t) + ">"


def algebra(op: str, a: Layout, b: Tiler | int | None = None) -> list[Step]:
    """Run `op` on `a` (and `b`) in the DSL; return the derivation as steps, the result last.

    composition(A, B); complement(A, cotarget=int, default cosize(A)); coalesce(A);
    right_inverse(A); {logical,zipped,tiled}_divide(A, tiler); {logical,blocked,raked}_product(A, B).
    """
    import cutlass.cute as cute

    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if not isinstance(a, Layout):
        raise TypeError(f"A must be a Layout, got {a!r}")
    needs_b = op not in ("complement", "coalesce", "right_inverse")
    if needs_b and b is None:
        raise ValueError(f"{op} needs a second argument B")
    if a.swizzle is not None and op not in ("composition",):
        raise ValueError(f"{op}: A must be a plain layout (no swizzle), got {a}")

    def run() -> list[Step]:
        A = to_dsl(a)
        steps = [Step("A", a)]
        if op == "composition":
            B = to_dsl(b)
            steps.append(Step("B", b if isinstance(b, Layout) else _tuple_as_layout(b)))
            steps.append(Step(f"A o B = composition({a}, {_tiler_str(b)})", from_dsl(cute.composition(A, B)),
                              _NOTES[op]))
        elif op == "complement":
            cot = int(b) if b is not None else a.cosize
            steps.append(Step(f"complement({a}, {cot})", from_dsl(cute.complement(A, cot)), _NOTES[op]))
        elif op == "coalesce":
            steps.append(Step(f"coalesce({a})", from_dsl(cute.coalesce(A)), _NOTES[op]))
        elif op == "right_inverse":
            steps.append(Step(f"right_inverse({a})", from_dsl(cute.right_inverse(A)), _NOTES[op]))
        elif op.endswith("_divide"):
            if not isinstance(b, Layout) and all(isinstance(x, int) for x in b) and len(b) == a.rank:
                # a shape tiler: B's tiles are blocks of A's coordinates, tile (i, j) = coordinates // b
                rows, cols = grid_dims(a)
                if a.rank == 1:
                    tiles = (tuple(c // b[0] for c in range(cols)),)
                else:
                    per = -(-rows // b[0])
                    tiles = tuple(tuple(r // b[0] + per * (c // b[1]) for c in range(cols)) for r in range(rows))
                steps.append(Step("B (tiler)", a, f"a {' x '.join(map(str, b))} tile of A's coordinates, by mode",
                                  tiles, _tiler_str(b)))
            else:
                steps.append(Step("B (tiler)", b if isinstance(b, Layout) else _tuple_as_layout(b)))
            B = to_dsl(b)
            if isinstance(b, Layout):
                comp = cute.complement(B, cute.size(A))
                steps.append(Step(f"B* = complement(B, size(A) = {a.size})", from_dsl(comp),
                                  "the offsets B skips: where the other tiles start"))
                bb = cute.make_layout((B.shape, comp.shape), stride=(B.stride, comp.stride))
                steps.append(Step("(B, B*)", from_dsl(bb), "B's tile, then the tiles"))
            else:
                for i, bi in enumerate(b):
                    ai = cute.get(A, mode=[i])
                    steps.append(Step(f"mode {i}: logical_divide({a.mode(i)}, {bi})",
                                      from_dsl(cute.logical_divide(ai, _as_dsl_layout(bi))), "by-mode: each mode divided alone"))
            ld = from_dsl(cute.logical_divide(A, B))
            by_mode = not isinstance(b, Layout)
            steps.append(Step(f"logical_divide(A, {_tiler_str(b)})", ld, _NOTES["logical_divide"],
                              _result_tiles(ld, by_mode)))
            if op != "logical_divide":
                fn = cute.zipped_divide if op == "zipped_divide" else cute.tiled_divide
                res = from_dsl(fn(A, B))
                steps.append(Step(f"{op}(A, {_tiler_str(b)})", res, _NOTES[op], _result_tiles(res, False)))
        else:  # products: B is a layout (a bare shape tuple is made column-major)
            if isinstance(b, Layout):
                lb = b
            elif all(isinstance(x, (int, tuple)) for x in b):
                lb = Layout(b, compact_left(b))
            else:
                lb = _tuple_as_layout(b)
            steps.append(Step("B", lb))
            B = to_dsl(lb)
            if op == "logical_product":
                cot = a.size * lb.cosize
                comp = cute.complement(A, cot)
                steps.append(Step(f"A* = complement(A, size(A) * cosize(B) = {cot})", from_dsl(comp),
                                  "the offsets A leaves free: where its copies go"))
                steps.append(Step("A* o B", from_dsl(cute.composition(comp, B)), "B's arrangement of the copies"))
            else:
                steps.append(Step("logical_product(A, B)", from_dsl(cute.logical_product(A, B)),
                                  _NOTES["logical_product"]))
            fn = {"logical_product": cute.logical_product, "blocked_product": cute.blocked_product,
                  "raked_product": cute.raked_product}[op]
            steps.append(Step(f"{op}(A, {lb})", from_dsl(fn(A, B)), _NOTES[op]))
        return steps

    return in_dsl(run)


def _as_dsl_layout(x):
    """Inside a trace: an int n as the layout n:1, a Layout as the DSL object."""
    import cutlass.cute as cute

    return cute.make_layout(x) if isinstance(x, int) else to_dsl(x)


def _tuple_as_layout(t: tuple) -> Layout:
    """A shape tuple (or tuple of layouts) as one layout, for display."""
    parts = [x if isinstance(x, Layout) else Layout(x, compact_left(x)) for x in t]
    return Layout(tuple(x.shape for x in parts), tuple(x.stride for x in parts))
