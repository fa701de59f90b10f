"""Run one op a few times on randn data: a target for `ncu` and `compute-sanitizer`.

    python3 -m perf.probe add bf16 268435456
    python3 -m perf.probe row_sum bf16 65536 8192
    python3 -m perf.probe torch.add bf16 524288      (torch's kernel, for comparison)
    python3 -m perf.probe gemm bf16 8192 8192 8192   (torch.mm for cuBLAS)
"""

import sys

import torch

import cute_kernels as ck
from perf.harness import randn


def main(argv):
    op, dt, *shape = argv
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
    shape = [int(s) for s in shape]
    if op in ("gemm", "torch.mm"):
        m, n, k = shape
        a, b = randn(m, k, dtype=dtype, seed=1), randn(k, n, dtype=dtype, seed=2)
        f = (lambda: ck.gemm(a, b)) if op == "gemm" else (lambda: torch.mm(a, b))
        for _ in range(3):
            r = f()
        torch.cuda.synchronize()
        print(op, dt, shape, "ok", float(r.float().sum()))
        return
    x, y = randn(*shape, dtype=dtype, seed=1), randn(*shape, dtype=dtype, seed=2)
    f = {
        "copy": lambda: ck.copy(x),
        "add": lambda: ck.add(x, y),
        "axpby": lambda: ck.axpby(2.0, x, 0.5, y),
        "row_sum": lambda: ck.sum(x, dim=-1),
        "sum": lambda: ck.sum(x),
        "torch.copy": lambda: x.clone(),
        "torch.add": lambda: torch.add(x, y),
        "torch.sum": lambda: torch.sum(x),
    }[op]
    for _ in range(3):
        r = f()
    torch.cuda.synchronize()
    print(op, dt, shape, "ok", float(r.float().sum()))


if __name__ == "__main__":
    main(sys.argv[1:])
