"""RoPE family (the inference layer): rotary position embedding of q and k, NeoX or GPT-J pairing, partial rotary
dims, positions per token, out of place (differentiable) or in place; one grid-stride launch for both tensors.

Files: this catalogue entry, `kernels.py`, `ops.py`, `bench.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.grid_stride import GridStride

# 128-thread CTAs, 8 per SM striding CTA-contiguous passes, one item in flight per thread: the best of
# perf/lab/rope_sweep.py at 131k tokens, 32 / 8 heads, NeoX (97.9 % of a same-run copy of the same bytes; the
# one-pass unroll-2 grid it replaced: 87.4 %).
ROPE_TUNED = GridStride(threads=128, unroll=1, ctas_per_sm=8, order="cta")
# GPT-J (interleaved pairs) keeps the one-pass unroll-2 grid: the suite measured it at 86.9 % of copy at 131k tokens,
# and the NeoX default above at 79.9 %.
ROPE_TUNED_INTERLEAVED = GridStride(threads=128, unroll=2, ctas_per_sm=0, order="cta")
POSITIONS = ("none", "int32", "int64")


def rotary_vec_error(vec: int, head_dim: int, rotary_dim: int, interleaved: bool, pass_through: bool = True):
    """Why items of `vec` elements cannot rotate these dims (None: they can): even r in (0, D]; vec divides the
    rotated unit (r / 2 NeoX, r GPT-J) and, with `pass_through` (the RoPE kernel copies D - r in vectors), D - r;
    GPT-J needs at least a pair."""
    unit = rotary_dim if interleaved else rotary_dim // 2
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        return f"rotary_dim must be even and in (0, head_dim = {head_dim}], got {rotary_dim}"
    if unit % vec or (pass_through and (head_dim - rotary_dim) % vec) or (interleaved and vec < 2):
        return (f"vec {vec} must divide {'r' if interleaved else 'r / 2'} = {unit}"
                + (f" and D - r = {head_dim - rotary_dim}" if pass_through else "")
                + (" and be >= 2 (GPT-J pairs)" if interleaved else ""))
    return None


def rope_vec(dtype_bytes: int, head_dim: int, rotary_dim: int, interleaved: bool, strides_and_ptrs) -> int:
    """The widest vector (elements, at most 16 bytes) a call can use: `rotary_vec_error` finds nothing against it
    and it divides every stride of the rows and every base address in elements. 0 when none fits (the op copies to
    a contiguous buffer then)."""
    for v in (16 // dtype_bytes, 8 // dtype_bytes, 4 // dtype_bytes, 1):
        if v < 1 or rotary_vec_error(v, head_dim, rotary_dim, interleaved):
            continue
        if all(x % v == 0 for x in strides_and_ptrs):
            return v
    return 0


def tables_fit(cos, sin, vec: int, interleaved: bool) -> bool:
    """Whether the fp32 angle tables allow `vec`-element items: an item reads vec (NeoX) or vec / 2 (GPT-J) angle
    entries as one vector, so the row strides and the bases (in elements) must be multiples of that."""
    angles = vec // 2 if interleaved else vec
    return all(x % angles == 0 for x in (cos.stride(0), sin.stride(0), cos.data_ptr() // 4, sin.data_ptr() // 4))


@dataclass(frozen=True, eq=False)
class RopeSpec(KernelSpec):
    def check(self, p):
        super().check(p)
        v = p["vec"]
        err = rotary_vec_error(v, p["head_dim"], p["rotary_dim"], p["interleaved"])
        if err:
            raise ValueError(f"{self.name}: {err}")
        if v * dtypes.elem_bytes(p["dtype"]) > 16:
            raise ValueError(f"{self.name}: vec {v} of {p['dtype']} is more than 16 bytes")

    def build(self, p):
        from cute_kernels.rope.kernels import RotaryEmbedding

        dt = dtypes.cutlass_of(p["dtype"])
        d, r, v = p["head_dim"], p["rotary_dim"], p["vec"]
        wide = p["index64"]

        def sym(div=1):
            return index_sym(wide, div)

        align = v * dt.width // 8
        rows = [fake_tensor(dt, (sym(), sym(), sym(), d), (sym(v), sym(v), sym(v), 1), align) for _ in range(4)]
        angles = v // 2 if p["interleaved"] else v
        tables = [fake_tensor(cutlass.Float32, (sym(), r // 2), (sym(angles), 1), min(16, 4 * angles))
                  for _ in range(2)]
        pos_t = cutlass.Int64 if p["positions"] == "int64" else cutlass.Int32
        pos = fake_tensor(pos_t, (sym(), sym()), (sym(), sym()), pos_t.width // 8)
        kernel = RotaryEmbedding(dt, d, r, p["interleaved"], v, p["positions"], p["inverse"], p["inplace"], wide,
                                 self.schedule_of(p))
        return kernel, (*rows, *tables, pos, cutlass.Int32(1), cutlass.Int32(1), fake_stream())

    def static_extents(self, p):
        return {p["rotary_dim"] // 2}  # the angle tables' width: r / 2 angles a row, fixed by rotary_dim

    def representative(self):
        return [self.resolve(), self.resolve({"interleaved": True, "positions": "int64", "inplace": True}),
                self.resolve({"rotary_dim": 64, "positions": "int32"})]

    def sweep(self):
        out = []
        for dt in dtypes.FLOAT_NAMES:
            v = 16 // dtypes.elem_bytes(dt)
            for inter in (False, True):
                for r in (128, 64):
                    out.append(self.resolve({"dtype": dt, "vec": v, "interleaved": inter, "rotary_dim": r}))
        out.append(self.resolve({"vec": 1, "rotary_dim": 126}))
        out.append(self.resolve({"vec": 2, "interleaved": True, "rotary_dim": 6, "head_dim": 64}))
        out.append(self.resolve({"index64": True, "positions": "int32"}))
        out.append(self.resolve({"inverse": True, "head_dim": 256, "rotary_dim": 256}))
        return out


ROPE = RopeSpec(
    name="rope.apply",
    family="rope",
    lesson=0,
    summary="rotary position embedding of q and k in one launch: NeoX / GPT-J pairs, partial rotary dims, fp32 "
            "angle tables gathered by position, fp32 math rounded once, in or out of place",
    ops=("rope", "rope_"),
    status="ready",
    schedule=GridStride,
    params={
        "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "q / k element type"),
        "head_dim": Param(128, tuple(range(2, 513, 2)), "signature", "head dimension D"),
        "rotary_dim": Param(128, tuple(range(2, 513, 2)), "signature", "rotated dims r (even, <= D)"),
        "interleaved": Param(False, (True, False), "signature", "GPT-J pairs (2i, 2i + 1); False: NeoX (i, i + r/2)"),
        "vec": Param(8, (1, 2, 4, 8), "signature", "elements per access (divides r / 2 or r, D - r and the strides)"),
        "positions": Param("none", POSITIONS, "signature", "a positions tensor's dtype (none: p = s)"),
        "inverse": Param(False, (True, False), "signature", "rotate by -angle (the backward)"),
        "inplace": Param(False, (True, False), "signature", "in place: the pass-through dims are not copied"),
        "index64": Param(False, (True, False), "signature", "64-bit sizes and strides (>= 2^31 elements)"),
        "threads": Param(ROPE_TUNED.threads, (128, 256, 512), help="threads per CTA"),
        "unroll": Param(ROPE_TUNED.unroll, (1, 2, 4, 8), help="items in flight per thread"),
        "ctas_per_sm": Param(ROPE_TUNED.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
        "order": Param(ROPE_TUNED.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
    },
)

SPECS = (ROPE,)
