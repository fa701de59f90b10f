"""CPU: the MoE routing / dispatch / combine reference (`cute_kernels.moe.reference`): routing against a per-token
loop (ties to the lowest expert, group-limited selection with and without the correction bias), both layouts'
invariants (128-aligned expert blocks, token order inside an expert, capacity drops counted), dispatch and combine
as transposes of each other, named errors."""

import pytest
import torch

from cute_kernels.moe.reference import ALIGN, combine, contiguous_rows, dispatch, route


def _loop_route(logits, k, scoring, n_groups=None, topk_groups=None, bias=None, renorm=True, scale=1.0):
    """One token at a time, sorted by (-score, index)."""
    out_ids, out_w = [], []
    for row in logits.double():
        s = torch.softmax(row, 0) if scoring == "softmax" else torch.sigmoid(row)
        sel = s + (bias.double() if bias is not None else 0)
        allowed = set(range(len(row)))
        if n_groups:
            per = len(row) // n_groups
            gs = []
            for g in range(n_groups):
                v = sorted(sel[g * per:(g + 1) * per].tolist(), reverse=True)
                gs.append(sum(v[:2]) if bias is not None else v[0])
            keep = sorted(range(n_groups), key=lambda g: (-gs[g], g))[:topk_groups]
            allowed = {g * per + j for g in keep for j in range(per)}
        ids = sorted(allowed, key=lambda i: (-sel[i].item(), i))[:k]
        w = s[ids]
        if renorm:
            w = w / w.sum()
        out_ids.append(ids)
        out_w.append((w * scale).tolist())
    return torch.tensor(out_ids), torch.tensor(out_w, dtype=torch.float64)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("groups", [None, (8, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_route_matches_a_loop(scoring, groups, with_bias):
    torch.manual_seed(0)
    t, e, k = 37, 64, 6
    logits = torch.randn(t, e)
    logits[3] = 0.0  # a token whose scores all tie: experts 0 .. k - 1
    bias = 0.1 * torch.randn(e) if with_bias else None
    ng, tg = groups if groups else (None, None)
    r = route(logits, k, scoring, ng, tg, bias=bias, routed_scaling_factor=2.5)
    ids, w = _loop_route(logits, k, scoring, ng, tg, bias, scale=2.5)
    if not groups and not with_bias:
        assert r.topk_ids[3].tolist() == list(range(k))
    assert torch.equal(r.topk_ids.long(), ids)
    assert torch.allclose(r.topk_weights.double(), w, rtol=1e-5, atol=1e-7)


def test_layout_invariants():
    torch.manual_seed(1)
    t, e, k = 300, 16, 4
    logits = torch.randn(t, e)
    logits[:, 5] += 6.0  # expert 5 gets almost every token
    logits[:, 9] -= 50.0  # expert 9 gets none
    r = route(logits, k, max_m=40)
    counts = torch.bincount(r.topk_ids.reshape(-1).long(), minlength=e)
    assert torch.equal(r.counts.long(), counts) and r.counts[9] == 0 and r.counts[5] == t
    assert torch.equal(r.offsets[1:].long(), counts.cumsum(0))
    rows = contiguous_rows(t, k, e)
    assert r.m_indices.shape == (rows,) and r.row_source.shape == (rows,)
    copies = torch.arange(t * k).view(t, k)
    # every copy sits in a row of its expert; the rows of an expert start 128-aligned, in token order, then padding
    assert torch.equal(r.row_source[r.token_rows.long()].long(), copies)
    assert torch.equal(r.m_indices[r.token_rows.long()], r.topk_ids)
    start = 0
    for ex in range(e):
        n = int(counts[ex])
        blk = r.row_source[start:start + n].long()
        assert start % ALIGN == 0 and (r.m_indices[start:start + n] == ex).all()
        assert torch.equal(blk // k, torch.sort(blk // k).values)  # token order
        pad = -(-n // ALIGN) * ALIGN
        assert (r.m_indices[start + n:start + pad] == -1).all() and (r.row_source[start + n:start + pad] == -1).all()
        start += pad
    assert int(r.rows_used) == start and (r.m_indices[start:] == -1).all()
    # masked: the first 40 copies of each expert in token order, the rest dropped and counted
    assert torch.equal(r.masked_m.long(), counts.clamp(max=40))
    assert int(r.dropped) == int((counts - 40).clamp(min=0).sum())
    kept = r.token_slots >= 0
    assert torch.equal(r.masked_source.reshape(-1)[r.token_slots[kept].long()].long(), copies[kept])
    assert (r.masked_source[5, :40] // k).tolist() == sorted((r.masked_source[5, :40] // k).tolist())


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_dispatch_and_combine_are_transposes(layout):
    """<dispatch(x), y> = <x, combine(y, ones)> (fp64), and combine(dispatch(x), w) = x sum(w) over kept copies."""
    torch.manual_seed(2)
    t, e, k, h = 50, 8, 2, 256
    r = route(torch.randn(t, e), k, max_m=50)
    x = torch.randn(t, h, dtype=torch.float64)
    dx = dispatch(x, r, layout)
    y = torch.randn_like(dx)
    ones = torch.ones(t, k, dtype=torch.float64)
    lhs = (dx * y).sum()
    rhs = (x * combine(y, r, ones, layout, torch.float64)).sum()
    assert torch.allclose(lhs, rhs)
    back = combine(dispatch(x, r, layout), r, r.topk_weights, layout, torch.float64)
    assert torch.allclose(back, x * r.topk_weights.double().sum(1, keepdim=True))


def test_dispatch_quantized_rows():
    torch.manual_seed(3)
    r = route(torch.randn(20, 4), 2)
    q, s = dispatch(torch.randn(20, 256, dtype=torch.bfloat16), r, quantize="1x128")
    assert q.dtype == torch.float8_e4m3fn and q.shape == (contiguous_rows(20, 2, 4), 256) and s.shape == (q.shape[0], 2)


@pytest.mark.parametrize("kw,match", [({"top_k": 9}, "top_k must be in"), ({"scoring": "relu"}, "scoring"),
                                      ({"n_groups": 3, "topk_groups": 1}, "n_groups must divide"),
                                      ({"n_groups": 4}, "go together"), ({"bias": torch.zeros(7)}, "bias must be"),
                                      ({"n_groups": 4, "topk_groups": 1, "top_k": 3}, "exceeds")])
def test_named_errors(kw, match):
    args = {"top_k": 2, **kw}
    with pytest.raises(ValueError, match=match):
        route(torch.randn(5, 8), **args)
