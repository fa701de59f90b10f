"""CPU: RoPE's reference against the textbook forms (Hugging Face's rotate_half for NeoX, complex multiplication
for GPT-J), its algebra (norm-preserving, inverted by the negated angle), the vector-width rule, and the torch ops
in fake mode (shapes, named errors)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels.rope import rope_vec
from cute_kernels.rope.ops import rope_reference, rope_tables

ck = pytest.importorskip("cute_kernels")


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


@pytest.mark.parametrize("r", [64, 32])
def test_neox_matches_rotate_half(r):
    torch.manual_seed(0)
    b, s, h, d = 2, 7, 3, 64
    q = torch.randn(b, s, h, d, dtype=torch.float64)
    cos, sin = rope_tables(16, r)
    out, _ = rope_reference(q.float(), None, cos, sin, rotary_dim=r)
    c = torch.cat((cos[:s], cos[:s]), dim=-1).double()[None, :, None, :]
    sn = torch.cat((sin[:s], sin[:s]), dim=-1).double()[None, :, None, :]
    rot = q[..., :r] * c + _rotate_half(q[..., :r]) * sn
    ref = torch.cat((rot, q[..., r:]), dim=-1)
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_gptj_matches_complex_multiplication():
    torch.manual_seed(1)
    t, h, d = 9, 2, 32
    q = torch.randn(t, h, d)
    pos = torch.randint(0, 100, (t,))
    cos, sin = rope_tables(100, d)
    out, _ = rope_reference(q, None, cos, sin, positions=pos, interleaved=True)
    z = torch.view_as_complex(q.double().reshape(t, h, d // 2, 2).contiguous())
    w = torch.polar(torch.ones_like(cos[pos]).double(), torch.atan2(sin[pos], cos[pos]).double())[:, None, :]
    ref = torch.view_as_real(z * w).flatten(-2)
    assert torch.allclose(out.double(), ref, atol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_is_orthogonal_and_inverted_by_negated_sin(interleaved):
    torch.manual_seed(2)
    q = torch.randn(3, 5, 4, 128)
    k = torch.randn(3, 5, 2, 128)
    cos, sin = rope_tables(5, 96)
    qo, ko = rope_reference(q, k, cos, sin, interleaved=interleaved, rotary_dim=96)
    assert torch.allclose(qo.norm(dim=-1), q.norm(dim=-1), rtol=1e-5)
    back, _ = rope_reference(qo, None, cos, -sin, interleaved=interleaved, rotary_dim=96)
    assert torch.allclose(back, q, atol=1e-5) and torch.equal(qo[..., 96:], q[..., 96:])


def test_vector_width_rule():
    # bf16: 8 elements when r / 2, D - r, the strides and the bases allow it
    assert rope_vec(2, 128, 128, False, [4096, 128, 1024, 0]) == 8
    assert rope_vec(2, 128, 96, False, [4096, 128]) == 8 and rope_vec(2, 128, 72, False, [4096]) == 4  # r/2 = 36
    assert rope_vec(2, 128, 128, False, [4096, 132]) == 4 and rope_vec(2, 64, 64, False, [3]) == 1
    assert rope_vec(2, 64, 6, True, [64]) == 2 and rope_vec(2, 64, 64, True, [3]) == 0  # GPT-J needs pairs
    assert rope_vec(4, 128, 128, False, [4096]) == 4  # fp32: 16 bytes are 4 elements


def _fake(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_mode_shapes():
    with FakeTensorMode():
        q, k = _fake(2, 7, 32, 128), _fake(2, 7, 8, 128)
        cos, sin = _fake(64, 64, dtype=torch.float32), _fake(64, 64, dtype=torch.float32)
        qo, ko = ck.rope(q, k, cos, sin)
        assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == q.dtype
        qo, ko = ck.rope(_fake(11, 4, 128), None, cos, sin, positions=_fake(11, dtype=torch.int64))
        assert qo.shape == (11, 4, 128) and ko is None
        q2, k2 = ck.rope_(q, k, cos, sin, positions=_fake(7, dtype=torch.int32), rotary_dim=64)
        assert q2 is q and k2 is k


def _bad(**kw):
    base = dict(q=_fake(2, 7, 4, 64), k=_fake(2, 7, 2, 64), cos=_fake(16, 32, dtype=torch.float32),
                sin=_fake(16, 32, dtype=torch.float32))
    base.update(kw)
    return base


@pytest.mark.parametrize("make,exc,match", [
    (lambda: _bad(k=_fake(2, 7, 2, 64, dtype=torch.float16)), TypeError, "k has dtype"),
    (lambda: _bad(k=_fake(2, 6, 2, 64)), ValueError, "k must match q"),
    (lambda: _bad(q=_fake(7, 64)), ValueError, "q must be"),
    (lambda: _bad(cos=_fake(16, 32)), TypeError, "cos has dtype"),
    (lambda: _bad(sin=_fake(16, 16, dtype=torch.float32)), ValueError, "one shape"),
    (lambda: _bad(rotary_dim=66), ValueError, "rotary_dim"),
    (lambda: _bad(rotary_dim=63), ValueError, "rotary_dim"),
    (lambda: _bad(cos=_fake(16, 16, dtype=torch.float32), sin=_fake(16, 16, dtype=torch.float32), rotary_dim=64),
     ValueError, "at least 32 columns"),
    (lambda: _bad(positions=_fake(2, 7)), TypeError, "positions must be int32 or int64"),
    (lambda: _bad(positions=_fake(2, 6, dtype=torch.int32)), ValueError, "positions must have shape"),
    (lambda: _bad(q=_fake(2, 17, 4, 64), k=_fake(2, 17, 2, 64)), ValueError, "seqlen 17"),
])
def test_named_errors(make, exc, match):
    with FakeTensorMode():
        kw = make()
        with pytest.raises(exc, match=match):
            ck.rope(**kw)
        with pytest.raises(exc, match=match):
            ck.rope_(**kw)


def test_cpu_tensors_get_the_device_error():
    q = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16)
    cos, sin = rope_tables(8, 64)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        ck.rope(q, None, cos, sin)
