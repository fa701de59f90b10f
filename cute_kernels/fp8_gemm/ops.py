"""Torch ops of lesson 13: the FP8 block-scaled GEMM, dense and grouped (MoE).

    x_q, sa = ck.quantize_1x128(x)          # activations (M, K): one scale per row per 128 columns
    w_q, sb = ck.quantize_128x128(w)        # weights (N, K): one scale per 128 x 128 block
    y = ck.fp8_gemm(x_q, sa, w_q, sb)       # (M, N) bf16 = (x_q * sa) @ (w_q * sb)^T

Shapes and layouts (validated, errors name the argument):

* a (M, K) and b (N, K): float8_e4m3fn, unit stride along K (b is the weight as stored by
  nn.Linear, "NT"). Other layouts, or K not a multiple of 16, are copied first (zero-padded in K).
* sa (M, ceil(K/128)) float32. The kernel reads it MN-major with the column stride a multiple of 4
  ("TMA-aligned", `tma_aligned_scales`); `quantize_1x128` returns it that way already, any other
  layout is copied into it (M x K/128 x 4 bytes: small beside A).
* sb (ceil(N/128), ceil(K/128)) float32, any strides.
* the result is a new (M, N) tensor of `out_dtype` (bf16 by default, or fp16), fp32 accumulation
  promoted every 128 K (see `collectives.wgmma_mainloop.mma_k_tiles_promoted`).

Grouped (MoE) GEMMs, one weight per expert, only M grouped. The
kernel is the FP8 block-scaled GEMM (`ck.fp8_gemm`) with a grouped tile walk
(`schedules.walks.TileWalk.tile`); the scales are the same 1x128 (activations) and 128x128
(weights) blocks.

    y = ck.fp8_gemm_grouped_contiguous(a, sa, b, sb, m_indices)           # (M, N)
    y = ck.fp8_gemm_grouped_masked(a, sa, b, sb, masked_m, expected_m)    # (E, max_m, N)

Contiguous layout (prefill / training: every expert's tokens concatenated):

* a (M, K) float8_e4m3fn, sa (M, ceil(K/128)) float32: as for `ck.fp8_gemm` (any sa layout, copied
  into the TMA-aligned one when needed).
* b (E, N, K) float8_e4m3fn, one (N, K) weight per expert; sb (E, ceil(N/128), ceil(K/128)) float32.
* m_indices (M,) int32: the expert of each row of a, -1 for padding rows. Each expert's rows must
  start at a multiple of 128 (`M_ALIGN`, DeepGEMM's alignment): the kernel reads the expert of a
  128-row tile at the tile's first row and multiplies the whole tile by that expert's weight.
  Tiles whose first row is padding (or names no expert in [0, E)) are skipped: their output rows
  are left unwritten (unspecified), as are padding rows inside a computed tile (they hold that
  expert's product of whatever a holds there).
* returns (M, N) `out_dtype` (bf16 or fp16).

Masked layout (decoding with expert parallelism: fixed per-expert buffers, CUDA-graph friendly):

* a (E, max_m, K), sa (E, max_m, ceil(K/128)); b, sb as above.
* masked_m (E,) int32: the valid rows of each expert, read by the kernel on the device (no host
  synchronization, so the op can be captured in a CUDA graph); values are clamped to [0, max_m].
* expected_m: a hint of the typical valid rows per expert for the schedule choice (default max_m).
* returns (E, max_m, N); rows at or past masked_m[e] are unspecified.

The torch references (`*_reference`) compute the same products in fp32 from the dequantized inputs.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.quantize.ops import BLOCK, dequantize_1x128, dequantize_128x128
from cute_kernels.torch_ops import call, register_op

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
OUT_TORCH = (torch.bfloat16, torch.float16)


def _blocks(x: int) -> int:
    return -(-x // BLOCK)


def _check_operand(name, t, dims: str):
    """An e4m3 CUDA tensor with the dims named in `dims` ("M, K", "E, N, K", ...)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
    if t.dtype != E4M3:
        raise TypeError(f"{name} has dtype {t.dtype}; expected torch.float8_e4m3fn (quantize it with "
                        f"ck.quantize_1x128 / ck.quantize_128x128)")
    if t.dim() != dims.count(",") + 1:
        raise ValueError(f"{name} must be {dims.count(',') + 1}-D ({dims}), got shape {tuple(t.shape)}")


