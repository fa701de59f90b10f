"""Torch ops of decode attention: `cute_kernels::flash_attn_with_kvcache` (split-KV flash decoding over a
contiguous or paged KV cache, `decode.py`) and the attention-state merges `cute_kernels::merge_attention_states`
and `cute_kernels::merge_attention_states_many` (`merge.py`).

flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, ...):
- q (B, q_len, H_q, D), bf16 / fp16, D in {64, 128, 256}, H_q a multiple of H_kv;
- a contiguous cache k_cache / v_cache (B, L_max, H_kv, D), or a paged one (num_pages, page_size, H_kv, D) with
  block_table (B, max_pages) int32 (page_size a multiple of 16, 16 to 256): key i of sequence b is row
  i % page_size of page block_table[b, i // page_size];
- cache_seqlens (B,) int32 on q's device: the keys already in each sequence's cache, read on the device, never
  modified (the caller advances it, as in FlashAttention); None: every sequence fills the cache's capacity;
- k / v (B, q_len, H_kv, D): the new tokens, written in place into the cache at positions cache_seqlens[b] ..
  + q_len - 1 before attending (only those rows are written); the attended length is then cache_seqlens + q_len;
- rotary_cos / rotary_sin (max_pos, r / 2) fp32, with k / v: q and k rotated by RoPE at their cache positions
  cache_seqlens[b] + t (NeoX pairs, GPT-J with rotary_interleaved; dims past r pass through) and k / v appended, in
  one kernel (`append.py`), as FlashAttention's rotary arguments;
- causal / window are bottom-right aligned (query t of q_len sees keys <= L - q_len + t, as FlashAttention);
  softcap and softmax_scale as `flash_attn`;
- num_splits: CTAs per (batch, KV head) along the keys (None: `schedules.decode.choose_splits` from the static
  shapes); with more than one, fp32 partials are merged by the merge kernel;
- returns O (B, q_len, H_q, D) and, with return_lse, the LSE (B, H_q, q_len) fp32 (natural log; +inf for a row
  that sees no key, whose O is 0).
Graph-safe: no host synchronization, every buffer from the caching allocator. `validate=True` (off by default:
it synchronizes) checks the device-side values: cache_seqlens within the capacity, the block table's entries in
use inside the pool.
FP8 KV: k_cache / v_cache float8_e4m3fn with fp32 dequant scales k_scale / v_scale (x = x8 * scale), per KV head
(H_kv,) or per token and head (the cache's shape without D: (B, L_max, H_kv) or (num_pages, page_size, H_kv)).
Appended k / v (in q's dtype) are quantized: by the per-head scale, or by a fresh per-token scale amax / 448
written into k_scale / v_scale beside them (saturating to +-448). The kernel widens K and V to fp16 in shared
memory (times the per-token scales, in fp16) and computes in fp16 (Q converted: |q| must stay below 65504).

merge_attention_states(o_a, lse_a, o_b, lse_b) and merge_attention_states_many(o, lse): states in `flash_attn`'s
layouts, o (B, S, H, D) bf16 / fp16 / fp32 and lse (B, H, S) fp32 (the many-way form with a leading states axis,
(N, B, S, H, D) and (N, B, H, S)), any strides; return (o in o's dtype, lse fp32). LSE is base e; a state with
LSE +inf or -inf is empty; a row with only empty states gets O = 0 and LSE = +inf.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import call, placeholder, register_op, split_counters, tidy_unit_strides
from schedules.decode import (
    DECODE_HEAD_DIMS,
    MAX_SPLITS,
    PAGE_SIZES,
    DecodeSchedule,
    choose_merge,
    choose_splits,
    default_decode_schedule,
    m_tiles,
)

AB_TORCH = (torch.bfloat16, torch.float16)
STATE_TORCH = (torch.float32, torch.bfloat16, torch.float16)


def _shape(t):
    return tuple(t.shape)


def _check_index(name, t, dims: int, batch: int, what: str, q) -> None:
    """An int32 tensor of `dims` dims whose first is the batch, on q's device (block_table, cache_seqlens)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got dtype {str(t.dtype).replace('torch.', '')}")
    if t.dim() != dims or t.shape[0] != batch:
        raise ValueError(f"{name} must be {what}, got shape {_shape(t)}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


FP8_KV = torch.float8_e4m3fn
FP8_MAX = 448.0


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The dequant scale of values whose largest magnitude is amax: amax / 448 (1 for all-zero values)."""
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale as e4m3, saturating to +-448 (scale broadcast against x)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV)


def _check_scales(k_cache, v_cache, k_scale, v_scale, q) -> str:
    """FP8 KV: e4m3 caches need both dequant scales, fp32, per KV head (H_kv,) or per token and head (the cache's
    shape without D); a bf16 / fp16 cache takes none. Returns the kind: "none", "head" or "token"."""
    fp8 = k_cache.dtype == FP8_KV
    if not fp8:
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
            if t is not None:
                raise ValueError(f"{name} is given but the cache is {str(k_cache.dtype).replace('torch.', '')}: "
                                 "scales belong to an FP8 (float8_e4m3fn) cache")
        return "none"
    hk = k_cache.shape[2]
    per_token = tuple(k_cache.shape[:3])
    kinds = []
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            raise ValueError(f"{name} is needed with an FP8 cache: fp32 dequant scales (x = x8 * scale) of shape "
                             f"(kv_heads,) = ({hk},) or per token {per_token}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got dtype {str(t.dtype).replace('torch.', '')}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if tuple(t.shape) == (hk,):
            kinds.append("head")
        elif tuple(t.shape) == per_token:
            kinds.append("token")
        else:
            raise ValueError(f"{name} must be per KV head ({hk},) or per token and head {per_token} (the cache's "
                             f"shape without D), got shape {_shape(t)}")
    if kinds[0] != kinds[1]:
        raise ValueError(f"k_scale is per {kinds[0]} but v_scale per {kinds[1]}: give both at one granularity")
    return kinds[0]


def _check_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, window_left, window_right, softcap,
                   softmax_scale, num_splits, k_scale=None, v_scale=None) -> str:
    """Every argument checked; returns the FP8 scale kind (`_check_scales`)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {_shape(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if q.dtype not in AB_TORCH:
        raise TypeError(f"q has dtype {str(q.dtype).replace('torch.', '')}; supported: bfloat16, float16")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype and t.dtype != FP8_KV:
            raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')} but q has "
                            f"{str(q.dtype).replace('torch.', '')}; a cache is in q's dtype or float8_e4m3fn (with "
                            "k_scale / v_scale)")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) must have one dtype")
    b, q_len, hq, d = q.shape
    if d not in DECODE_HEAD_DIMS:
        raise ValueError(f"head dim (q.shape[3]) must be one of {DECODE_HEAD_DIMS}, got {d}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {_shape(k_cache)} and v_cache {_shape(v_cache)} must have the same shape")
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache's head dim ({k_cache.shape[3]}) differs from q's ({d})")
    hk = k_cache.shape[2]
    if hk == 0 or hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of the cache's key/value heads ({hk}) (GQA/MQA)")
    if block_table is None:
        if k_cache.shape[0] != b:
            raise ValueError(f"k_cache's batch ({k_cache.shape[0]}) differs from q's ({b}); a paged cache needs "
                             "block_table")
    else:
        _check_index("block_table", block_table, 2, b, f"(batch={b}, max_pages)", q)
        page = k_cache.shape[1]
        if page not in PAGE_SIZES:
            raise ValueError(f"page size (k_cache.shape[1]) must be a multiple of 16 from 16 to 256, got {page}")
    if cache_seqlens is not None:
        _check_index("cache_seqlens", cache_seqlens, 1, b, f"(batch={b},)", q)
    if (k is None) != (v is None):
        raise ValueError("k and v (the new tokens) must be given together")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.shape != (b, q_len, hk, d):
                raise ValueError(f"{name} must be (batch, q_len, kv_heads, head_dim) = {(b, q_len, hk, d)}, got "
                                 f"{_shape(t)}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name} (new tokens) has dtype {t.dtype} but q has {q.dtype}"
                                + (" (an FP8 cache quantizes them on append)" if k_cache.dtype == FP8_KV else ""))
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if cache_seqlens is None:
            raise ValueError("appending k / v needs cache_seqlens (where each sequence's new tokens go)")
    kind = _check_scales(k_cache, v_cache, k_scale, v_scale, q)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {tuple(t.stride())}")
    from cute_kernels.attention.ops import _check_options

    _check_options(window_left, window_right, softmax_scale, softcap)
    if num_splits is not None and not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be None (chosen per shape) or 1 to {MAX_SPLITS}, got {num_splits}")
    return kind


def _check_rotary(q, k, cos, sin) -> None:
    """RoPE on append: fp32 tables (max_pos, r / 2) given together, with the new k / v to rotate."""
    if cos is None and sin is None:
        return
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if k is None:
        raise ValueError("rotary_cos / rotary_sin rotate the appended tokens: pass the new k and v with them")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (max_pos, rotary_dim / 2), got dtype "
                            f"{str(t.dtype).replace('torch.', '')}")
        if t.dim() != 2 or t.shape != cos.shape:
            raise ValueError(f"{name} must be a (max_pos, rotary_dim / 2) table of one shape with the other, got "
                             f"{_shape(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have unit-stride columns, got strides {tuple(t.stride())}")
    if 2 * cos.shape[1] > q.shape[-1] or cos.shape[1] == 0:
        raise ValueError(f"rotary_cos has {cos.shape[1]} columns: rotary_dim = 2 x that must be in (0, head_dim = "
                         f"{q.shape[-1]}]")


