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
        # the residual (the output's shape and x's dtype) and the gated op (N / 2 columns, N a multiple of 16)
        assert ck.gemm_w4a16(x, w, s, residual=_fake(3, 5, 1000)).shape == (3, 5, 1000)
        with pytest.raises(ValueError, match="residual must have the output's shape"):
            ck.gemm_w4a16(x, w, s, residual=_fake(5, 1000))
        with pytest.raises(TypeError, match="residual has dtype"):
            ck.gemm_w4a16(x, w, s, residual=_fake(3, 5, 1000, dtype=torch.float32))
        wg = _fake(1024, 64, dtype=torch.int32)
        assert ck.gemm_w4a16_swiglu(x, wg, _fake(1024, 4)).shape == (3, 5, 512)
        with pytest.raises(ValueError, match="multiple of 16"):
            ck.gemm_w4a16_swiglu(x, _fake(1000, 64, dtype=torch.int32), s)


def test_glu_column_pairs_pack_gate_up():
    """The gated epilogue's map: interleaved row r (a gate row: r % 16 < 8) and row r + 8 hold gate and up of output
    column glu_column(r), as `pack_gate_up` put them."""
    from cute_kernels.gemm.ops import pack_gate_up
    from cute_kernels.w4a16.kernels import glu_column

    i = 48
    gate, up = torch.arange(i).view(i, 1), 1000 + torch.arange(i).view(i, 1)
    w = pack_gate_up(gate, up)[:, 0]
    for r in range(2 * i):
        if r % 16 < 8:
            assert w[r] == glu_column(r) and w[r + 8] == 1000 + glu_column(r)


