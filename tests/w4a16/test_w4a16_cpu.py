"""CPU: INT4 packing (quantization rules, exact round trips, the nibble order the tensor-core fragments need), the
op in fake mode with named errors, and the kernel's compiled SASS (HMMA, lop3 + packed bf16 dequantization, no
local memory)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels.w4a16.pack import nibble_order, pack_int4, pack_nibbles, unpack_int4, unpack_nibbles

ck = pytest.importorskip("cute_kernels")


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pack_unpack_round_trip(symmetric, group, dtype):
    torch.manual_seed(0)
    w = (torch.randn(40, 256) * 0.05).to(dtype)
    w[3, :group] = 0  # an all-zero group
    p, s, z = pack_int4(w, group, symmetric)
    assert p.dtype == torch.int32 and p.shape == (40, 32) and s.shape == (40, 256 // group) and s.dtype == dtype
    assert (z is None) == symmetric
    q = unpack_nibbles(p)
    assert q.min() >= 0 and q.max() <= 15 and torch.equal(pack_nibbles(q), p)
    d = unpack_int4(p, s, z, group)
    zz = torch.full_like(s.float(), 8.0) if z is None else z.float()
    exp = ((q.float().view(40, -1, group) - zz[..., None]) * s.float()[..., None]).view(40, 256).to(dtype)
    assert torch.equal(d, exp) and torch.equal(d[3, :group], torch.zeros(group, dtype=dtype))
    # quantization error at most half a step, plus the scale's rounding to 16 bits (up to 8 steps x 2^-8 at the
    # clamp) and the dequantized value's (|d| x 2^-8)
    step = s.float().repeat_interleave(group, dim=1)
    assert ((d.float() - w.float()).abs() <= (0.5 + 8 * 2 ** -8) * step + d.float().abs() * 2 ** -8 + 1e-6).all()
    # re-packing the dequantized weight with the same grid gives the same nibbles (symmetric: exact grid points)
    if symmetric:
        p2, s2, _ = pack_int4(d, group, True)
        assert torch.equal(unpack_int4(p2, s2, None, group), d)


def test_nibble_order_feeds_the_fragments():
    """Lane (g, c) of the tensor-core mainloop loads unit j (16 bytes: 32 k) of its row; MMA t's B fragment element
    e (k slot 2c + e % 2 + 8 (e // 2)) must be row element 32 j + 4 t + e. The kernel takes pair 2 (t % 2) + e // 2 of
    word t // 2, half e % 2, i.e. nibble (pair + 4 (e % 2)) of that word: check the packed order puts the right
    element there."""
    k = 256
    w = torch.arange(k, dtype=torch.int32)[None] % 16
    words = pack_nibbles(w)
    order = nibble_order(k)
    for j in range(k // 32):
        for t in range(8):
            for e in range(4):
                word = int(words[0, 4 * j + t // 2]) & 0xFFFFFFFF
                pair = 2 * (t % 2) + e // 2
                nib = (word >> (4 * (pair + 4 * (e % 2)))) & 0xF
                assert nib == (32 * j + 4 * t + e) % 16
                assert int(order[32 * j + 8 * (t // 2) + pair + 4 * (e % 2)]) == 32 * j + 4 * t + e


def test_pack_errors():
    with pytest.raises(ValueError, match="group_size"):
        pack_int4(torch.randn(8, 256), 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_int4(torch.randn(8, 100), 100)
    with pytest.raises(ValueError, match="2-D"):
        pack_int4(torch.randn(8), 32)


def _fake(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_mode_and_named_errors():
    with FakeTensorMode():
        x, w, s = _fake(3, 5, 512), _fake(1000, 64, dtype=torch.int32), _fake(1000, 4)
        assert ck.gemm_w4a16(x, w, s).shape == (3, 5, 1000)
        assert ck.gemm_w4a16(x, w, s, s).shape == (3, 5, 1000)
        assert ck.gemm_w4a16(x, w, _fake(1000, 1), group_size=512).shape == (3, 5, 1000)
        with pytest.raises(ValueError, match="K = 512"):
            ck.gemm_w4a16(_fake(2, 512), _fake(1000, 32, dtype=torch.int32), s)
        with pytest.raises(ValueError, match="scales must be"):
            ck.gemm_w4a16(x, w, _fake(1000, 8))
        with pytest.raises(TypeError, match="zeros has dtype"):
            ck.gemm_w4a16(x, w, s, _fake(1000, 4, dtype=torch.int32))
        with pytest.raises(TypeError, match="w_packed must be an int32"):
            ck.gemm_w4a16(x, _fake(1000, 64, dtype=torch.int64), s)
        with pytest.raises(TypeError, match="x has dtype"):
            ck.gemm_w4a16(x.float(), w, s)
