"""`online_softmax.row_max` (the attention row max as interleaved partial maxima and a tree) replayed
on the CPU with a recording fake of the thread's score fragment: every column read exactly once for
every per-thread column count a tile_n of 16..256 gives (tile_n / 4), the value equal to the
sequential fold (max(init, s[r, 0], s[r, 1], ...)), masked (-inf) columns and all-masked rows."""

import math
import random
import types

import pytest

from collectives import online_softmax


class _Frag:
    def __init__(self, rows):
        self.rows, self.reads = rows, {}

    def __getitem__(self, rc):
        self.reads[rc] = self.reads.get(rc, 0) + 1
        return self.rows[rc[0]][rc[1]]


def _fmax(a, b):  # PTX max.f32: a NaN operand yields the other
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


@pytest.fixture
def fake_cute(monkeypatch):
    fake = types.SimpleNamespace(size=lambda t, mode: len(t.rows[0]), arch=types.SimpleNamespace(fmax=_fmax))
    monkeypatch.setattr(online_softmax, "cute", fake)


@pytest.mark.parametrize("cols", [tile_n // 4 for tile_n in range(16, 257, 16)] + [1, 2, 3, 5, 7])
def test_row_max_reads_each_column_once_and_equals_the_fold(fake_cute, cols):
    rng = random.Random(cols)
    inf = float("inf")
    cases = [
        [rng.uniform(-50, 50) for _ in range(cols)],
        [-inf if rng.random() < 0.6 else rng.uniform(-5, 5) for _ in range(cols)],  # masked columns
        [-inf] * cols,  # an all-masked row so far
        [rng.uniform(-5, 5) for _ in range(cols - 1)] + [1e30],  # the max in the last column
        [1e30] + [rng.uniform(-5, 5) for _ in range(cols - 1)],
    ]
    for row in cases:
        for init in (-inf, 0.5, 1e31):
            frag = _Frag([row, list(reversed(row))])
            for r in (0, 1):
                got = online_softmax.row_max(frag, r, init)
                want = init
                for v in frag.rows[r]:
                    want = _fmax(want, v)
                assert got == want or (math.isinf(got) and got == want)
            assert frag.reads == {(r, c): 1 for r in (0, 1) for c in range(cols)}
