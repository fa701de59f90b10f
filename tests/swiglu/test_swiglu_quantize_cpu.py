"""CPU: `swiglu_quantize` (SwiGLU with the 1x128 e4m3 quantization fused) compiles clean (the fast sigmoid, no IEEE
division, 16-lane butterflies for the block amax, 8-byte e4m3 stores, no local memory); its fake shapes are
quantize_1x128's."""

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_compiles_clean(dtype, tmp_path):
    spec = catalog.get("swiglu.quantize")
    report, files = compile_with_artifacts(spec, spec.resolve({"dtype": dtype}), str(tmp_path))
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx and "div.rn.f32" not in ptx
    assert "rcp.approx" in ptx and "e4m3x2" in ptx
    assert len(re.findall(r"shfl\.sync\.bfly", ptx)) >= 4  # 16 lanes: 4 butterfly steps
    assert re.search(r"st\.global(\.\w+)*\.v2\.(b32|u32)", ptx)


def test_fake_shapes():
    from cute_kernels.swiglu.ops import _swiglu_quantize_fake

    with FakeTensorMode(allow_non_fake_inputs=True):
        gate, up = (torch.empty(300, 1024, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        q, s = _swiglu_quantize_fake(gate, up)
        assert q.shape == (300, 1024) and q.dtype == torch.float8_e4m3fn and s.shape == (300, 8)
        assert s.stride() == (1, 300)  # quantize_1x128's MN-major scales
