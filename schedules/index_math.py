"""Integer helpers that work on Python ints (host mirrors, tests, pictures) and DSL integers (kernels) alike;
the DSL is imported only when a DSL value comes in."""

from __future__ import annotations


def imax(a, b):
    """max of two Python or DSL ints (the tile arithmetic of `schedules.attention` and `collectives.attention_mask`
    runs on both)."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    import cutlass

    return cutlass.max(a, b)


def imin(a, b):
    """min of two Python or DSL ints."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    import cutlass

    return cutlass.min(a, b)


def floor_pow2(x):
    """The largest power of two <= x (x >= 1), on a Python or DSL int."""
    if isinstance(x, int):
        return 1 << (x.bit_length() - 1)
    import cutlass.cute as cute
    from cutlass import Int32

    return Int32(1) << (Int32(31) - Int32(cute.arch.clz(Int32(x))))
