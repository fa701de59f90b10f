"""Elementwise family (lesson 1): copy, add, axpby over flat tensors, grid-stride over 128-bit vectors
(`schedules.grid_stride`), and copy's TMA bulk variant (`schedules.bulk_chunks`).

Files: this catalogue entry, `kernels.py` (the DSL kernels), `ops.py` (the torch ops), `bench.py` (the suite).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, index_sym
from cute_kernels.lazy import cute, cutlass
from schedules.bulk_chunks import CHUNKS, PIECES, BulkChunks
from schedules.grid_stride import TUNED, GridStride


@dataclass(frozen=True, eq=False)
class ElementwiseSpec(KernelSpec):
    def check(self, p):
        if p.get("mode") == "bulk" and not p["aligned"]:
            raise ValueError(f"{self.name}: mode=bulk needs 16-byte aligned operands (aligned=True)")

    def build(self, p):
        from cute_kernels.elementwise.kernels import BulkCopy, Elementwise

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        if p.get("mode") == "bulk":  # copy only: threads/unroll/ctas_per_sm/order do not apply
            kernel = BulkCopy(dt, p["index64"], BulkChunks(p["chunk_bytes"], p["pieces"]))
        else:
            sched = self.schedule_of(p)
            kernel = Elementwise(self.name.split(".")[1], dt, vec, p["index64"], sched)
        n = index_sym(p["index64"])
        align = 16 if p["aligned"] else dt.width // 8

        def t():
            return cute.runtime.make_fake_tensor(dt, (n,), stride=(1,), assumed_align=align)

        return kernel, (t(), t(), t(), cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        return p["chunk_bytes"] + 8 * p["pieces"] if p.get("mode") == "bulk" else None

    def sweep(self):
        return [
            self.resolve({"dtype": d, "aligned": a, "index64": i})
            for d, a, i in itertools.product(dtypes.FLOAT_NAMES, (True, False), (False, True))
        ]


# copy's TMA variant (schedules/bulk_chunks.py): one CTA per chunk, cp.async.bulk in and out. Not the
# op's default; `schedules.bulk_chunks.SIZE_CLASSES` says where the op takes it.
_BULK_PARAMS = {
    "mode": Param("grid", ("grid", "bulk"), help="grid: grid-stride vectors; bulk: TMA bulk copy per chunk"),
    "chunk_bytes": Param(8192, CHUNKS, help="mode=bulk: bytes per CTA"),
    "pieces": Param(1, PIECES, help="mode=bulk: bulk loads per chunk, each stored as it lands"),
}


def _elementwise(op: str, summary: str, ops: tuple[str, ...]) -> ElementwiseSpec:
    tuned = TUNED[op]
    return ElementwiseSpec(
        name=f"elementwise.{op}",
        family="elementwise",
        lesson=1,
        summary=summary,
        ops=ops,
        status="ready",
        schedule=GridStride,
        params={
            **SIG_COMMON,
            "threads": Param(tuned.threads, (128, 256, 512), help="threads per CTA"),
            "unroll": Param(tuned.unroll, (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
            "ctas_per_sm": Param(tuned.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
            "order": Param(tuned.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
            **(_BULK_PARAMS if op == "copy" else {}),
        },
    )


COPY = _elementwise("copy", "out = x, grid-stride over 128-bit vectors", ("copy",))
ADD = _elementwise("add", "out = x + y (fp32 math, rounded once)", ("add",))
AXPBY = _elementwise("axpby", "out = a*x + b*y (fp32 math, rounded once)", ("axpby",))

SPECS = (COPY, ADD, AXPBY)
