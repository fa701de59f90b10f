"""CPU: schedule arithmetic: grid sizes, thread walks cover every item exactly once, row plans."""

import itertools

import pytest

from schedules.grid_stride import TUNED, GridStride, pick
from schedules.row_tiling import RowTiling, plan_rows
from schedules.walks import interleaved_split


def _visited(s: GridStride, n_items: int, grid: int):
    """Replay strided_fold's visiting order on the host."""
    seen = []
    for b, t in itertools.product(range(grid), range(s.threads)):
        first, stride, pass_stride = s.thread_walk(b, grid, t)
        p = 0
        while True:
            base = p * pass_stride + first
            if base >= n_items and p >= n_items // pass_stride:
                break
            for u in range(s.unroll):
                j = base + u * stride
                if j < n_items:
                    seen.append(j)
            p += 1
    return seen


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("order", ["grid", "cta"])
@pytest.mark.parametrize("n", [1, 31, 1000, 4096 + 3])
@pytest.mark.parametrize("cap", [0, 1, 2])
def test_every_item_visited_once(order, n, cap, reverse):
    s = GridStride(threads=32, unroll=4, ctas_per_sm=cap, order=order, reverse=reverse)
    grid = s.grid(n, num_sms=2)
    seen = _visited(s, n, grid)
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("order", ["grid", "cta"])
def test_full_passes_need_no_bounds_check(order, reverse):
    # strided_fold skips the bounds check for passes below n // pass_stride: they must be in range.
    s = GridStride(threads=64, unroll=4, ctas_per_sm=1, order=order, reverse=reverse)
    n, grid = 10_000, 3
    for b, t in itertools.product(range(grid), range(s.threads)):
        first, stride, pass_stride = s.thread_walk(b, grid, t)
        for p in range(n // pass_stride):
            assert p * pass_stride + first + (s.unroll - 1) * stride < n


def test_grid_sizes():
    s = GridStride(threads=128, unroll=4, ctas_per_sm=4, order="grid")
    assert s.grid(1, 132) == 1
    assert s.grid(128 * 10, 132) == 10  # one item per thread while under the cap
    assert s.grid(10**9, 132) == 4 * 132
    u = GridStride(threads=128, unroll=4, ctas_per_sm=0, order="cta")
    assert u.grid(10**9, 132) == -(-(10**9) // 512)  # uncapped: one pass
    assert str(u) == "t128u4c0c"
    assert str(GridStride(threads=128, unroll=4, ctas_per_sm=0, order="cta", reverse=True)) == "t128u4c0cr"


def test_reverse_walks_a_one_pass_grid_from_the_end():
    """CTAs start in block order: a reversed one-pass grid meets the last items first, CTA b taking the items an
    ascending grid's CTA G - 1 - b would."""
    n = 10_000
    up = GridStride(threads=32, unroll=2, ctas_per_sm=0, order="cta")
    down = GridStride(threads=32, unroll=2, ctas_per_sm=0, order="cta", reverse=True)
    grid = up.grid(n, num_sms=4)
    assert grid == down.grid(n, num_sms=4) and grid > 1
    for b in range(grid):
        assert down.thread_walk(b, grid, 5) == up.thread_walk(grid - 1 - b, grid, 5)
    firsts = [down.thread_walk(b, grid, 0)[0] for b in range(grid)]
    assert firsts == sorted(firsts, reverse=True) and firsts[0] > n - up.items_per_cta_pass() - 1


def test_invalid_configs_are_named():
    with pytest.raises(ValueError, match="threads"):
        GridStride(threads=100)
    with pytest.raises(ValueError, match="order"):
        GridStride(order="random")
    with pytest.raises(ValueError, match="threads_per_row"):
        RowTiling(threads=256, threads_per_row=48)
    with pytest.raises(ValueError, match="threads_per_row"):
        RowTiling(threads=128, threads_per_row=256)


def test_tuned_table_covers_every_op():
    for op in ("copy", "add", "axpby"):
        assert pick(op, 1 << 30) is TUNED[op]


def test_row_plans():
    sms = 132
    # Many short rows: several rows per CTA, no split.
    p = plan_rows(1 << 20, 16, sms, threads=256, unroll=4, ctas_per_sm=8)
    assert p.splits == 1 and p.tiling.threads_per_row == 4 and p.tiling.rows_per_cta == 64
    # One huge row: split over about ctas_per_sm CTAs per SM.
    p = plan_rows(1, 1 << 24, sms, threads=512, unroll=8, ctas_per_sm=4)
    assert p.splits == 4 * sms and p.tiling.threads_per_row == 512
    # A short single row is never split into chunks below min_vectors_per_cta.
    p = plan_rows(1, 100, sms)
    assert p.splits == 1
    assert plan_rows(3, 5000, sms, max_splits=1).splits == 1
    assert p.grid(1, sms) == (1, 1)


def test_elementwise_size_classes_cover_their_ranges_and_compile_as_catalogue_params():
    """Each measured size class is what `pick` returns inside its range (and only there), and is a
    valid config of its kernel (the op compiles exactly these parameters)."""
    from cute_kernels import catalog
    from schedules.grid_stride import SIZE_CLASSES

    for op, classes in SIZE_CLASSES.items():
        spec = catalog.get(f"elementwise.{op}")
        for lo, hi, cls in classes:
            assert lo < hi
            for size in (lo, (lo + hi) // 2, hi - 16):
                if size >= 16:
                    assert pick(op, size) is cls
            assert pick(op, hi) is not cls
            spec.check(spec.resolve(dict(threads=cls.threads, unroll=cls.unroll, ctas_per_sm=cls.ctas_per_sm,
                                         order=cls.order)))
    assert pick("axpby", 64 << 20) is TUNED["axpby"]  # no classes: the tuned config


@pytest.mark.parametrize("n", [1, 7, 64, 1000, 4096 + 3])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_interleaved_splits_cover_a_row_once_in_pass_order(n, splits):
    """The observer's splits dealt CTA passes in turn: every vector of the row once, each full pass in range (no
    bounds check), and pass p of split s the row's (p * splits + s)-th CTA pass: the grid walks the row upwards."""
    tpr, unroll = 8, 4
    seen = []
    for split, lane in itertools.product(range(splits), range(tpr)):
        first, pass_stride = interleaved_split(split, splits, lane, tpr, unroll)
        for p in range(n // pass_stride):
            assert p * pass_stride + first + (unroll - 1) * tpr < n
        p = 0
        while p * pass_stride + first < n or p < n // pass_stride:
            for u in range(unroll):
                j = p * pass_stride + first + u * tpr
                if j < n:
                    seen.append(j)
                    assert j // (tpr * unroll) == p * splits + split
            p += 1
    assert sorted(seen) == list(range(n))
