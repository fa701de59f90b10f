"""Torch ops `cute_kernels::rope` (out of place, differentiable) and `cute_kernels::rope_` (in place, a mutating op).

q (B, S, H_q, D) or varlen-packed (T, H_q, D), k likewise with H_k heads (or None); cos / sin fp32 (max_pos, n)
with n >= r / 2, of which the first r / 2 columns are used (r = rotary_dim, default 2 n); positions (B, S), (S,) or
(T,) int32 / int64, default 0 .. S - 1. Any strides with a unit-stride D are read in place (a QKV projection's
output split by views needs no copy); a D stride other than 1, or (GPT-J) rows not on a pair boundary, is copied
first. The out-of-place outputs are contiguous. With `validate=True` the positions are checked against the table
(a device sync); otherwise an out-of-range position is clamped on the device, never read out of bounds.
"""

from __future__ import annotations

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.rope import ROPE_TUNED, ROPE_TUNED_INTERLEAVED, rope_vec, tables_fit
from cute_kernels.torch_ops import (
    INDEX32_LIMIT,
    UNCAPPED,
    call,
    check_tensor,
    placeholder,
    register_op,
    tidy_unit_strides,
)
from schedules.hardware import num_sms

_POS_DTYPES = (torch.int32, torch.int64)


def _shape(t) -> tuple:
    return tuple(t.shape)


def _check(q, k, cos, sin, positions, rotary_dim):
    """Validate the arguments (names in every error); returns r."""
    check_tensor("q", q)
    if q.dim() not in (3, 4):
        raise ValueError(f"q must be (batch, seqlen, heads, head_dim) or varlen (tokens, heads, head_dim), got shape "
                         f"{_shape(q)}")
    if k is not None:
        check_tensor("k", k)
        if k.dtype != q.dtype:
            raise TypeError(f"k has dtype {k.dtype} but q has {q.dtype}")
        if k.device != q.device:
            raise ValueError(f"k is on {k.device} but q is on {q.device}")
        if k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
            raise ValueError(f"k must match q in all but the heads dim: q {_shape(q)}, k {_shape(k)}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, allowed=(torch.float32,))
        if t.dim() != 2:
            raise ValueError(f"{name} must be a (max_pos, rotary_dim / 2) fp32 table, got shape {_shape(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos {_shape(cos)} and sin {_shape(sin)} must have one shape")
    d = q.shape[-1]
    r = 2 * cos.shape[1] if rotary_dim is None else int(rotary_dim)
    if r <= 0 or r % 2 or r > d:
        raise ValueError(f"rotary_dim must be even and in (0, head_dim = {d}], got {r}")
    if r // 2 > cos.shape[1]:
        raise ValueError(f"rotary_dim {r} needs cos / sin with at least {r // 2} columns, got {cos.shape[1]}")
    if cos.shape[0] == 0:
        raise ValueError("cos / sin have no rows (max_pos = 0)")
    if positions is not None:
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"positions must be a torch.Tensor or None, got {type(positions).__name__}")
        if positions.dtype not in _POS_DTYPES:
            raise TypeError(f"positions must be int32 or int64, got dtype {str(positions.dtype).replace('torch.', '')}")
        if positions.device != q.device:
            raise ValueError(f"positions is on {positions.device} but q is on {q.device}")
        lead = tuple(q.shape[:-2])
        ok = tuple(positions.shape) == lead or (q.dim() == 4 and tuple(positions.shape) == lead[1:])
        if not ok:
            want = f"{lead} or ({lead[1]},)" if q.dim() == 4 else f"{lead}"
            raise ValueError(f"positions must have shape {want} (q's tokens), got {_shape(positions)}")
    elif q.shape[-3] > cos.shape[0]:
        raise ValueError(f"without positions token s takes position s: seqlen {q.shape[-3]} needs a table of at "
                         f"least that many rows, cos has {cos.shape[0]}")
    return r


def _validate(positions, cos):
    if positions is not None and positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= cos.shape[0]:
            raise ValueError(f"positions must lie in [0, {cos.shape[0]}) (the table's rows), got [{lo}, {hi}]")