def test_stream_plan_fills_one_wave():
    """The streaming kernel's plan: tiles x splits fit the co-resident CTAs, splits divide K's 256-k tiles evenly
    enough, and the stage ring fits shared memory."""
    from schedules.w4a16 import col_tiles_of, plan_w4a16

    for m in (1, 8, 16, 24, 64):
        for n, k in ((28672, 8192), (8192, 28672), (4096, 14336), (6144, 4096), (4096, 4096), (1000, 4128)):
            plan, splits, per = plan_w4a16(m, n, k, 132)
            ct = col_tiles_of(m)
            tiles = -(-n // plan.tile_n)
            k_tiles = -(-k // plan.tile_k)
            assert splits * per >= k_tiles > (splits - 1) * per
            assert tiles * splits <= max(tiles, plan.ctas_per_sm(ct) * 132)
            assert plan.smem_bytes(ct) <= 227 * 1024
    plan, splits, _ = plan_w4a16(1, 4096, 14336, 132)
    assert splits >= 4  # 32 W tiles alone would leave most SMs idle


def test_stream_fragments_emulated():
    """The streaming kernel's data flow, emulated lane by lane on the host for one CTA tile and one 256-k stage: the
    units each lane reads (span 4 jj + c of smem row srow), the x vectors (box 2 jj + c // 2, vector 4 (c % 2) + v),
    the A / B fragment words of MMA t (pairs 2 (t % 2) + hi of word t // 2; x words 2 (t % 2), + 1), the m16n8k16
    fragment semantics (A: (g, 2c) (g, 2c+1) (g+8, ..) (g, 2c+8) ..; B: (k 2c, 2c+1, 2c+8, 2c+9; n g); C: (g, 2c)
    (g, 2c+1) (g+8, 2c) (g+8, 2c+1)) and the epilogue's rows: the result is x W^T."""
    from cute_kernels.w4a16.kernels import mma_row

    torch.manual_seed(1)
    rows, k, m, mt_per_warp, warps = 128, 256, 8, 2, 4
    q = torch.randint(0, 16, (rows, k), dtype=torch.int32)
    p = pack_nibbles(q)
    x = torch.randn(m, k, dtype=torch.float64)
    wq = (q - 8).double()
    y = torch.full((m, rows), float("nan"), dtype=torch.float64)

    def pair(word, j):  # (lo, hi) values of pair j of a word, minus the zero point
        word &= 0xFFFFFFFF
        return ((word >> (4 * j)) & 0xF) - 8, ((word >> (4 * j + 16)) & 0xF) - 8

    for warp in range(warps):
        for mt in range(mt_per_warp):
            acc = torch.zeros(16, 8, dtype=torch.float64)  # C (W rows, x rows)
            srow = [[16 * (mt_per_warp * warp + mt) + 8 * h + mma_row(g) for h in range(2)] for g in range(8)]
            for jj in range(2):
                for t in range(8):
                    a = torch.zeros(16, 16, dtype=torch.float64)
                    b = torch.zeros(16, 8, dtype=torch.float64)
                    for g in range(8):
                        for c in range(4):
                            units = [[int(p[srow[g][h], 4 * (4 * jj + c) + i]) for i in range(4)] for h in range(2)]
                            for h in range(2):
                                for hi in range(2):
                                    lo_v, hi_v = pair(units[h][t // 2], 2 * (t % 2) + hi)
                                    a[g + 8 * h, 2 * c + 8 * hi] = lo_v
                                    a[g + 8 * h, 2 * c + 8 * hi + 1] = hi_v
                            box, vec = 2 * jj + c // 2, 4 * (c % 2) + t // 2
                            xv = x[g, 64 * box + 8 * vec: 64 * box + 8 * vec + 8]
                            e0 = 4 * (t % 2)
                            b[2 * c, g], b[2 * c + 1, g] = xv[e0], xv[e0 + 1]
                            b[2 * c + 8, g], b[2 * c + 9, g] = xv[e0 + 2], xv[e0 + 3]
                    acc += a @ b
            for g in range(8):
                for c in range(4):
                    for e in range(4):
                        y[2 * c + e % 2, srow[g][e // 2]] = acc[g + 8 * (e // 2), 2 * c + e % 2]
    assert torch.allclose(y, x @ wq.t(), atol=1e-9)


@pytest.mark.parametrize("zeros", [False, True])
def test_launch_stream_passes_the_tensors(zeros):
    """The op's launcher on CPU tensors with a recording spec: the compile parameters (`zeros` among them) and the
    tensors reach the kernel in its argument order, the plan's split with them."""
    from cute_kernels.w4a16 import ops

    class Recorder:
        name = "w4a16.stream"

        def compiled(self, plan, **signature):
            self.plan, self.signature = plan, signature
            return lambda *args: setattr(self, "args", args)

    n, k = 28672, 8192
    x = torch.randn(1, k, dtype=torch.bfloat16)
    w = torch.zeros(n, k // 8, dtype=torch.int32)
    y = torch.empty(1, n, dtype=torch.bfloat16)
    s = torch.ones(n, k // 128, dtype=torch.bfloat16)
    z = torch.full_like(s, 8.0) if zeros else None
    r = Recorder()
    ops.launch_stream(r, x, w, y, 132, None, False, s, z, group=128, zeros=zeros)
    assert r.signature == {"dtype": "bf16", "col_tiles": 1, "group": 128, "zeros": zeros}
    got_w, got_x, got_y, got_s, got_z, _, _, per, splits, src, alpha, beta = r.args
    assert got_w is w and got_x is x and got_y is y and got_s is s and got_z is (z if zeros else s)
    assert src is y and (alpha, beta) == (1.0, 0.0)  # (no source: y stands in, unread)
    assert splits * per * r.plan.tile_k >= k and (splits - 1) * per * r.plan.tile_k < k


@pytest.mark.parametrize("mode", ["gated", "residual"])
def test_op_reaches_the_stream_kernel_with_its_epilogue(mode, monkeypatch):
    """gemm_w4a16_swiglu / gemm_w4a16(residual=) on CPU tensors with a recording streaming spec: the compile
    parameters carry the epilogue (gated, or source), y is (M, N / 2) or (M, N), the residual is the kernel's src."""
    import cute_kernels.w4a16 as fam
    from cute_kernels.w4a16 import ops

    class Recorder:
        name = "w4a16.stream"

        def compiled(self, plan, **signature):
            self.signature = signature
            return lambda *args: setattr(self, "args", args)

    import cute_kernels.torch_ops as tops

    r = Recorder()
    monkeypatch.setattr(fam, "W4A16_STREAM", r)
    monkeypatch.setattr(ops, "num_sms", lambda *_: 132)
    monkeypatch.setattr(tops, "check_tensor", lambda *a, **kw: None)  # (CPU tensors stand in for CUDA ones)
    n, k = 28672, 4096
    x = torch.randn(1, k, dtype=torch.bfloat16)
    w = torch.zeros(n, k // 8, dtype=torch.int32)
    s = torch.ones(n, k // 128, dtype=torch.bfloat16)
    if mode == "gated":
        y = ops._swiglu_cuda(x, w, s, None, 128)
        assert y.shape == (1, n // 2) and r.signature["gated"] is True and "source" not in r.signature
        assert r.args[2].shape == (1, n // 2)
    else:
        res = torch.randn(1, n, dtype=torch.bfloat16)
        y = ops._cuda(x, w, s, None, 128, res)
        assert y.shape == (1, n) and r.signature["source"] is True and "gated" not in r.signature
        assert r.args[9].data_ptr() == res.data_ptr() and r.args[11] == 1.0  # src, beta