def _capacity(k_cache, block_table) -> int:
    """Keys a sequence's cache can hold: L_max, or the block table's pages times the page size."""
    return k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])


def _validate(k_cache, cache_seqlens, block_table, q_len: int, appended: bool) -> None:
    """The device-side values a caller promises (`validate=True`: synchronizes)."""
    cap = _capacity(k_cache, block_table)
    lens = cache_seqlens.long() + (q_len if appended else 0)
    if bool((cache_seqlens < 0).any()) or bool((lens > cap).any()):
        raise ValueError(f"cache_seqlens (+ q_len when appending) must lie in [0, {cap}] (the cache's capacity); got "
                         f"{cache_seqlens.tolist()}")
    if block_table is not None:
        pages = (lens + k_cache.shape[1] - 1) // k_cache.shape[1]
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < pages[:, None]
        bad = used & ((block_table < 0) | (block_table >= k_cache.shape[0]))
        if bool(bad.any()):
            b, i = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_table[{b}, {i}] = {int(block_table[b, i])} is outside the pool of "
                             f"{k_cache.shape[0]} pages")


def _quantize_fp8(x, scale, rows):
    """New tokens x (B, q_len, H_kv, D) as e4m3: divided by the per-head scale (H_kv,), or by a fresh per-token
    scale amax(|x|) / 448 over D (1 for an all-zero row) written into `scale` at the cache rows `rows`; saturating."""
    if scale.dim() == 1:
        return to_fp8(x, scale[None, None, :, None])
    s_tok = fp8_scale(x.float().abs().amax(dim=-1))
    scale.index_put_(rows, s_tok)
    return to_fp8(x, s_tok[..., None])


