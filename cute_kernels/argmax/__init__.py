"""ArgMax family (lesson 12): the index of each row's maximum by a two-level scan of (value, index) keys.

Files: this catalogue entry, `kernels.py`, `ops.py`, `bench.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.row_tiling import TUNED as _ROW_TUNED
from schedules.row_tiling import RowTiling


@dataclass(frozen=True, eq=False)
class ArgMaxSpec(KernelSpec):
    def check(self, p):
        self.schedule_of(p)
        if p["row_head"] and (p["aligned"] or p["dtype"] == "key"):
            raise ValueError("row_head is for values whose rows are not 16-byte aligned (aligned=False)")

    def _in(self, p):
        keys_in = p["dtype"] == "key"
        dt = cutlass.Int64 if keys_in else dtypes.cutlass_of(p["dtype"])
        vec = 1 if keys_in else dtypes.vec_of(p["dtype"], p["aligned"] or p["row_head"])
        return keys_in, dt, vec

    def build(self, p):
        from cute_kernels.argmax.kernels import ArgMax

        keys_in, dt, vec = self._in(p)
        tiling = self.schedule_of(p)
        kernel = ArgMax(dt, vec, p["index64"], tiling, keys_in, p["keys_out"], p["row_head"])
        m, n = index_sym(p["index64"]), index_sym(p["index64"])
        align = 16 if (p["aligned"] and not keys_in) else dt.width // 8
        x = fake_tensor(dt, (m, n), (index_sym(p["index64"], 1 if p["row_head"] else vec), 1), align)
        s = index_sym(p["index64"])
        out = fake_tensor(cutlass.Int64, (m, s), (s, 1), 8)
        return kernel, (x, out, cutlass.Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        return 8 * group_smem_slots(p["threads"], p["threads_per_row"])

    def representative(self):
        return [self.resolve(), self.resolve({"threads_per_row": 8}), self.resolve({"keys_out": True})]

    def sweep(self):
        out = []
        for d, a, tpr, ko in itertools.product(dtypes.FLOAT_NAMES, (True, False), (4, 32, 128, 512), (False, True)):
            out.append(self.resolve({"dtype": d, "aligned": a, "threads_per_row": tpr, "keys_out": ko}))
        for tpr in (4, 32, 512):
            out.append(self.resolve({"dtype": "key", "aligned": False, "threads_per_row": tpr}))
        for d in dtypes.FLOAT_NAMES:
            out.append(self.resolve({"dtype": d, "index64": True}))
            out.append(self.resolve({"dtype": d, "aligned": False, "row_head": True}))
        return out


ARGMAX = ArgMaxSpec(
    name="argmax.rows", family="argmax", lesson=12,
    summary="argmax over the last dim: (value, index) as ordered Int64 keys, ties -> lowest index, NaN first",
    ops=("argmax",), status="ready", schedule=RowTiling,
    params={
        "dtype": Param("bf16", (*dtypes.FLOAT_NAMES, "key"), "signature", "element type ('key': second pass)"),
        "aligned": SIG_COMMON["aligned"],
        "index64": SIG_COMMON["index64"],
        "keys_out": Param(False, (True, False), "signature", "write split partials (keys) instead of indices"),
        "row_head": Param(False, (True, False), "signature",
                          "rows not 16-byte aligned: each row's first elements up to a 16-byte boundary scalar, "
                          "the rest in 128-bit vectors (aligned=False)"),
        "threads": Param(_ROW_TUNED["threads"], (128, 256, 512, 1024), help="threads per CTA"),
        "threads_per_row": Param(_ROW_TUNED["threads"], (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                                 help="threads sharing one row"),
        "unroll": Param(4, (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
    },
)


SPECS = (ARGMAX,)
