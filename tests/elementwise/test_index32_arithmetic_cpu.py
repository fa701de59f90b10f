"""CPU replay of the elementwise kernel's index arithmetic (`map_vectors` over `strided_fold`) in
32-bit two's complement, as the 32-bit variant computes it: the launch's grid and complete pass
count (host), each thread's walk, the guarded last pass and the scalar tail. Checks that every
element is visited exactly once on small sizes (both orders, capped and uncapped grids, the tail,
n < vec), and that `GridStride.index32_ok` (the op's 32-bit/64-bit choice) admits no size whose
indices wrap past their `< n` guards."""

import pytest

from schedules.grid_stride import SIZE_CLASSES, TUNED, GridStride

I32 = 2**31


def wrap(x: int) -> int:
    return (x + I32) % (2 * I32) - I32


def host_launch(s: GridStride, n: int, vec: int, max_ctas: int):
    """(grid, full passes) as `Elementwise.__call__` computes them (floor division, as the DSL's)."""
    items = n // vec
    ctas = max(min(-(-items // s.items_per_cta_pass()), max_ctas), 1)
    _, _, ps = s.thread_walk(0, ctas, 0)
    ps = wrap(ps)
    if ps == 0:
        return ctas, None  # the host division traps (SIGFPE)
    return ctas, items // ps


def thread_accesses(s: GridStride, n: int, vec: int, ctas: int, passes: int, bidx: int, tidx: int):
    """Element indices thread (bidx, tidx) touches: vectors as (first element, vec), tail as (t, 1)."""
    items = n // vec
    first, stride, ps = (wrap(v) for v in s.thread_walk(bidx, ctas, tidx))
    out = []
    for p in range(max(passes, 0)):
        base = wrap(p * ps + first)
        out += [(wrap(base + u * stride) * vec, vec) for u in range(s.unroll)]
    base = wrap(passes * ps + first)
    if base < items:
        for u in range(s.unroll):
            j = wrap(base + u * stride)
            if j < items:
                out.append((j * vec, vec))
    if vec > 1 and bidx == ctas - 1:
        t = wrap((n // vec) * vec + tidx)
        if t < n:
            out.append((t, 1))
    return out


SCHEDULES = [GridStride(128, 4, 0, "cta"), GridStride(256, 4, 0, "grid"), GridStride(128, 2, 2, "cta"),
             GridStride(128, 3, 1, "grid"), GridStride(64, 1, 1, "cta")] + list(TUNED.values()) + [
    c for classes in SIZE_CLASSES.values() for _, _, c in classes]


@pytest.mark.parametrize("s", SCHEDULES, ids=str)
@pytest.mark.parametrize("vec", [1, 4, 8])
def test_every_element_once(s, vec):
    sms = 2
    for n in (1, vec - 1, vec, vec + 1, 1000, s.threads * s.unroll * vec * 3 + 5, 40000 + 3):
        if n < 1:
            continue
        ctas, passes = host_launch(s, n, vec, s.max_ctas(sms))
        assert ctas == s.grid(n // vec, sms)
        seen = [0] * n
        for b in range(ctas):
            for t in range(s.threads):
                for start, width in thread_accesses(s, n, vec, ctas, passes, b, t):
                    for e in range(start, start + width):
                        seen[e] += 1
        assert seen == [1] * n, (n, [i for i, c in enumerate(seen) if c != 1][:5])


def _wrapped_access(s: GridStride, n: int, vec: int, sms: int = 132) -> bool:
    """Whether some thread of the 32-bit kernel touches an index outside [0, n) (the last CTA has
    the largest first items; the first CTA the smallest)."""
    ctas, passes = host_launch(s, n, vec, s.max_ctas(sms))
    if passes is None:
        return True
    items = n // vec
    for b in {0, ctas - 1}:
        for t in range(s.threads):
            # complete passes precede the last one: in range whenever it is
            first, stride, ps = (wrap(v) for v in s.thread_walk(b, ctas, t))
            base = wrap(passes * ps + first)
            if base < items:
                for u in range(s.unroll):
                    j = wrap(base + u * stride)
                    if j < items and j < 0:
                        return True
            if vec > 1 and b == ctas - 1:
                tt = wrap(items * vec + t)
                if tt < n and tt < 0:
                    return True
    return False


BIG = [2**31 - 1, 2**31 - 8, 2**31 - 100, 2**31 - 1024, 2**30 + 512, 2**30, 2**30 + 2**20, 3 * 2**29,
       2**29 + 8, 2**28, 2**27 + 3, 2**24]


@pytest.mark.parametrize("s", SCHEDULES, ids=str)
@pytest.mark.parametrize("vec", [1, 4, 8])
def test_index32_ok_admits_no_wrapping_size(s, vec):
    for n in BIG:
        if s.index32_ok(n, vec, 132):
            assert not _wrapped_access(s, n, vec), (n, vec)


def test_sizes_that_wrapped_in_32_bits_take_the_64_bit_variant():
    add = TUNED["add"]  # the schedule `pick` returns from 256 MiB
    # n = 2^31 - 1, 16-byte aligned bf16: the last CTA's tail index 2^31 - 8 + tidx wraps negative.
    assert _wrapped_access(add, 2**31 - 1, 8) and not add.index32_ok(2**31 - 1, 8, 132)
    # misaligned (scalar) 2^30 + 512: one pass of exactly n items, the guarded pass after it wraps.
    assert _wrapped_access(add, 2**30 + 512, 1) and not add.index32_ok(2**30 + 512, 1, 132)
    # misaligned 2^31 - 1: the pass stride is 2^31 (wraps to -2^31).
    assert _wrapped_access(add, 2**31 - 1, 1) and not add.index32_ok(2**31 - 1, 1, 132)
    # an uncapped grid-ordered walk: pass stride 2^32 wraps to 0 and the host division traps
    assert _wrapped_access(GridStride(256, 4, 0, "grid"), 2**30, 1)
    # the common large sizes stay 32-bit
    for n in (2**28, 2**30, 2**31 - 2048):
        assert add.index32_ok(n, 8, 132)