def _append_torch(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale=None, v_scale=None) -> None:
    """`_append` in torch ops (the reference, and the path for layouts no vector width of the kernel fits)."""
    b, q_len = k.shape[:2]
    pos = cache_seqlens.long()[:, None] + torch.arange(q_len, device=k.device)[None, :]  # (B, q_len)
    if block_table is None:
        rows = (torch.arange(b, device=k.device)[:, None].expand(b, q_len), pos)
    else:
        page = k_cache.shape[1]
        rows = (block_table.long().gather(1, pos // page), pos % page)
    if k_cache.dtype == FP8_KV:
        k, v = _quantize_fp8(k, k_scale, rows), _quantize_fp8(v, v_scale, rows)
    k_cache.index_put_(rows, k)
    v_cache.index_put_(rows, v)


def _append_vec(tensors, d: int, rope: str, r: int) -> int:
    """The widest vector (elements) of the append kernel for these rows: D / vec a power of two <= 32, dividing the
    rotated unit, every stride but D's and every base (in elements); 0 when none fits."""
    from cute_kernels.attention import append_vec_error

    for vec in (8, 4, 2, 1):
        if append_vec_error(vec, d, rope, r):
            continue
        ok = True
        for t in tensors:
            es = t.element_size()
            if t.stride(-1) != 1 or t.data_ptr() % (vec * es) or any(
                    st % vec for sz, st in zip(t.shape[:-1], t.stride()[:-1]) if sz > 1):
                ok = False
                break
        if ok:
            return vec
    return 0


def append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table=None, k_scale=None, v_scale=None, q=None,
              cos=None, sin=None, positions=None, interleaved=False, rotary_dim=None):
    """Append k / v (B, q_len, H_kv, D) at cache_seqlens[b] + t by the `kv_append` kernel (FP8 caches quantized,
    per-token scales written); with cos / sin, q and k are rotated first (RoPE at positions[b, t], default the
    cache position) and the rotated q (B, q_len, H_q, D) is returned. Falls back to torch ops (append only) or raises
    (RoPE) when no vector width fits the layouts. Arguments are the caller's to check."""
    from cute_kernels.attention import KV_APPEND
    from cute_kernels.rope import tables_fit

    rope = "none" if cos is None else ("gptj" if interleaved else "neox")
    d = k.shape[-1]
    r = (2 * cos.shape[1] if rotary_dim is None else rotary_dim) if cos is not None else 128
    q_out = None if q is None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if k.numel() == 0:
        return q_out
    rows = [k, v, k_cache, v_cache] + ([q, q_out] if q is not None else [])
    vec = _append_vec(rows, d, rope, r)
    if rope != "none" and vec and not tables_fit(cos, sin, vec, interleaved):
        vec = 0
    if not vec:
        if rope != "none":
            from cute_kernels.rope.ops import rope as rope_op

            qr, kr = rope_op(q, k, cos, sin, positions if positions is not None else
                             (cache_seqlens.long()[:, None] + torch.arange(k.shape[1], device=k.device)),
                             interleaved, r)
            _append_torch(k_cache, v_cache, kr, v, cache_seqlens, block_table, k_scale, v_scale)
            return qr
        _append_torch(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale, v_scale)
        return None
    kind = "none" if k_cache.dtype != FP8_KV else ("head" if k_scale.dim() == 1 else "token")
    dev = k.device
    table = _no_table(dev) if block_table is None else _table_view(block_table)
    pages, prow, hk = k_cache.shape[:3]

    def scale(t):
        if kind == "none":
            return _no_scale(dev)
        return t.view(1, 1, -1).expand(pages, prow, hk) if kind == "head" else t

    if rope == "none":
        qv = qo = k.narrow(2, 0, 0)
        cs = sn = placeholder(dev, (1, 64), torch.float32)
    else:
        qv, qo, cs, sn = q, q_out, cos, sin
    pos = _no_table(dev) if positions is None else (positions.view(1, -1) if positions.dim() == 1 else positions)
    fn = KV_APPEND.compiled(dtype=dtypes.name_of(k.dtype), head_dim=d, vec=vec, paged=block_table is not None,
                            kv_scale=kind, rope=rope, rotary_dim=r if rope != "none" else 128,
                            positions="none" if positions is None else
                            ("int64" if positions.dtype == torch.int64 else "int32"))
    fn(*(tidy_unit_strides(t) for t in (qv, k, v, qo, k_cache, v_cache)), scale(k_scale), scale(v_scale), cache_seqlens,
       table, cs, sn, pos)
    return q_out


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale=None, v_scale=None) -> None:
    """k / v (B, q_len, H_kv, D) into the cache rows cache_seqlens[b] + t, on the device (no sync): the `kv_append`
    kernel (`append_kv`); into an FP8 cache quantized, per-token scales written beside them."""
    append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale, v_scale)