def _as4(t):
    return t if t.dim() == 4 else t.unsqueeze(0)


def _pos2(positions, x4):
    """positions as the kernel's (B, S) tensor (a broadcast (S,) gets batch stride 0), or a placeholder."""
    if positions is None:
        return placeholder(x4.device)
    p = positions
    if p.dim() == 1:
        p = p.view(1, -1) if x4.shape[0] == 1 else p.view(1, -1).expand(x4.shape[0], -1)
    return p


def _span(t) -> int:
    """The largest element offset of t plus one (what a 32-bit kernel must index)."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0)


def _launch(q4, k4, qo4, ko4, cos, sin, positions, interleaved: bool, r: int, inverse: bool, inplace: bool):
    """Run `rope.apply` on 4-D rows (any strides, unit-stride D); the vector width follows the strides and bases."""
    q4, k4, qo4, ko4 = (tidy_unit_strides(t) for t in (q4, k4, qo4, ko4))
    es = q4.element_size()
    d = q4.shape[-1]
    ts = (q4, k4, qo4, ko4)
    elems = [x for t in ts for x in (*t.stride()[:3], t.data_ptr() // es)]
    vec = rope_vec(es, d, r, interleaved, elems)
    if vec and not tables_fit(cos, sin, vec, interleaved):
        vec = 0
    if not vec or any(t.data_ptr() % es for t in ts):
        return False
    pos = _pos2(positions, q4)
    wide = max(max(_span(t) for t in ts), q4.numel() + k4.numel()) > INDEX32_LIMIT - (1 << 20)
    sched = ROPE_TUNED_INTERLEAVED if interleaved else ROPE_TUNED
    fn = catalog.get("rope.apply").compiled(
        sched, dtype=dtypes.name_of(q4.dtype), head_dim=d, rotary_dim=r, interleaved=interleaved, vec=vec,
        positions="none" if positions is None else ("int64" if pos.dtype == torch.int64 else "int32"),
        inverse=inverse, inplace=inplace, index64=wide)
    cap = sched.max_ctas(num_sms(q4.get_device()))
    if cap >= UNCAPPED:
        cap_q = cap_k = UNCAPPED
    else:
        hq, hk = q4.shape[2], k4.shape[2]
        cap_q = max(1, cap * hq // max(hq + hk, 1))
        cap_k = max(1, cap - cap_q)
    fn(q4, k4, qo4, ko4, cos, sin, pos, cap_q, cap_k)
    return True


def _empty_k(q):
    return q.new_empty((*q.shape[:-2], 0, q.shape[-1]))


def _rope_impl(q, k, cos, sin, positions, interleaved, rotary_dim, inverse, inplace, out_q=None, out_k=None):
    r = rotary_dim
    q4, k4 = _as4(q), _as4(k)
    qo4 = q4 if inplace else _as4(out_q)
    ko4 = k4 if inplace else _as4(out_k)
    if q4.numel() + k4.numel() == 0:
        return
    unit = (q4.stride(-1) == 1 or q4.shape[-1] == 1) and (k4.stride(-1) == 1 or k4.numel() == 0)
    if unit and _launch(q4, k4, qo4, ko4, cos, sin, positions, interleaved, r, inverse, inplace):
        return
    # an awkward layout: contiguous copies, rotated there, copied back
    qc, kc = q4.contiguous(), k4.contiguous()
    qoc, koc = (qc, kc) if inplace else (qo4, ko4)
    if not _launch(qc, kc, qoc, koc, cos, sin, positions, interleaved, r, inverse, inplace):
        raise ValueError(f"rope: no vector width fits head_dim {q4.shape[-1]}, rotary_dim {r} "
                         f"({'GPT-J' if interleaved else 'NeoX'}) with these tables; cos / sin need a row stride "
                         "that is a multiple of the pair count per access")
    if inplace:
        q4.copy_(qc)
        k4.copy_(kc)


# --- the out-of-place op ---------------------------------------------------------------------------------------------
def _rope_fake(q, k, cos, sin, positions, interleaved, rotary_dim, inverse):
    _check(q, k, cos, sin, positions, rotary_dim)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device))


def _rope_cuda(q, k, cos, sin, positions, interleaved, rotary_dim, inverse):
    qo, ko = _rope_fake(q, k, cos, sin, positions, interleaved, rotary_dim, inverse)
    _rope_impl(q, k, cos, sin, positions, interleaved, rotary_dim, inverse, False, qo, ko)
    return qo, ko


def _rope_setup(ctx, inputs, output):
    q, k, cos, sin, positions, interleaved, rotary_dim, inverse = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.flags = (interleaved, rotary_dim, inverse)


def _rope_backward(ctx, dq, dk):
    """The rotation is orthogonal: its adjoint is the rotation by -angle."""
    cos, sin, positions = ctx.saved_tensors
    interleaved, rotary_dim, inverse = ctx.flags
    gq, gk = call("cute_kernels::rope", dq, dk, cos, sin, positions, interleaved, rotary_dim, not inverse)
    return gq, gk, None, None, None, None, None, None


# --- the in-place op -------------------------------------------------------------------------------------------------
def _rope_inplace_fake(q, k, cos, sin, positions, interleaved, rotary_dim):
    _check(q, k, cos, sin, positions, rotary_dim)


def _rope_inplace_cuda(q, k, cos, sin, positions, interleaved, rotary_dim):
    _check(q, k, cos, sin, positions, rotary_dim)
    _rope_impl(q, k, cos, sin, positions, interleaved, rotary_dim, False, True)


register_op("cute_kernels::rope", "(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? positions, bool interleaved, "
            "int rotary_dim, bool inverse) -> (Tensor, Tensor)", _rope_cuda, _rope_fake, _rope_backward, _rope_setup)
register_op("cute_kernels::rope_", "(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, Tensor? positions, "
            "bool interleaved, int rotary_dim) -> ()", _rope_inplace_cuda, _rope_inplace_fake)


def rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
         positions: torch.Tensor | None = None, interleaved: bool = False, rotary_dim: int | None = None,
         validate: bool = False):
    """(q_out, k_out): q and k rotated by the angles at their positions (new contiguous tensors; k_out is None when
    k is). NeoX pairs (i, i + r / 2) by default, GPT-J pairs (2i, 2i + 1) with `interleaved`; dims past
    `rotary_dim` pass through. Differentiable in q and k. `validate`: check positions against the table (syncs)."""
    r = _check(q, k, cos, sin, positions, rotary_dim)
    if validate:
        _validate(positions, cos)
    kk = _empty_k(q) if k is None else k
    qo, ko = call("cute_kernels::rope", q, kk, cos, sin, positions, bool(interleaved), r, False)
    return qo, (None if k is None else ko)


def rope_(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
          positions: torch.Tensor | None = None, interleaved: bool = False, rotary_dim: int | None = None,
          validate: bool = False):
    """`rope` in place: q and k are overwritten (dims past `rotary_dim` untouched); returns (q, k)."""
    r = _check(q, k, cos, sin, positions, rotary_dim)
    if validate:
        _validate(positions, cos)
    kk = _empty_k(q) if k is None else k
    call("cute_kernels::rope_", q, kk, cos, sin, positions, bool(interleaved), r)
    return q, k


def rope_tables(max_pos: int, rotary_dim: int, base: float = 10000.0, device=None, scaling: float = 1.0):
    """(cos, sin) fp32 (max_pos, rotary_dim / 2): angle p * base^(-2i / r) / scaling of position p and pair i, the
    tables `rope` takes (Llama's inverse frequencies; `scaling` > 1 is linear position interpolation)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and positive, got {rotary_dim}")
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim))
    ang = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] / scaling * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope_reference(q, k, cos, sin, positions=None, interleaved=False, rotary_dim=None):
    """The formula in fp32 (fp64 for fp64 inputs), on any device, outputs in q's dtype: the tests' reference."""
    r = 2 * cos.shape[1] if rotary_dim is None else rotary_dim

    def one(x):
        if x is None:
            return None
        s = x.shape[-3]
        if positions is None:
            pos = torch.arange(s, device=x.device)
        else:
            pos = positions.long()
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32  # fp64 in, fp64 arithmetic
        c = cos[pos][..., : r // 2].to(wide)
        sn = sin[pos][..., : r // 2].to(wide)
        if c.dim() == 2 and x.dim() == 4:  # (S, r/2) shared over the batch
            c, sn = c[None], sn[None]
        c, sn = c.unsqueeze(-2), sn.unsqueeze(-2)  # over the heads
        xf = x.to(wide)
        rot = xf[..., :r]
        if interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((a * c - b * sn, b * c + a * sn), dim=-1).flatten(-2)
        else:
            a, b = rot[..., : r // 2], rot[..., r // 2:]
            out = torch.cat((a * c - b * sn, b * c + a * sn), dim=-1)
        return torch.cat((out, xf[..., r:]), dim=-1).to(x.dtype)

    return one(q), one(k)


# --- the fused decode RoPE + KV append -------------------------------------------------------------------------------
def _rope_kv_append_check(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, block_table, k_scale,
                          v_scale, rotary_dim):
    from cute_kernels.attention.decode_ops import _check_kvcache

    if cache_seqlens is None:
        raise ValueError("cache_seqlens is needed: the new tokens go to positions cache_seqlens[b] + t")
    _check_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, -1, -1, 0.0, None, None, k_scale, v_scale)
    if positions is not None and positions.dim() == 2 and tuple(positions.shape) != tuple(q.shape[:2]):
        raise ValueError(f"positions must have shape {tuple(q.shape[:2])} (q's tokens), got {tuple(positions.shape)}")
    return _check(q, k, cos, sin, positions, rotary_dim or None)


def _rope_kv_append_fake(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions=None, block_table=None,
                         k_scale=None, v_scale=None, interleaved=False, rotary_dim=0):
    _rope_kv_append_check(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, block_table, k_scale,
                          v_scale, rotary_dim)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _rope_kv_append_cuda(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions=None, block_table=None,
                         k_scale=None, v_scale=None, interleaved=False, rotary_dim=0):
    from cute_kernels.attention.decode_ops import append_kv

    r = _rope_kv_append_check(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, block_table, k_scale,
                              v_scale, rotary_dim)
    if positions is not None and positions.dim() == 1:
        positions = positions.view(1, -1).expand(q.shape[0], -1)
    return append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale, v_scale, q, cos, sin, positions,
                     interleaved, r)


register_op("cute_kernels::rope_kv_append",
            "(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor cos, "
            "Tensor sin, Tensor? positions=None, Tensor? block_table=None, Tensor(c!)? k_scale=None, "
            "Tensor(d!)? v_scale=None, bool interleaved=False, int rotary_dim=0) -> Tensor",
            _rope_kv_append_cuda, _rope_kv_append_fake)


def rope_kv_append(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions=None, block_table=None,
                   k_scale=None, v_scale=None, interleaved: bool = False, rotary_dim: int | None = None,
                   validate: bool = False):
    """The decode step's RoPE and KV append in one kernel: q (B, q_len, H_q, D) and k (B, q_len, H_kv, D) rotated
    at positions (default: their cache positions cache_seqlens[b] + t), k and v written into the cache
    (`flash_attn_with_kvcache`'s layouts: contiguous or paged, bf16 / fp16 or FP8 with per-head or per-token scales)
    at cache_seqlens[b] + t; returns the rotated q. cache_seqlens is not advanced (the caller does, as in FA).
    `validate`: check the positions and the cache capacity (syncs)."""
    if validate:
        from cute_kernels.attention.decode_ops import _validate as _validate_cache

        _validate_cache(k_cache, cache_seqlens, block_table, q.shape[1], True)
        if positions is not None:
            _validate(positions, cos)
    return call("cute_kernels::rope_kv_append", q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions,
                block_table, k_scale, v_scale, bool(interleaved), int(rotary_dim or 0))
