"""CPU: the norm forwards' weight and bias held in registers across a CTA's row tiles (`params_in_regs`, session 19):
set for a register plan on the capped grid (`HeldRowPlan.resident_grid`), the LayerNorm 8k register plan (the default
of session 19; since session 20 the plan of fp32 rows and of signatures the staged plan does not fit), and only there;
the kernel holds them for the plain signature only (beside a residual or an FP8 epilogue ptxas took LayerNorm 8k
from 2 CTAs an SM to 1), so those compile to the per-tile kernel's PTX."""

import dataclasses
import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import PARAMS_IN_REGS_KERNELS, config_of, plan_for_kernel

LN = "layernorm.fwd"
BASE = dict(dtype="bf16", aligned=True, index64=False, weight=True, w_dtype="bf16", bias=True, residual=False)


def test_config_sets_it_for_capped_register_plans_only():
    plan = plan_for_kernel(LN, 8192, 8, staged=False)
    assert plan.staging == "regs" and plan.resident_grid
    assert config_of(plan, LN)["params_in_regs"] is True
    assert "params_in_regs" not in config_of(plan)  # no kernel named: never
    assert "params_in_regs" not in config_of(dataclasses.replace(plan, resident_grid=False), LN)
    assert "params_in_regs" not in config_of(plan, "softmax.fwd")
    staged = plan_for_kernel(LN, 65536, 8)  # staged on the capped grid: weights staged in smem already
    assert staged.staging == "smem" and staged.resident_grid and "params_in_regs" not in config_of(staged, LN)
    assert set(PARAMS_IN_REGS_KERNELS) == {"rmsnorm.fwd", "layernorm.fwd"}
    with pytest.raises(ValueError, match="params_in_regs"):
        catalog.get("softmax.fwd").resolve(dict(params_in_regs=True))


def _compile(tmp_path, name, **kw):
    p = catalog.get(LN).resolve({**BASE, **config_of(plan_for_kernel(LN, 8192, 8, staged=False), LN), **kw})
    report, files = compile_with_artifacts(catalog.get(LN), p, str(tmp_path / name))
    return report.kernels[0], files["ptx"].read_text()


def _fmas(ptx):
    return len(re.findall(r"^\s+fma\.rn\.f32", ptx, re.M))


def test_layernorm_8k_holds_its_weights(tmp_path):
    """The held kernel: within 2 CTAs of 256 threads an SM, no spills; y * w + b contracted into FMAs (32 more than
    the per-tile kernel's, which keeps a mul and an add: the GPU test's one-ulp difference)."""
    held, held_ptx = _compile(tmp_path, "held")
    plain, plain_ptx = _compile(tmp_path, "plain", params_in_regs=False)
    assert held.local_bytes == 0 and held.registers <= 128, (held.registers, held.local_bytes)
    assert _fmas(held_ptx) == _fmas(plain_ptx) + 32


@pytest.mark.parametrize("sig", [dict(residual=True), dict(fp8_out="per_token")], ids=["residual", "fp8"])
def test_other_signatures_load_per_tile(sig, tmp_path):
    held, held_ptx = _compile(tmp_path, "held", **sig)
    plain, plain_ptx = _compile(tmp_path, "plain", params_in_regs=False, **sig)
    strip = lambda s: re.sub(r"^//.*$", "", s, flags=re.M)  # noqa: E731 (the header names the kernel's parameters)
    assert held.registers == plain.registers and _fmas(held_ptx) == _fmas(plain_ptx)
    assert strip(held_ptx).count("ld.global") == strip(plain_ptx).count("ld.global")