def _split_counter(device, b: int, hk: int, m_tiles: int) -> torch.Tensor:
    """The fused merge's finished-split counters, int32 (B, H_kv, row tiles) (`torch_ops.split_counters`)."""
    return split_counters(device, b * hk * m_tiles).view(b, hk, m_tiles)


def _no_scale(device) -> torch.Tensor:
    return placeholder(device, (1, 1, 1), torch.float32)


def _no_table(device) -> torch.Tensor:
    return placeholder(device, (1, 1), torch.int32)


def _decode_compiled(dtype, d, page_size, mask, softcap: bool, split: bool, sched: DecodeSchedule,
                     kv_scale: str = "none"):
    from cute_kernels.attention import FLASH_DECODE

    return FLASH_DECODE.compiled(sched, dtype=dtypes.name_of(dtype), head_dim=d, page_size=page_size, mask=mask,
                                 softcap=softcap, split=split, kv_scale=kv_scale)


def _scale_view(t, kind: str, device) -> torch.Tensor:
    """The kernel's (pages, page rows, H_kv) scales: per token as given (any strides), per head (1, 1, H_kv); a
    placeholder without FP8."""
    if kind == "none":
        return _no_scale(device)
    return t.view(1, 1, -1) if kind == "head" else t


def _merge_compiled(in_dtype, out_dtype, d, states: int, rows: int):
    """The merge kernel for `states` states of `rows` rows (`schedules.decode.choose_merge`)."""
    from cute_kernels.attention import MERGE_STATES

    return MERGE_STATES.compiled(choose_merge(states, rows, d), in_dtype=dtypes.name_of(in_dtype),
                                 out_dtype=dtypes.name_of(out_dtype), head_dim=d)


