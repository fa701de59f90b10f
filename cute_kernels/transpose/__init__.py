"""Transpose family (lessons 8-9): naive, padded shared memory, swizzled shared memory, TMA.

Files: this catalogue entry, `kernels.py`, `ops.py`, `bench.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.tile_order import TileOrder

VARIANTS = ("naive", "smem", "swizzle", "tma")


@dataclass(frozen=True, eq=False)
class TransposeSpec(KernelSpec):
    def check(self, p):
        if self.name.endswith(".tma") and not p["aligned"]:
            raise ValueError(f"{self.name}: TMA needs 16-byte aligned rows (aligned=True)")

    def build(self, p):
        from cute_kernels.transpose.kernels import Transpose

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        kernel = Transpose(self.name.split(".")[1], dt, vec, p["index64"], p["threads"], p.get("pad", -1),
                           self.schedule_of(p), p.get("sub", 1), p.get("persistent", False))
        sym = lambda d=1: index_sym(p["index64"], d)  # noqa: E731
        m, n, b = sym(), sym(), sym()
        align = 16 if p["aligned"] else dt.width // 8
        x = fake_tensor(dt, (m, n, b), (sym(vec), 1, sym(vec)), align)
        out = fake_tensor(dt, (n, m, b), (sym(vec), 1, sym(vec)), align)
        return kernel, (x, out, cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"dtype": "fp32"})]

    def sweep(self):
        al = (True,) if self.name.endswith(".tma") else (True, False)
        return [self.resolve({"dtype": d, "aligned": a, "index64": i})
                for d, a, i in itertools.product(dtypes.FLOAT_NAMES, al, (False, True))]


def _transpose(variant: str, summary: str, lesson: int, extra=None) -> TransposeSpec:
    return TransposeSpec(
        name=f"transpose.{variant}", family="transpose", lesson=lesson, summary=summary, ops=("transpose",),
        status="ready",
        schedule=TileOrder,
        params={**SIG_COMMON, "threads": Param(128, (128, 256), help="threads per CTA (one T x T tile)"),
                "order": Param("grouped", ("grouped", "row", "diagonal"),
                               help="tile order (schedules.tile_order): row = the plain 2-D grid"),
                "group": Param(32, (1, 4, 8, 16, 32, 64, 128), help="tile-rows per group (order=grouped)"),
                **({} if variant == "naive" else
                   {"sub": Param(1, (1, 2), help="T x T tiles per side of a CTA's block (2: 256-byte row runs)")}),
                **(extra or {})},
    )


TRANSPOSE_NAIVE = _transpose("naive", "coalesced 16-byte reads, scattered column writes (the cost of uncoalescing)", 8)
TRANSPOSE_SMEM = _transpose("smem", "tile through padded shared memory: coalesced both ways", 9,
                            {"pad": Param(-1, (-1, 0), help="row padding: -1 = 16 bytes, 0 = none (bank conflicts)")})
TRANSPOSE_SWIZZLE = _transpose("swizzle", "tile through 128-byte-swizzled shared memory (no padding)", 9)
TRANSPOSE_TMA = _transpose("tma", "TMA load of the tile, swizzled smem transpose, TMA store", 9,
                            {"persistent": Param(False, (False, True),
                                                 help="CTAs walk the blocks, the next block's TMA load under this "
                                                      "one's transpose and stores (two stages)")})


SPECS = (TRANSPOSE_NAIVE, TRANSPOSE_SMEM, TRANSPOSE_SWIZZLE, TRANSPOSE_TMA,)
