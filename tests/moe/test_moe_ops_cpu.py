"""CPU: the MoE dispatch / combine kernel compiles clean for sm_90a (16-byte global vectors, no local memory, the
combine's slot loads ahead of its sums), the ops' shapes under fake tensors and their named errors."""

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.moe.ops import _combine_fake, _dispatch_fake


@pytest.mark.parametrize("over", [{}, {"direction": "combine"}, {"direction": "combine", "top_k": 2, "dtype": "fp16"},
                                  {"direction": "dispatch", "weighted": True, "top_k": 6}])
def test_compiles_clean(over, tmp_path):
    spec = catalog.get("moe.token_rows")
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    k = spec.resolve(over)["top_k"]
    loads = len(re.findall(r"ld\.global(\.\w+)*\.v4\.", ptx))
    stores = len(re.findall(r"st\.global(\.\w+)*\.v4\.", ptx))
    if over.get("direction") == "combine":
        assert loads >= k and stores >= 1  # every slot's vector, one store
    else:
        assert loads >= 1 and stores >= k  # one load, a store a slot


def test_weighted_is_dispatch_only():
    with pytest.raises(ValueError, match="weighted is dispatch's option"):
        catalog.get("moe.token_rows").resolve({"direction": "combine", "weighted": True})
    with pytest.raises(ValueError, match="quantize is the unweighted dispatch's option"):
        catalog.get("moe.token_rows").resolve({"direction": "combine", "quantize": True})


@pytest.mark.parametrize("top_k", [8, 1])
def test_quantizing_dispatch_compiles_clean(top_k, tmp_path):
    """The fused 1x128 quantization: the block amax by shuffles inside 8 lanes, the scale without a division call,
    e4m3 conversions, a 16-byte store of e4m3 a slot (per 16-element vector), no local memory."""
    spec = catalog.get("moe.token_rows")
    report, files = compile_with_artifacts(spec, spec.resolve({"quantize": True, "top_k": top_k}), str(tmp_path))
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert "shfl.sync.bfly" in ptx and "e4m3x2" in ptx and "div.rn.f32" not in ptx
    assert len(re.findall(r"st\.global(\.\w+)*\.v4\.(b32|u32)", ptx)) >= top_k


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_shapes_and_errors():
    with FakeTensorMode(allow_non_fake_inputs=True):
        rows = _t(5, 8, dtype=torch.int32)
        assert _dispatch_fake(_t(5, 256), rows, 1000).shape == (1000, 256)
        assert _combine_fake(_t(1000, 256), rows, _t(5, 8, dtype=torch.float32)).shape == (5, 256)
        with pytest.raises(TypeError, match="rows must be an int32"):
            _dispatch_fake(_t(5, 256), _t(5, 8, dtype=torch.int64), 10)
        with pytest.raises(ValueError, match="weights must have rows' shape"):
            _combine_fake(_t(10, 256), rows, _t(5, 4, dtype=torch.float32))
        with pytest.raises(ValueError, match="top_k = 17"):
            _dispatch_fake(_t(5, 256), _t(5, 17, dtype=torch.int32), 10)
        with pytest.raises(TypeError, match="x"):
            _dispatch_fake(_t(5, 256, dtype=torch.float32), rows, 10)


@pytest.mark.parametrize("over", [{}, {"scoring": "sigmoid", "experts": 256, "top_k": 8, "groups": 8, "topk_groups": 4,
                                       "bias": True},
                                  {"experts": 8, "top_k": 1, "logits": "bf16", "renormalize": False},
                                  {"experts": 40, "top_k": 3, "groups": 4, "topk_groups": 2}])
def test_route_kernel_compiles_clean(over, tmp_path):
    """The routing kernel: a warp a token (butterfly shuffles for the softmax, the group scores and each top-k
    round), no local memory, no spills."""
    spec = catalog.get("moe.route")
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    k = spec.resolve(over)["top_k"]
    assert len(re.findall(r"shfl\.sync\.bfly", ptx)) >= 5 * k  # a 5-step arg-max a round
    with pytest.raises(ValueError, match="groups 3 must divide"):
        spec.resolve({"experts": 64, "groups": 3, "topk_groups": 1})


@pytest.mark.parametrize("over", [{}, {"experts": 256}, {"experts": 8, "warps": 2, "rounds": 2}])
def test_layout_kernels_compile_clean(over, tmp_path):
    """The layouts' three kernels (count, scan, place): match.any for a round's lanes of one expert, no local memory,
    one atomic (the drop count)."""
    spec = catalog.get("moe.layouts")
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert "match.any.sync" in ptx and len(re.findall(r"atom\.global", ptx)) == 1
