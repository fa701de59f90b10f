"""CPU: the RoPE kernel compiles for sm_90a with 128-bit q / k accesses where the vector is 16 bytes, no local
memory, and each item's angle vectors loaded once."""

import pytest

from tests.helpers import case_id

CASES = [({}, 8), ({"interleaved": True, "positions": "int64", "inplace": True}, 8),
         ({"rotary_dim": 64, "positions": "int32"}, 8), ({"dtype": "fp32", "vec": 4, "index64": True}, 4),
         ({"vec": 2, "interleaved": True, "rotary_dim": 6, "head_dim": 64}, 2)]


@pytest.mark.parametrize("case", CASES, ids=[case_id(("rope.apply", c[0])) for c in CASES])
def test_census(case, tmp_path):
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    over, vec = case
    spec = catalog.get("rope.apply")
    report, files = compile_with_artifacts(spec, spec.resolve({"vec": vec, **over}), str(tmp_path))
    assert not report.spills, report.format()
    ptx = report.ptx_census
    assert ptx["ld.local"] == 0 if "ld.local" in ptx else ptx["ld/st.local"] == 0
    if vec * (4 if over.get("dtype") == "fp32" else 2) == 16:
        assert ptx["ld.global.v4 (128-bit)"] > 0 and ptx["st.global.v4 (128-bit)"] > 0
    assert report.kernels[0].registers <= 128


APPEND = [{}, {"rope": "neox", "paged": True}, {"rope": "gptj", "kv_scale": "token", "positions": "int64"},
          {"kv_scale": "head", "paged": True, "rope": "neox", "rotary_dim": 64}]


@pytest.mark.parametrize("over", APPEND, ids=[case_id(("kv_append", c)) for c in APPEND])
def test_kv_append_census(over, tmp_path):
    """The append kernel: 128-bit loads of the new rows (and of q with RoPE), FP8 rows converted by
    cvt.rn.satfinite, per-token amax by shuffles, no local memory."""
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get("kv_append")
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
    assert not report.spills, report.format()
    ptx = report.ptx_census
    text = files["ptx"].read_text()
    assert ptx["ld.global.v4 (128-bit)"] > 0
    fp8 = over.get("kv_scale", "none") != "none"
    assert ("cvt.rn.satfinite.e4m3x2.f32" in text) == fp8
    assert (ptx["shfl.sync"] > 0) == (over.get("kv_scale") == "token")


def test_fake_mode_fused_append():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cute_kernels as ck

    def f(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="cuda")

    with FakeTensorMode():
        q, k, v = f(2, 1, 32, 128), f(2, 1, 8, 128), f(2, 1, 8, 128)
        kc, vc = f(2, 64, 8, 128), f(2, 64, 8, 128)
        lens = f(2, dtype=torch.int32)
        cos, sin = f(64, 64, dtype=torch.float32), f(64, 64, dtype=torch.float32)
        assert ck.rope_kv_append(q, k, v, kc, vc, lens, cos, sin).shape == q.shape
        out = ck.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, rotary_cos=cos, rotary_sin=sin)
        assert out.shape == q.shape
        with pytest.raises(ValueError, match="pass the new k and v"):
            ck.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, rotary_cos=cos, rotary_sin=sin)
        with pytest.raises(ValueError, match="given together"):
            ck.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, rotary_cos=cos)
        with pytest.raises(TypeError, match="rotary_sin must be float32"):
            ck.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, rotary_cos=cos, rotary_sin=cos.half())
        with pytest.raises(ValueError, match="cache_seqlens is needed"):
            ck.rope_kv_append(q, k, v, kc, vc, None, cos, sin)