def _check_aux(name, t, dtype, shape, what, device):
    """A side tensor (scales, expert ids, counts) of an exact dtype and shape on a's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}; expected {dtype} ({what})")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} ({what}), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but a is on {device}")


def _check_scale(name, s, shape, what, device):
    _check_aux(name, s, torch.float32, shape, what, device)


def _check(a, sa, b, sb, out_dtype):
    _check_operand("a", a, "M, K")
    _check_operand("b", b, "N, K")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)}: K differs ({a.shape[1]} vs {b.shape[1]}); "
                         "b is (N, K), the weight as stored")
    m, k = a.shape
    n = b.shape[0]
    _check_scale("sa", sa, (m, _blocks(k)), "one per row of a per 128 columns", a.device)
    _check_scale("sb", sb, (_blocks(n), _blocks(k)), "one per 128 x 128 block of b", a.device)
    if out_dtype is not None and out_dtype not in OUT_TORCH:
        raise TypeError(f"out_dtype must be bfloat16, float16 or None, got {out_dtype}")


# --- layouts the kernel reads -------------------------------------------------------------------
def tma_aligned_scales(sa: torch.Tensor) -> torch.Tensor:
    """sa (M, KB), or (L, M, KB) for a batch of them (grouped GEMMs), as the kernel reads it: unit
    stride along M, K-block stride a multiple of 4 elements (16 bytes) and at least M, batch stride
    a multiple of 4, 16-byte aligned base. Returns sa itself when it already is, else a copy
    (DeepGEMM's `get_mn_major_tma_aligned_tensor`)."""
    m, kb = sa.shape[-2:]
    if (sa.stride(-2) == 1 and sa.stride(-1) % 4 == 0 and sa.stride(-1) >= m and sa.data_ptr() % 16 == 0
            and (sa.dim() == 2 or sa.stride(0) % 4 == 0)):
        return sa
    mp = -(-m // 4) * 4
    buf = torch.empty(*sa.shape[:-2], kb, mp, dtype=sa.dtype, device=sa.device)
    buf[..., :m] = sa.transpose(-1, -2)
    return buf[..., :m].transpose(-1, -2)


def _k_major(x: torch.Tensor) -> torch.Tensor:
    """x (rows, K) with unit stride along K, a 16-byte aligned row stride and base (TMA's rules),
    copied (K zero-padded to a multiple of 16) when it is not."""
    rows, k = x.shape
    if x.stride(1) == 1 and x.stride(0) % 16 == 0 and k % 16 == 0 and x.data_ptr() % 16 == 0:
        return x
    kp = -(-k // 16) * 16
    buf = torch.zeros(rows, kp, dtype=x.dtype, device=x.device)
    buf[:, :k] = x
    return buf


def _as3(x: torch.Tensor) -> torch.Tensor:
    """(rows, cols) -> (rows, cols, 1) with a batch stride TMA accepts (never followed)."""
    return x.unsqueeze(-1).as_strided((*x.shape, 1), (*x.stride(), 16 * (x.shape[0] + x.shape[1]) * 4))


def _compiled(out_dtype, sched, device, **options):
    """(the kernel for `sched` from the compile cache, the device's SMs). `options`: the catalogue's grouping and
    promotion options; those off (False, or no grouping) are left to their defaults."""
    from cute_kernels.fp8_gemm import FP8_GEMM
    from schedules.hardware import num_sms

    fn = FP8_GEMM.compiled(sched, out_dtype=dtypes.name_of(out_dtype), **{k: v for k, v in options.items() if v})
    return fn, num_sms(device)


# B scales from global one K-block ahead (`sb_ahead`): off until the H200 has run its bitwise tests and the
# suite's "ours sb ahead" column (at M = 64 / 128 every K-block's promotion waited for the
# L2 latency of its own B-scale load; 320-370 ns a K-block at 64x7168x16384 and 64x2112x7168 alike).
SB_AHEAD_DEFAULT = False


def _fp8_gemm_cuda(a, sa, b, sb, out_dtype=None, schedule=None, promote_overlap=None, sb_smem=None,
                   wg_turns=False, promote_halves=False, sb_ahead=None):
    """The op's CUDA body. Options (catalogue `fp8_gemm`): `schedule` (any
    `schedules.fp8_gemm.fp8_schedule`, e.g. the wide 128x192), `promote_overlap` (None: on with `sb_ahead`
    where `schedules.fp8_gemm.small_m_promotion` says, M <= 128 and K >= 1024; else off),
    `promote_halves` (each K-block's WGMMAs in two column halves, one promoted while the other runs;
    default off, any tile: the wide ones included),
    `wg_turns` (cooperative: K-block WGMMAs issued in turn by the two warpgroups; default off),
    `sb_smem` (B scales staged in smem per tile; None: `schedules.fp8_gemm.use_sb_smem` decides,
    on for cooperative tiles at M >= 1024; K > 65536 runs without it: same bits), `sb_ahead` (B scales read
    from global one K-block ahead where they are not staged; None: SB_AHEAD_DEFAULT)."""
    from schedules.fp8_gemm import SB_SMEM_MAX_K, default_fp8_schedule, small_m_promotion, use_sb_smem
    from schedules.gemm import launch_clusters

    _check(a, sa, b, sb, out_dtype)
    out_dtype = out_dtype or torch.bfloat16
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=out_dtype, device=a.device)
    if k == 0:
        return torch.zeros(m, n, dtype=out_dtype, device=a.device)
    a, b = _k_major(a), _k_major(b)
    sa = tma_aligned_scales(sa)
    npad = -(-n // 8) * 8
    out = torch.empty(m, npad, dtype=out_dtype, device=a.device)
    d = out[:, :n] if npad != n else out
    # promote_overlap is built for the 64/128-column tiles only: its default search leaves the wide ones out
    # (the promotion options asked for explicitly: a default they are built for, not the interleaved small-grid one)
    plain = not (promote_overlap or promote_halves or wg_turns or sb_smem)
    sched = schedule or default_fp8_schedule(m, n, k, wide=False if promote_overlap else None, interleave=plain)
    if sched.a_rows and m > sched.a_rows:
        raise ValueError(f"schedule {sched}: a_rows {sched.a_rows} loads only A's first {sched.a_rows} rows; got "
                         f"{m} rows")
    if sched.split_k > 1:  # at most one split per 128-deep K-block
        from schedules.gemm import clamp_splits

        sched = clamp_splits(sched, k)
    if promote_overlap is None:  # the small-M default: overlap with the scales a K-block ahead
        promote_overlap = small_m_promotion(sched, m, k) and not (promote_halves or wg_turns)
        if promote_overlap and sb_ahead is None:
            sb_ahead = True
    if sb_smem is None:
        sb_smem = use_sb_smem(sched, m)
    sb_smem = sb_smem and k <= SB_SMEM_MAX_K
    if sb_ahead is None:
        sb_ahead = SB_AHEAD_DEFAULT
    sb_ahead = sb_ahead and not (sb_smem or promote_halves)  # scales from global only
    fn, sms = _compiled(out_dtype, sched, a.get_device(), promote_overlap=promote_overlap, sb_smem=sb_smem,
                        wg_turns=wg_turns and sched.kind == "cooperative", promote_halves=promote_halves,
                        sb_ahead=sb_ahead)
    max_clusters = launch_clusters(-(-m // sched.tile_m), -(-n // sched.tile_n), 1, sched, sms, a.get_device())
    if sched.split_k > 1:  # one launch: each split promotes its K-blocks, the last split of a tile sums
        from cute_kernels.gemm.ops import split_buffers

        ws, flags = split_buffers(sched, 1, m, npad, a.device)
        fn(_as3(a), _as3(b), out.unsqueeze(-1), _as3(sa), _as3(sb), ws.permute(1, 2, 0), flags, max_clusters)
        return d
    fn(_as3(a), _as3(b), _as3(d), _as3(sa), _as3(sb), max_clusters)
    return d


def _fp8_gemm_fake(a, sa, b, sb, out_dtype=None):
    _check(a, sa, b, sb, out_dtype)
    return torch.empty(a.shape[0], b.shape[0], dtype=out_dtype or torch.bfloat16, device=a.device)


register_op("cute_kernels::fp8_gemm", "(Tensor a, Tensor sa, Tensor b, Tensor sb, ScalarType? out_dtype=None) -> Tensor",
            _fp8_gemm_cuda, _fp8_gemm_fake)


def fp8_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
             out_dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """(a * sa) @ (b * sb)^T: a (M, K) and b (N, K) float8_e4m3fn, sa (M, ceil(K/128)) and
    sb (ceil(N/128), ceil(K/128)) float32 block scales; returns (M, N) `out_dtype`."""
    return call("cute_kernels::fp8_gemm", a, sa, b, sb, out_dtype)


# --- grouped (MoE): one weight per expert, only M grouped ----------------------------------------
from schedules.fp8_gemm import M_ALIGN  # noqa: E402,F401  (re-exported: the contiguous layout's row alignment)


# --- validation (shared by the real and fake implementations) -----------------------------------
def _check_weights(a, b, sb):
    """b (E, N, K) against a (..., K); returns (E, N, K)."""
    _check_operand("b", b, "E, N, K")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    e, n, k = b.shape
    if a.shape[-1] != k:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)}: K differs ({a.shape[-1]} vs {k}); "
                         "b is (E, N, K), each expert's weight as stored")
    _check_scale("sb", sb, (e, _blocks(n), _blocks(k)), "one per 128 x 128 block of each expert's b", a.device)
    return e, n, k


def _check_out(out_dtype):
    if out_dtype is not None and out_dtype not in OUT_TORCH:
        raise TypeError(f"out_dtype must be bfloat16, float16 or None, got {out_dtype}")


def _check_contiguous(a, sa, b, sb, m_indices, out_dtype):
    _check_operand("a", a, "M, K")
    e, n, k = _check_weights(a, b, sb)
    m = a.shape[0]
    _check_scale("sa", sa, (m, _blocks(k)), "one per row of a per 128 columns", a.device)
    _check_aux("m_indices", m_indices, torch.int32, (m,), "the expert of each row of a, -1 for padding", a.device)
    _check_out(out_dtype)
    return m, n, k, e


def _check_masked(a, sa, b, sb, masked_m, expected_m, out_dtype):
    _check_operand("a", a, "E, max_m, K")
    e, n, k = _check_weights(a, b, sb)
    if a.shape[0] != e:
        raise ValueError(f"a has {a.shape[0]} experts (dim 0) but b has {e}")
    max_m = a.shape[1]
    _check_scale("sa", sa, (e, max_m, _blocks(k)), "one per row of a per 128 columns", a.device)
    _check_aux("masked_m", masked_m, torch.int32, (e,), "the valid rows of each expert", a.device)
    if expected_m is not None and (not isinstance(expected_m, int) or expected_m < 0):
        raise ValueError(f"expected_m must be a non-negative int or None, got {expected_m!r}")
    _check_out(out_dtype)
    return e, max_m, n, k


# --- layouts the kernel reads -------------------------------------------------------------------
def _k_major3(x: torch.Tensor) -> torch.Tensor:
    """x (L, rows, K) with unit stride along K and 16-byte aligned strides and base (TMA's rules),
    copied (K zero-padded to a multiple of 16) when it is not."""
    if x.stride(2) == 1 and x.stride(1) % 16 == 0 and x.stride(0) % 16 == 0 and x.shape[2] % 16 == 0 \
            and x.data_ptr() % 16 == 0:
        return x
    kp = -(-x.shape[2] // 16) * 16
    buf = torch.zeros(*x.shape[:2], kp, dtype=x.dtype, device=x.device)
    buf[..., : x.shape[2]] = x
    return buf


def _per_expert(x: torch.Tensor) -> torch.Tensor:
    """(E, rows, cols) -> the kernel's (rows, cols, E) view (no copy)."""
    return x.permute(1, 2, 0)


# --- contiguous ---------------------------------------------------------------------------------
# Grouped GEMMs stage B-scale rows in smem by the dense op's rule (H200: the bitwise tests
# `test_*_sb_smem_bitwise` pass; contiguous 4x8192 994 -> 1059 TFLOP/s, masked 1x1024 1096 -> 1191,
# 4x256 1049 -> 1129, uneven 8 experts 963 -> 1050). False: B scales read from global as before.
GROUPED_SB_SMEM_DEFAULT = True


def _sb_smem(sched, rows: int, k: int, sb_smem) -> bool:
    """Whether a grouped GEMM stages its tiles' B-scale rows in shared memory: `sb_smem` if given, else
    (with GROUPED_SB_SMEM_DEFAULT) the dense op's rule (`schedules.fp8_gemm.use_sb_smem` at M = the rows
    computed). Each tile stages the rows of its own expert (`BlockScales.load_row` reads the tile's
    batch index); a schedule that cannot stage them (ping-pong) never does."""
    from schedules.fp8_gemm import SB_SMEM_MAX_K, sb_smem_error, use_sb_smem

    if sb_smem is None:
        sb_smem = GROUPED_SB_SMEM_DEFAULT and use_sb_smem(sched, rows)
    return sb_smem and sb_smem_error(sched) is None and k <= SB_SMEM_MAX_K


def _contiguous_cuda(a, sa, b, sb, m_indices, out_dtype=None, schedule=None, sb_smem=None):
    from schedules.fp8_gemm import default_grouped_schedule
    from schedules.gemm import launch_clusters

    m, n, k, e = _check_contiguous(a, sa, b, sb, m_indices, out_dtype)
    out_dtype = out_dtype or torch.bfloat16
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=out_dtype, device=a.device)
    if k == 0 or e == 0:
        return torch.zeros(m, n, dtype=out_dtype, device=a.device)
    a, b = _k_major(a), _k_major3(b)
    sa = tma_aligned_scales(sa)
    npad = -(-n // 8) * 8
    out = torch.empty(m, npad, dtype=out_dtype, device=a.device)
    d = out[:, :n] if npad != n else out
    sched = schedule or default_grouped_schedule("contiguous", m, n, k)
    fn, sms = _compiled(out_dtype, sched, a.get_device(), grouping="contiguous", sb_smem=_sb_smem(sched, m, k, sb_smem))
    max_clusters = launch_clusters(-(-m // sched.tile_m), -(-n // sched.tile_n), 1, sched, sms, a.get_device())
    fn(_as3(a), _per_expert(b), _as3(d), _as3(sa), _per_expert(sb), m_indices.contiguous(), max_clusters)
    return d


def _contiguous_fake(a, sa, b, sb, m_indices, out_dtype=None):
    m, n, _, _ = _check_contiguous(a, sa, b, sb, m_indices, out_dtype)
    return torch.empty(m, n, dtype=out_dtype or torch.bfloat16, device=a.device)


register_op("cute_kernels::fp8_gemm_grouped_contiguous",
            "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor m_indices, ScalarType? out_dtype=None) -> Tensor",
            _contiguous_cuda, _contiguous_fake)


def fp8_gemm_grouped_contiguous(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                                m_indices: torch.Tensor, out_dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """Row r of the result is (a[r] * sa[r]) @ (b[m_indices[r]] * sb[m_indices[r]])^T: a (M, K) and
    b (E, N, K) float8_e4m3fn, sa (M, ceil(K/128)), sb (E, ceil(N/128), ceil(K/128)) float32,
    m_indices (M,) int32 (experts' rows 128-aligned, -1 padding); returns (M, N) `out_dtype`."""
    return call("cute_kernels::fp8_gemm_grouped_contiguous", a, sa, b, sb, m_indices, out_dtype)


# --- contiguous, SwiGLU + 1x128 quantization fused ------------------------------------------------
# The gate / up pair's exchange (`schedules.fp8_gemm.GLU_EXCHANGES`) and its ring: "halves" (two round trips) with 4
# epilogue buffers, 5 stages. perf/lab/moe_ab.py (H100, us, T4096 E256 / T16384 E256 / T4096 E64): halves at 5
# stages 3882 / 7775 / 1938, halves at 6 (3 buffers) 4168 / 9309 / 1937, full (one round trip, 5 stages) 3836 / 7930
# / 1952; the plain wide-tile GEMM 4346 / 7181 / 1790 plus swiglu_quantize 224 / 569 / 141. "local" (no pair: a
# 128 x 256 tile a CTA, its halves promoted one after the other) is built and compile-checked, not yet timed.
GLU_EXCHANGE_DEFAULT = "halves"


def _glu_outputs(m, i, device):
    """q (M, I) e4m3 and its scales (M, ceil(I/128)) fp32 in `quantize_1x128`'s layout (unit stride along M, the
    column stride M rounded up to 4)."""
    mp = -(-m // 4) * 4
    return (torch.empty(m, i, dtype=torch.float8_e4m3fn, device=device),
            torch.empty_strided((m, _blocks(i)), (1, mp), dtype=torch.float32, device=device))


def _glu_contiguous_fake(a, sa, b, sb, m_indices):
    m, n, _, _ = _check_contiguous(a, sa, b, sb, m_indices, None)
    if n % 2:
        raise ValueError(f"b's rows must be an even count (gate rows, then as many up rows), got N = {n}")
    return _glu_outputs(m, n // 2, a.device)


def _glu_contiguous_cuda(a, sa, b, sb, m_indices, schedule=None, exchange=None):
    """The fused kernel where I (N / 2) is a multiple of 128 and K > 0: a 1x2 cluster's CTAs compute a gate and an
    up tile of the same rows (`Gemm(glu_quant=True)`); elsewhere the two ops it fuses, with the same bits."""
    from cute_kernels.swiglu.ops import swiglu_quantize
    from schedules.fp8_gemm import GQ_TILE, fp8_schedule
    from schedules.gemm import launch_clusters

    m, n, k, e = _check_contiguous(a, sa, b, sb, m_indices, None)
    i = n // 2
    if n % (2 * GQ_TILE) or k == 0 or e == 0 or m == 0:
        if n % 2:
            raise ValueError(f"b's rows must be an even count (gate rows, then as many up rows), got N = {n}")
        h = _contiguous_cuda(a, sa, b, sb, m_indices)
        return swiglu_quantize(h[:, :i], h[:, i:])
    q, qs = _glu_outputs(m, i, a.device)
    a, b = _k_major(a), _k_major3(b)
    sa = tma_aligned_scales(sa)
    exchange = exchange or GLU_EXCHANGE_DEFAULT
    local = exchange == "local"  # one CTA a gate + up column block pair (128 x 256), promoted in sequential halves
    sched = schedule or (fp8_schedule("cooperative", GQ_TILE, 2 * GQ_TILE, cluster_m=1, cluster_n=1, epi_stages=2)
                         if local else fp8_schedule("cooperative", GQ_TILE, GQ_TILE, cluster_m=1, cluster_n=2,
                                                    epi_stages=4))
    fn, sms = _compiled(torch.bfloat16, sched, a.get_device(), grouping="contiguous", glu_quant=True,
                        sb_smem=_sb_smem(sched, m, k, None), glu_exchange=exchange if exchange != "halves" else None,
                        promote_halves=local)
    max_clusters = launch_clusters(-(-m // GQ_TILE), n // sched.tile_n, 1, sched, sms, a.get_device())
    fn(_as3(a), _per_expert(b), _as3(q), _as3(sa), _per_expert(sb), qs, m_indices.contiguous(), max_clusters)
    return q, qs


register_op("cute_kernels::fp8_gemm_grouped_contiguous_swiglu",
            "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor m_indices) -> (Tensor, Tensor)",
            _glu_contiguous_cuda, _glu_contiguous_fake)


def fp8_gemm_grouped_contiguous_swiglu(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                                       m_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An MoE expert's first GEMM with its SwiGLU and the next GEMM's 1x128 quantization fused: with h the
    `fp8_gemm_grouped_contiguous` product (bf16, (M, N)) of b (E, N, K) whose rows are the gate rows then the up
    rows (N = 2I), returns `swiglu_quantize(h[:, :I], h[:, I:])` bit for bit: q (M, I) float8_e4m3fn and its
    scales (M, ceil(I/128)) float32 in `quantize_1x128`'s layout, without h going through memory."""
    return call("cute_kernels::fp8_gemm_grouped_contiguous_swiglu", a, sa, b, sb, m_indices)


# --- masked -------------------------------------------------------------------------------------
def _masked_cuda(a, sa, b, sb, masked_m, expected_m=None, out_dtype=None, schedule=None, sb_smem=None):
    from schedules.fp8_gemm import default_grouped_schedule
    from schedules.gemm import launch_clusters

    e, max_m, n, k = _check_masked(a, sa, b, sb, masked_m, expected_m, out_dtype)
    out_dtype = out_dtype or torch.bfloat16
    if e == 0 or max_m == 0 or n == 0:
        return torch.empty(e, max_m, n, dtype=out_dtype, device=a.device)
    if k == 0:
        return torch.zeros(e, max_m, n, dtype=out_dtype, device=a.device)
    a, b = _k_major3(a), _k_major3(b)
    sa = tma_aligned_scales(sa)
    npad = -(-n // 8) * 8
    out = torch.empty(e, max_m, npad, dtype=out_dtype, device=a.device)
    d = out[..., :n] if npad != n else out
    expected = max_m if expected_m is None else min(max(expected_m, 1), max_m)
    sched = schedule or default_grouped_schedule("masked", expected, n, k, e)
    fn, sms = _compiled(out_dtype, sched, a.get_device(), grouping="masked",
                        sb_smem=_sb_smem(sched, e * expected, k, sb_smem))
    max_clusters = launch_clusters(-(-max_m // sched.tile_m), -(-n // sched.tile_n), e, sched, sms, a.get_device())
    fn(_per_expert(a), _per_expert(b), _per_expert(d), _per_expert(sa), _per_expert(sb), masked_m.contiguous(),
       max_clusters)
    return d


def _masked_fake(a, sa, b, sb, masked_m, expected_m=None, out_dtype=None):
    e, max_m, n, _ = _check_masked(a, sa, b, sb, masked_m, expected_m, out_dtype)
    return torch.empty(e, max_m, n, dtype=out_dtype or torch.bfloat16, device=a.device)


register_op("cute_kernels::fp8_gemm_grouped_masked",
            "(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor masked_m, int? expected_m=None, "
            "ScalarType? out_dtype=None) -> Tensor",
            _masked_cuda, _masked_fake)


def fp8_gemm_grouped_masked(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                            masked_m: torch.Tensor, expected_m: int | None = None,
                            out_dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """result[e, :masked_m[e]] = (a[e] * sa[e]) @ (b[e] * sb[e])^T over the first masked_m[e] rows:
    a (E, max_m, K), b (E, N, K) float8_e4m3fn, sa (E, max_m, ceil(K/128)), sb (E, ceil(N/128),
    ceil(K/128)) float32, masked_m (E,) int32 read on the device; returns (E, max_m, N)."""
    return call("cute_kernels::fp8_gemm_grouped_masked", a, sa, b, sb, masked_m, expected_m, out_dtype)


# --- torch references (fp32, on the dequantized inputs; they synchronize: tests only) -----------
def fp8_gemm_grouped_contiguous_reference(a, sa, b, sb, m_indices) -> torch.Tensor:
    """(M, N) fp32: row r = dequant(a)[r] @ dequant(b[m_indices[r]])^T; rows of padding (or of an
    expert outside [0, E)) are 0."""
    x = dequantize_1x128(a, sa)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for e in range(b.shape[0]):
        rows = (m_indices == e).nonzero().flatten()
        if rows.numel():
            out[rows] = x[rows] @ dequantize_128x128(b[e], sb[e]).t()
    return out


def fp8_gemm_grouped_masked_reference(a, sa, b, sb, masked_m) -> torch.Tensor:
    """(E, max_m, N) fp32: expert e's first masked_m[e] rows = dequant(a[e]) @ dequant(b[e])^T,
    the rest 0."""
    e_count, max_m, _ = a.shape
    out = torch.zeros(e_count, max_m, b.shape[1], dtype=torch.float32, device=a.device)
    for e, rows in enumerate(masked_m.tolist()):
        rows = min(max(rows, 0), max_m)
        if rows:
            out[e, :rows] = dequantize_1x128(a[e, :rows], sa[e, :rows]) @ dequantize_128x128(b[e], sb[e]).t()
    return out


def contiguous_layout(rows_per_expert: list[int], align: int = 128) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """m_indices (int32, CPU) for experts with these row counts, each padded to `align` rows with -1,
    and each expert's (first row, rows) in it: how a caller builds the contiguous layout."""
    idx, spans = [], []
    for e, rows in enumerate(rows_per_expert):
        spans.append((len(idx), rows))
        padded = -(-rows // align) * align
        idx += [e] * rows + [-1] * (padded - rows)
    return torch.tensor(idx, dtype=torch.int32), spans
