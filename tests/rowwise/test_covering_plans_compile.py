"""CPU: plans whose threads hold the vectors that cover the row (session 20: not the next power of two; 6144 bf16
elements on 256 threads: 3 vectors a thread) compile without spills beside every operand the ops pass there. The
planner's choice at 5120-12288 and the kernels the ops build there: the norm forwards with a residual, the FP8
outputs, no weight; the staged softmax backward of 4097-6144 / 8193-12288, also 64-bit; cross-entropy fwd's whole
passes, 64-bit."""

import pytest
import torch

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import plan_for_kernel
from cute_kernels.rowwise.launch import kernel_params
from tests.helpers import op_signature


def test_vectors_cover_the_row():
    for name, n, tiling in (("rmsnorm.fwd", 6144, "t256r256u3"), ("rmsnorm.fwd", 5120, "t256r256u3"),
                            ("layernorm.fwd", 6144, "t256r256u3"), ("softmax.fwd", 6144, "t256r256u3"),
                            ("softmax.bwd", 12288, "t512r512u3"), ("rmsnorm.fwd", 12288, "t256r256u6")):
        assert str(plan_for_kernel(name, n, 8)).startswith(tiling + " "), (name, n, plan_for_kernel(name, n, 8))
    for n in (1024, 4096, 8192, 16384, 65536):  # rows of a power of two: as before
        p = plan_for_kernel("rmsnorm.fwd", n, 8)
        assert p.tiling.unroll & (p.tiling.unroll - 1) == 0, (n, p)
    p = plan_for_kernel("softmax.bwd", 769, 1)  # scalar rows: the power of two
    assert p.tiling.unroll & (p.tiling.unroll - 1) == 0, p


CASES = [("rmsnorm.fwd", 6144, dict(residual=True, fp8_out="block128")),
         ("layernorm.fwd", 6144, dict(residual=True)),
         ("layernorm.fwd", 6144, dict(weight=False, bias=False)),
         ("softmax.bwd", 6144, dict(index64=True)),
         ("log_softmax.bwd", 12288, dict(index64=True)), ("softmax.bwd", 16384, dict(index64=True)),
         ("softmax.bwd", 16384, {})]


@pytest.mark.parametrize("name,n,sig", CASES, ids=[f"{c[0]}-{c[1]}-{'-'.join(c[2])}" for c in CASES])
def test_compiles_clean(name, n, sig, tmp_path):
    kp = kernel_params(name, torch.bfloat16, n, True, **op_signature(name, **sig))
    assert kp["vpt"] in (3, 6) or n == 16384, kp
    report, _ = compile_with_artifacts(catalog.get(name), catalog.get(name).resolve(kp), str(tmp_path))
    assert report.kernels[0].local_bytes == 0, report.format()


@pytest.mark.parametrize("index64", [False, True], ids=["i32", "i64"])
def test_cross_entropy_whole_passes(index64, tmp_path):
    from cute_kernels.rowwise.ops import ce_plan

    t = ce_plan(32768, 6144, 8, 132).tiling
    assert (t.threads_per_row, t.unroll) == (64, 6)  # 16 vectors a thread in two passes of 6 (session 22)
    spec = catalog.get("cross_entropy.fwd")
    p = spec.resolve(dict(dtype="bf16", aligned=True, index64=index64, threads=t.threads,
                          threads_per_row=t.threads_per_row, unroll=t.unroll, mode="rows"))
    report, _ = compile_with_artifacts(spec, p, str(tmp_path))
    assert report.kernels[0].local_bytes == 0, report.format()
