"""CPU: the voxel ops' layer: fake-impl shapes under FakeTensorMode (worst-case sizes, counts as (1,) tensors), named
errors for bad input in the fake (so torch.compile fails the same way as eager), the radix and reduction plans, the
CPU fallback (the reference), and the trim helper."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels import catalog
from cute_kernels.voxel import ops as O
from cute_kernels.voxel import reference as R

SIZE = (0.2, 0.2, 0.5)
RANGE = (0.0, 0.0, 0.0, 4.0, 4.0, 2.0)


def _t(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_shapes():
    with FakeTensorMode(allow_non_fake_inputs=True):
        v, c, n, cnt = O._hard_fake(_t(1000, 5), SIZE, RANGE, 7, 300)
        assert v.shape == (300, 7, 5) and v.dtype == torch.float32
        assert c.shape == (300, 3) and n.shape == (300,) and cnt.shape == (1,) and c.dtype == torch.int32
        assert O._dynamic_fake(_t(1000, 4), SIZE, RANGE).shape == (1000, 3)
        out = O._scatter_fake(_t(50, 16, dtype=torch.bfloat16), _t(50, 3, dtype=torch.int32), "max")
        assert [tuple(t.shape) for t in out] == [(50, 16), (50, 3), (50,), (50,), (1,), (50, 16)]
        assert out[0].dtype == torch.bfloat16 and out[5].dtype == torch.int32
        out = O._scatter_fake(_t(50, 16), _t(50, 3, dtype=torch.int32), "mean")
        assert out[5].shape == (0,)
        g = O._scatter_bwd_fake(_t(50, 16), _t(50, dtype=torch.int32), _t(50, dtype=torch.int32), out[5], "mean")
        assert g.shape == (50, 16)


@pytest.mark.parametrize(
    "call,err,match",
    [
        (lambda: O._hard_fake(_t(10, 2), SIZE, RANGE, 4, 4), ValueError, "points must be"),
        (lambda: O._hard_fake(_t(10, 4, dtype=torch.float16), SIZE, RANGE, 4, 4), TypeError, "points has dtype"),
        (lambda: O._hard_fake(_t(10, 4), SIZE, RANGE, 0, 4), ValueError, "max_points must be"),
        (lambda: O._hard_fake(_t(10, 4), (0.2, 0.2), RANGE, 4, 4), ValueError, "voxel_size must be 3"),
        (lambda: O._dynamic_fake(_t(10, 4), SIZE, (0, 0, 0, 1, 1, -1)), ValueError, "max > min"),
        (lambda: O._scatter_fake(_t(10, 4), _t(10, 3), "mean"), TypeError, "coords has dtype"),
        (lambda: O._scatter_fake(_t(10, 4), _t(9, 3, dtype=torch.int32), "mean"), ValueError, "coords must be"),
        (
            lambda: O._scatter_fake(_t(10, 4, dtype=torch.int32), _t(10, 3, dtype=torch.int32), "mean"),
            TypeError,
            "features has dtype",
        ),
        (lambda: O._scatter_fake(_t(10, 4), _t(10, 3, dtype=torch.int32), "prod"), ValueError, "reduce must be"),
    ],
)
def test_fake_named_errors(call, err, match):
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(err, match=match):
            call()


def test_cuda_impl_names_the_device():
    with pytest.raises(ValueError, match="points must be on a CUDA device"):
        O._hard_fake(torch.zeros(4, 4), SIZE, RANGE, 4, 4)
    with pytest.raises(ValueError, match="features must be on a CUDA device"):
        O._scatter_fake(torch.zeros(4, 4), torch.zeros(4, 3, dtype=torch.int32), "sum")


@pytest.mark.parametrize(
    "total,plan",
    [
        (1, (1, 4)),
        (255, (1, 8)),
        (511, (1, 9)),
        (512, (2, 5)),
        (1024 * 1024 * 40, (3, 9)),
        (432 * 496, (2, 9)),
        (2**31 - 1, (4, 8)),
    ],
)
def test_radix_plan_covers_the_keys(total, plan):
    passes, bits = O.radix_plan(total)
    assert (passes, bits) == plan
    assert passes * bits >= total.bit_length() and bits <= O.MAX_DIGIT_BITS
    catalog.get("voxel.hard").resolve({"passes": passes, "digit_bits": bits})  # a variant the catalogue has


@pytest.mark.parametrize(
    "f,dtype,plan",
    [
        (64, torch.float32, (4, 16)),
        (4, torch.float32, (4, 1)),
        (5, torch.float32, (1, 8)),
        (128, torch.bfloat16, (8, 16)),
        (200, torch.float32, (4, 32)),
        (3, torch.float16, (1, 4)),
    ],
)
def test_scatter_plan(f, dtype, plan):
    assert O.scatter_plan(torch.zeros(10, f, dtype=dtype)) == plan


def test_cpu_fallback_is_the_reference():
    g = torch.Generator().manual_seed(0)
    pts = torch.rand(500, 4, generator=g) * torch.tensor([4.4, 4.4, 2.2, 1.0]) - 0.2
    v = ck.voxelize(pts, SIZE, RANGE, max_points=4, max_voxels=100)
    want = R.voxelize_hard(pts, SIZE, RANGE, 4, 100)
    assert all(torch.equal(a, b) for a, b in zip(v, want))
    coords = ck.voxelize(pts, SIZE, RANGE, mode="dynamic")
    assert torch.equal(coords, R.point_coords(pts, SIZE, RANGE))
    s = ck.voxel_scatter(pts, coords, "max")
    assert isinstance(s, R.VoxelScatter)
    t = ck.voxel_trim(s)
    assert t.features.shape[0] == int(s.voxel_num) > 0
    t = ck.voxel_trim(v)
    assert t.voxels.shape[0] == int(v.voxel_num) > 0
    with pytest.raises(ValueError, match="mode must be one of"):
        ck.voxelize(pts, SIZE, RANGE, mode="soft")


def test_trim_raises_on_overflowed_keys():
    s = R.VoxelScatter(
        torch.zeros(3, 2),
        torch.zeros(3, 3, dtype=torch.int32),
        torch.zeros(3, dtype=torch.int32),
        torch.zeros(3, dtype=torch.int32),
        torch.full((1,), -1, dtype=torch.int32),
    )
    with pytest.raises(ValueError, match="bounding box holds more than"):
        ck.voxel_trim(s)