def _table_view(block_table):
    if block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    return block_table


def _flash_attn_with_kvcache_cuda(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                                  k_scale=None, v_scale=None, causal=False, window_left=-1, window_right=-1,
                                  softcap=0.0, softmax_scale=None, num_splits=None, validate=False,
                                  rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                                  schedule: DecodeSchedule | None = None):
    # (the forward's helpers: imported here, as ops.py imports this module to export its ops)
    from cute_kernels.attention.ops import _bounds, _kernel_view, _scalars

    kind = _check_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, window_left, window_right, softcap,
                          softmax_scale, num_splits, k_scale, v_scale)
    _check_rotary(q, k, rotary_cos, rotary_sin)
    b, q_len, hq, d = q.shape
    hk = k_cache.shape[2]
    out = torch.empty(b, q_len, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, hq, q_len, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    appended = k is not None
    if validate and cache_seqlens is not None:
        _validate(k_cache, cache_seqlens, block_table, q_len, appended)
    if rotary_cos is not None:  # q and k rotated at their cache positions, k appended, in one kernel
        q = append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale, v_scale, q, rotary_cos,
                      rotary_sin, None, rotary_interleaved)
    elif appended:
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale, v_scale)
    cap = _capacity(k_cache, block_table)
    if cache_seqlens is None:
        cache_seqlens = torch.full((b,), cap, dtype=torch.int32, device=q.device)
    from cute_kernels.attention import mask_name

    left, right = _bounds(causal, window_left, window_right, cap + q_len)
    sched = schedule or default_decode_schedule(d, kind != "none", q_len, hq // hk)
    if sched.swap_rows and q_len * (hq // hk) > sched.swap_rows:
        raise ValueError(f"schedule.swap_rows={sched.swap_rows} covers at most that many packed query rows, but q_len "
                         f"x (H_q / H_kv) = {q_len} x {hq // hk}")
    splits = num_splits or choose_splits(b, hk, cap, q_len, hq // hk, sched)
    page = 0 if block_table is None else k_cache.shape[1]
    table = _no_table(q.device) if block_table is None else _table_view(block_table)
    q_view = q if q.stride(-1) == 1 and all(s % 8 == 0 for s in q.stride()[:3]) and q.data_ptr() % 16 == 0 \
        else q.contiguous()
    fn = _decode_compiled(q.dtype, d, page, mask_name(left, right), softcap > 0, splits > 1, sched, kind)
    # (FP8 V, and V with swapped operands, is staged like K: (page rows, D, H_kv, pages))
    k_view, v_view = _kernel_view(k_cache), _kernel_view(v_cache, kind == "none" and not sched.swap_rows)
    ks_view, vs_view = _scale_view(k_scale, kind, q.device), _scale_view(v_scale, kind, q.device)
    scalars = (*_scalars(d, softmax_scale, softcap), left, right)
    added = q_len if appended else 0
    if splits == 1:
        no_counter = _no_table(q.device)[None]
        fn(q_view, k_view, v_view, out[None], lse[None], out, lse, no_counter, cache_seqlens, table, ks_view, vs_view,
           added, 1, *scalars)
        return out, lse
    o_part = torch.empty(splits, b, q_len, hq, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(splits, b, hq, q_len, dtype=torch.float32, device=q.device)
    # (the counters are read by the fused merge only)
    counter = _split_counter(q.device, b, hk, m_tiles(q_len, hq // hk)) if sched.fused_merge \
        else _no_table(q.device)[None]
    fn(q_view, k_view, v_view, o_part, lse_part, out, lse, counter, cache_seqlens, table, ks_view, vs_view, added,
       splits, *scalars)
    if not sched.fused_merge:
        _merge_compiled(torch.float32, q.dtype, d, splits, b * q_len * hq)(o_part, lse_part, out, lse)
    return out, lse


def _flash_attn_with_kvcache_fake(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                                  k_scale=None, v_scale=None, causal=False, window_left=-1, window_right=-1,
                                  softcap=0.0, softmax_scale=None, num_splits=None, validate=False,
                                  rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    _check_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, window_left, window_right, softcap,
                   softmax_scale, num_splits, k_scale, v_scale)
    _check_rotary(q, k, rotary_cos, rotary_sin)
    b, q_len, hq, d = q.shape
    return (torch.empty(b, q_len, hq, d, dtype=q.dtype, device=q.device),
            torch.empty(b, hq, q_len, dtype=torch.float32, device=q.device))


register_op("cute_kernels::flash_attn_with_kvcache",
            "(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, "
            "Tensor? cache_seqlens=None, Tensor? block_table=None, Tensor(c!)? k_scale=None, "
            "Tensor(d!)? v_scale=None, bool causal=False, int window_left=-1, "
            "int window_right=-1, float softcap=0.0, float? softmax_scale=None, int? num_splits=None, "
            "bool validate=False, Tensor? rotary_cos=None, Tensor? rotary_sin=None, bool rotary_interleaved=False) -> "
            "(Tensor, Tensor)",
            _flash_attn_with_kvcache_cuda, _flash_attn_with_kvcache_fake)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, k_scale=None,
                            v_scale=None, causal: bool = False, window: tuple[int, int] = (-1, -1),
                            softcap: float = 0.0, softmax_scale: float | None = None, num_splits: int | None = None,
                            return_lse: bool = False, validate: bool = False, rotary_cos=None, rotary_sin=None,
                            rotary_interleaved: bool = False):
    """Decode attention against a KV cache (see the module doc); returns O, or (O, LSE) with `return_lse`."""
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise ValueError(f"window must be a pair (left, right) of ints, -1 for unbounded, got {window!r}")
    out, lse = call("cute_kernels::flash_attn_with_kvcache", q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                    k_scale, v_scale, bool(causal), int(window[0]), int(window[1]), float(softcap), softmax_scale,
                    None if num_splits is None else int(num_splits), bool(validate), rotary_cos, rotary_sin,
                    bool(rotary_interleaved))
    return (out, lse) if return_lse else out


# --- the attention-state merges ----------------------------------------------------------------------------------
def _check_states(o, lse, many: bool, name_o="o", name_lse="lse"):
    dims = 5 if many else 4
    for name, t in ((name_o, o), (name_lse, lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
    if o.dtype not in STATE_TORCH:
        raise TypeError(f"{name_o} has dtype {str(o.dtype).replace('torch.', '')}; supported: float32, bfloat16, "
                        "float16")
    if lse.dtype != torch.float32:
        raise TypeError(f"{name_lse} must be float32, got {str(lse.dtype).replace('torch.', '')}")
    lead = "(N, B, S, H, D)" if many else "(B, S, H, D)"
    if o.dim() != dims:
        raise ValueError(f"{name_o} must be {dims}-D {lead}, got shape {_shape(o)}")
    want = (*o.shape[:-3], o.shape[-2], o.shape[-3])
    if lse.shape != want:
        raise ValueError(f"{name_lse} must be {'(N, B, H, S)' if many else '(B, H, S)'} = {want} for {name_o} "
                         f"{_shape(o)}, got {_shape(lse)}")
    if lse.device != o.device:
        raise ValueError(f"{name_lse} is on {lse.device} but {name_o} is on {o.device}")
    d = o.shape[-1]
    if d % 4 or d > 512:
        raise ValueError(f"head dim ({name_o}.shape[-1]) must be a multiple of 4 up to 512, got {d}")


def _state_view(o: torch.Tensor) -> torch.Tensor:
    """o with a unit-stride D, the other strides multiples of 4 elements and a 4-element-aligned address (one
    vector per thread), copied otherwise; strides of size-1 modes made small and aligned."""
    e = o.element_size()
    if o.stride(-1) != 1 or o.data_ptr() % (4 * e) or any(s % 4 for s, n in zip(o.stride()[:-1], o.shape[:-1])
                                                         if n > 1):
        o = o.contiguous()
    strides = [s if n > 1 else 4 for s, n in zip(o.stride()[:-1], o.shape[:-1])]
    return o.as_strided(o.shape, (*strides, 1))


def _merge_many_cuda(o, lse):
    _check_states(o, lse, True)
    n, b, s, h, d = o.shape
    out = torch.empty(b, s, h, d, dtype=o.dtype, device=o.device)
    lse_out = torch.empty(b, h, s, dtype=torch.float32, device=o.device)
    if out.numel() == 0:
        return out, lse_out
    if n == 0:
        out.zero_()
        lse_out.fill_(float("inf"))
        return out, lse_out
    _merge_compiled(o.dtype, o.dtype, d, n, b * s * h)(_state_view(o), lse, out, lse_out)
    return out, lse_out


def _merge_many_fake(o, lse):
    _check_states(o, lse, True)
    n, b, s, h, d = o.shape
    return (torch.empty(b, s, h, d, dtype=o.dtype, device=o.device),
            torch.empty(b, h, s, dtype=torch.float32, device=o.device))


register_op("cute_kernels::merge_attention_states_many", "(Tensor o, Tensor lse) -> (Tensor, Tensor)",
            _merge_many_cuda, _merge_many_fake)


def _check_pair(o_a, lse_a, o_b, lse_b):
    _check_states(o_a, lse_a, False, "o_a", "lse_a")
    _check_states(o_b, lse_b, False, "o_b", "lse_b")
    if o_a.shape != o_b.shape or o_a.dtype != o_b.dtype or o_a.device != o_b.device:
        raise ValueError(f"o_a and o_b must match in shape, dtype and device; got {_shape(o_a)} {o_a.dtype} "
                         f"{o_a.device} and {_shape(o_b)} {o_b.dtype} {o_b.device}")


def _merge_two_cuda(o_a, lse_a, o_b, lse_b):
    _check_pair(o_a, lse_a, o_b, lse_b)
    return _merge_many_cuda(torch.stack((o_a, o_b)), torch.stack((lse_a, lse_b)))


def _merge_two_fake(o_a, lse_a, o_b, lse_b):
    _check_pair(o_a, lse_a, o_b, lse_b)
    b, s, h, d = o_a.shape
    return (torch.empty(b, s, h, d, dtype=o_a.dtype, device=o_a.device),
            torch.empty(b, h, s, dtype=torch.float32, device=o_a.device))


register_op("cute_kernels::merge_attention_states", "(Tensor o_a, Tensor lse_a, Tensor o_b, Tensor lse_b) -> "
            "(Tensor, Tensor)", _merge_two_cuda, _merge_two_fake)


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """The attention over the union of two disjoint key sets from each one's (O (B, S, H, D), LSE (B, H, S)):
    returns (O, LSE)."""
    return call("cute_kernels::merge_attention_states", o_a, lse_a, o_b, lse_b)


def merge_attention_states_many(o, lse):
    """merge_attention_states over a leading states axis: o (N, B, S, H, D), lse (N, B, H, S) -> (O, LSE)."""
    return call("cute_kernels::merge_attention_states_many", o, lse)
