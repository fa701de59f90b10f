"""Run one op a few times on randn data: a target for `ncu` and `compute-sanitizer`.

    python3 -m perf.probe add bf16 268435456
    python3 -m perf.probe row_sum bf16 65536 8192
    python3 -m perf.probe torch.add bf16 524288      (torch's kernel, for comparison)
    python3 -m perf.probe gemm bf16 8192 8192 8192   (torch.mm for cuBLAS, quack.gemm for QuACK)
    python3 -m perf.probe fp8_gemm e4m3 4096 7168 16384   (torch.fp8_gemm: cuBLAS blockwise)
    python3 -m perf.probe flash_attn bf16 2 8192 16 128 [causal]   (fa4.flash_attn, sdpa.flash_attn, flash_attn_fp8[.head],
                                                                     flash_attn.double_p,
                                                                     flash_attn.with:stages=2,pingpong=False)
    python3 -m perf.probe flash_attn_bwd bf16 2 8192 16 128 [causal]   (the backward op on a forward's O / LSE;
                                       fa4.flash_attn_bwd, flash_attn_bwd.det, flash_attn_bwd.with:dq_buffers=2,...)
    python3 -m perf.probe flash_decode bf16 1 32768 32 8 128 [64]   (B L H_q H_kv D [page]: every sequence at L;
                                       sdpa.flash_decode (cuDNN, contiguous), flash_decode.with:tile_n=64,..., flash_decode.fp8head /
                                       .fp8token[.with:...]: an e4m3 cache)
    python3 -m perf.probe rms_norm bf16 2048 65536   (quack.rms_norm; also softmax, quack.softmax)
    python3 -m perf.probe transpose.tma fp32 16384 16384   (torch.transpose, compile.transpose; argmax,
                                                            torch.argmax, compile.argmax; gemv bf16 R C B)
    python3 -m perf.probe rmsnorm.bwd bf16 32768 4096   (any cute_kernels.rowwise.bench case, as the suite times
                                                         it; quack:rmsnorm.bwd, torch:..., torch.compile:...)
    python3 -m perf.probe voxelize.hard fp32 2000000 5   (voxelize.dynamic, voxel_scatter.mean|max|sum N C;
                                       moe_layer e4m3 T H I E k; qat_linear bf16 M K N, qat_linear.gemm)
"""

import os
import sys

import torch

import cute_kernels as ck
from cute_kernels.bench.harness import randn

MISC = ("argmax", "torch.argmax", "compile.argmax", "torch.transpose", "compile.transpose")  # + transpose.<variant>


def target(argv):
    """(the call, its dtype name, its shape) of a probe spec `op dtype dims... [causal]`: the op built on
    randn inputs, not yet run. `perf.clocks` times the same targets."""
    op, dt, *shape = argv
    causal = "causal" in shape
    shape = [int(s) for s in shape if s != "causal"]
    if op in ("fp8_gemm", "torch.fp8_gemm"):
        return _fp8(op, *shape), "e4m3", shape
    if op in LESSON_OPS:
        return _lesson(op, *shape), dt, shape
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
    col, _, case = op.rpartition(":")
    from cute_kernels.rowwise.bench import CASES

    if case in CASES:
        return _rowwise(col or "ours", case, dtype, *shape), dt, shape
    if "flash_decode" in op:
        return _decode(op, dtype, *shape), dt, shape
    if "flash_attn_bwd" in op:
        return _attention_bwd(op, dtype, causal, *shape), dt, shape + [causal]
    if "flash_attn" in op:
        return _attention(op, dtype, causal, *shape), dt, shape + [causal]
    if op in ("rms_norm", "quack.rms_norm", "softmax", "quack.softmax"):
        x = randn(*shape, dtype=dtype, seed=1)
        w = randn(shape[-1], dtype=dtype, seed=2)
        if op.startswith("quack"):
            from quack.rmsnorm import rmsnorm as qrms
            from quack.softmax import softmax as qsm

            return ((lambda: qrms(x, w, eps=1e-6)) if op.endswith("rms_norm") else (lambda: qsm(x))), dt, shape
        return ((lambda: ck.rms_norm(x, w, 1e-6)) if op == "rms_norm" else (lambda: ck.softmax(x))), dt, shape
    if op in ("gemm", "torch.mm", "quack.gemm"):
        m, n, k = shape
        a, b = randn(m, k, dtype=dtype, seed=1), randn(k, n, dtype=dtype, seed=2)
        if op == "quack.gemm":
            from quack.gemm_interface import gemm as qg  # patches CuTe classes: bench processes only

            return (lambda: qg(a, b)), dt, shape
        return ((lambda: ck.gemm(a, b)) if op == "gemm" else (lambda: torch.mm(a, b))), dt, shape
    if op in MISC or op.startswith("transpose."):
        return _misc(op, dtype, shape), dt, shape
    if op in ("llama_prefill", "llama_prefill.fp8", "llama_prefill.w4a16", "hf_prefill"):  # shape: B S
        return _llama(op, *shape), dt, shape
    if op.startswith("llama_decode"):  # llama_decode[.fp8|.w4a16][.eager] B ctx: one step (graph replay, or eager)
        return _llama_decode(op, *shape), dt, shape
    if op in ("swiglu.halves", "torch.swiglu.halves", "compile.swiglu.halves"):  # shape: T I (halves of (T, 2I))
        t, i = shape
        gu = randn(t, 2 * i, dtype=dtype, seed=1)
        if op == "swiglu.halves":
            return (lambda: ck.swiglu(gu[:, :i], gu[:, i:])), dt, shape
        glu = lambda z: (torch.nn.functional.silu(z[:, :i].float()) * z[:, i:].float()).to(z.dtype)  # noqa: E731
        return ((lambda: glu(gu)) if op.startswith("torch") else (lambda c=torch.compile(glu): c(gu))), dt, shape
    if op in ("gemm_w4a16", "tinygemm_w4a16"):  # shape: M N K [group]
        return _w4a16(op, dtype, *shape), dt, shape
    if op in ("gemv", "torch.gemv"):  # shape: rows cols batch (W rows x cols, x cols x batch)
        r, c, bt = shape
        w, v = randn(r, c, dtype=dtype, seed=1), randn(c, bt, dtype=dtype, seed=2)
        return ((lambda: ck.gemv(w, v)) if op == "gemv" else (lambda: torch.mm(w, v))), dt, shape
    x, y = randn(*shape, dtype=dtype, seed=1), randn(*shape, dtype=dtype, seed=2)
    f = {
        "copy": lambda: ck.copy(x),
        "add": lambda: ck.add(x, y),
        "axpby": lambda: ck.axpby(2.0, x, 0.5, y),
        "row_sum": lambda: ck.sum(x, dim=-1),
        "sum": lambda: ck.sum(x),
        "torch.copy": lambda: x.clone(),
        "torch.add": lambda: torch.add(x, y),
        "torch.sum": lambda: torch.sum(x),
    }[op]
    return f, dt, shape


def main(argv):
    f, dt, shape = target(argv)
    # PROBE_WARM=N: N untimed runs first (torch.compile's autotuning, JIT), then cudaProfilerStart, so
    # `ncu --profile-from-start off` (device_session.sh sets it with PROBE_WARM) sees only the runs below
    warm = int(os.environ.get("PROBE_WARM", "0"))
    for _ in range(warm):
        f()
    if warm:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    for _ in range(3):
        r = f()
    torch.cuda.synchronize()
    r = r[0] if isinstance(r, tuple) else r
    print(argv[0], dt, shape, "ok", None if r is None else float(r.float().sum()))  # a graph replay returns None


def _rowwise(col, case, dtype, m, n):
    """One column of a `cute_kernels.rowwise.bench` case (the forward, or the backward of a retained graph)."""
    from cute_kernels.rowwise.bench import _call, _fns

    fam, direction = case.split(".")
    x = randn(m, n, dtype=dtype, seed=21)
    t = torch.randint(0, n, (m,), device="cuda") if fam == "cross_entropy" else None
    dy = randn(m, n, dtype=dtype, seed=22) if direction == "bwd" else None
    return _call(case, _fns(case, n, dtype)[col], x, t, dy)


LESSON_OPS = ("voxelize.hard", "voxelize.dynamic", "voxel_scatter.mean", "voxel_scatter.max", "voxel_scatter.sum",
              "moe_layer", "moe_layer.unfused", "qat_linear", "qat_linear.gemm")


def _lesson(op, *shape):
    """The voxel, MoE-layer and QAT targets as their suites build them: voxelize.* N C (the suite's lidar cloud),
    voxel_scatter.<reduce> N C (64 features), moe_layer[.unfused] T H I E k (the contiguous layout), qat_linear M K N (training
    mode; qat_linear.gemm: its GEMM alone)."""
    if op.startswith("voxel"):
        from cute_kernels.voxel.bench import MAX_POINTS, MAX_VOXELS, POINT_RANGE, VOXEL_SIZE, lidar_cloud

        n, c = shape
        pts = lidar_cloud(n, c)
        if op == "voxelize.hard":
            return lambda: ck.voxelize(pts, VOXEL_SIZE, POINT_RANGE, MAX_POINTS, MAX_VOXELS)[0]
        coords = ck.voxelize(pts, VOXEL_SIZE, POINT_RANGE, mode="dynamic")
        if op == "voxelize.dynamic":
            return lambda: ck.voxelize(pts, VOXEL_SIZE, POINT_RANGE, mode="dynamic")
        feats = randn(n, 64, dtype=torch.float32, seed=3)
        return lambda: ck.voxel_scatter(feats, coords, op.split(".")[1])[0]
    if op.startswith("moe_layer"):
        from cute_kernels.moe import ops as moe_ops
        from cute_kernels.moe.bench import _experts

        t, h, i, e, k = shape
        w13, s13, w2, s2 = _experts(e, h, i)
        router = (randn(e, h, seed=4) * 0.05).bfloat16()
        x = randn(t, h, seed=5)

        def layer():
            moe_ops.FUSED_GLU = op == "moe_layer"  # .unfused: the first GEMM's bf16 output, then swiglu_quantize
            try:
                return ck.moe(x, router, w13, s13, w2, s2, k)
            finally:
                moe_ops.FUSED_GLU = True
        return layer
    from cute_kernels.qat import QATLinear

    m, k, n = shape
    lin = QATLinear(k, n, bias=True, device="cuda", dtype=torch.bfloat16).train()
    x = randn(m, k, dtype=torch.bfloat16, seed=5).requires_grad_()
    if op == "qat_linear.gemm":
        w, b, xd = lin.weight.detach(), lin.bias.detach(), x.detach()
        return lambda: ck.gemm(xd, w.t(), b)
    return lambda: lin(x)


def _misc(op, dtype, shape):
    """transpose.<variant> / argmax (ours), torch.transpose / torch.argmax (eager), compile.transpose /
    compile.argmax (torch.compile of the eager op); shape as the suites': (batch,) rows cols."""
    x = randn(*shape, dtype=dtype, seed=1)
    if op.startswith("transpose."):
        return lambda: ck.transpose(x, variant=op.split(".")[1])
    if op == "argmax":
        return lambda: ck.argmax(x, dim=-1)
    eager = (lambda t: t.transpose(-2, -1).contiguous()) if op.endswith("transpose") else (lambda t: t.argmax(-1))
    g = torch.compile(eager) if op.startswith("compile.") else eager
    return lambda: g(x)


def _w4a16(op, dtype, m, n, k, group=128):
    x, w = randn(m, k, dtype=dtype, seed=1), randn(n, k, dtype=dtype, seed=2)
    wp, s, z = ck.pack_int4(w, group)
    if op == "gemm_w4a16":
        return lambda: ck.gemm_w4a16(x, wp, s, z, group)
    from cute_kernels.w4a16.bench import _tinygemm

    tiny = _tinygemm(w, group)
    return lambda: tiny(x)


def _fp8(op, m, n, k):
    from cute_kernels.fp8_gemm.bench import _scaled_mm

    x, w = randn(m, k, dtype=torch.bfloat16, seed=1), randn(n, k, dtype=torch.bfloat16, seed=2)
    a, sa = ck.quantize_1x128(x)
    b, sb = ck.quantize_128x128(w)
    f = (lambda: ck.fp8_gemm(a, sa, b, sb)) if op == "fp8_gemm" else _scaled_mm(a, sa, b, sb)
    if f is None:
        raise ValueError("torch._scaled_mm refused the blockwise scales at this shape")
    return f


def _attention_bwd(op, dtype, causal, b, s, h, d):
    """The backward alone: ours called on a forward's O and LSE (`flash_attn_bwd.with:f=v,..` replaces fields of the
    default backward schedule; `.det` deterministic), or FA4's through autograd on a retained graph."""
    q, k, v = (randn(b, s, h, d, dtype=dtype, seed=i).requires_grad_() for i in (1, 2, 3))
    do = randn(b, s, h, d, dtype=dtype, seed=7)
    if op == "fa4.flash_attn_bwd":
        from flash_attn.cute.interface import flash_attn_func

        out = flash_attn_func(q, k, v, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    from cute_kernels.attention.ops import _flash_attn_bwd_cuda
    from schedules.attention_bwd import default_bwd_schedule

    sched = default_bwd_schedule(d, causal)
    if op.startswith("flash_attn_bwd.with:"):
        sched = schedule_with(sched, *op.split(":", 1)[1].split(","))
    o, lse = ck.flash_attn(q, k, v, causal=causal, return_lse=True)
    det = op == "flash_attn_bwd.det"
    return lambda: _flash_attn_bwd_cuda(do, q, k, v, o, lse, None, causal, deterministic=det, schedule=sched)


def schedule_with(schedule, *pairs: str):
    """`schedule` (a dataclass) with each `field=value` of `pairs` replaced (True / False, else an int)."""
    import dataclasses

    fields = dict(kv.split("=") for kv in pairs)
    return dataclasses.replace(schedule, **{f: (x == "True") if x in ("True", "False") else int(x) if x.isdigit() else x
                                            for f, x in fields.items()})


def _llama(op, b, s):
    """One prefill forward of the Llama-3-8B layer over B x S tokens: ours (bf16 / FP8 / W4A16 weights) or
    transformers' layer under torch.compile, random weights."""
    from cute_kernels.models.bench import _hf_layer
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer

    cfg = LlamaConfig()
    sd = random_state_dict(cfg)
    x = randn(b, s, cfg.hidden, dtype=torch.bfloat16, seed=7)
    if op == "hf_prefill":
        hf, rot = _hf_layer(cfg, sd)
        comp = torch.compile(hf)
        pos = torch.arange(s, device="cuda")[None].expand(b, -1)
        with torch.no_grad():
            pe = rot(x, pos)

        def f():
            with torch.no_grad():
                return comp(x, position_ids=pos, position_embeddings=pe)
        return f
    layer = LlamaDecoderLayer(cfg, op.partition(".")[2] or "bf16").load_hf_state_dict(sd)
    return lambda: layer(x)


def _llama_decode(op, b, ctx):
    """One decode step of the Llama-3-8B layer at B sequences of `ctx` cached tokens (the benchmark's session: the
    captured graph replayed, or with `.eager` the step run eagerly)."""
    from cute_kernels.models.bench import _session
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer

    parts = op.split(".")[1:]
    w = next((p for p in parts if p in ("fp8", "w4a16")), "bf16")
    cfg = LlamaConfig()
    layer = LlamaDecoderLayer(cfg, w).load_hf_state_dict(random_state_dict(cfg))
    sess = _session(layer, b, ctx)
    return (lambda: sess._step(advance=False)) if "eager" in parts else sess.graph.replay


def _decode(op, dtype, b, n, hq, hk, d, page=0):
    """Decode of q_len 1 against caches of L = n keys per sequence (contiguous, or pages of `page` in order)."""
    q = randn(b, 1, hq, d, dtype=dtype, seed=1)
    k, v = randn(b, n, hk, d, dtype=dtype, seed=2), randn(b, n, hk, d, dtype=dtype, seed=3)
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    if op == "sdpa.flash_decode":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def f():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
        return f
    table = None
    if page:
        table = torch.arange(b * (n // page), dtype=torch.int32, device="cuda").view(b, -1)
        k, v = k.view(-1, page, hk, d), v.view(-1, page, hk, d)
    scales = {}
    fp8 = "head" if ".fp8head" in op else "token" if ".fp8token" in op else None
    if fp8:  # flash_decode.fp8head / .fp8token[.with:...]: the cache as e4m3 with per-head / per-token scales
        from cute_kernels.attention.decode_ops import fp8_scale, to_fp8

        def quant(x):
            s = fp8_scale(x.float().abs().amax((0, 1, 3)) if fp8 == "head" else x.float().abs().amax(-1))
            return to_fp8(x, s[None, None, :, None] if fp8 == "head" else s[..., None]), s

        (k, ks), (v, vs) = quant(k), quant(v)
        scales = dict(k_scale=ks, v_scale=vs)
    if ".with:" in op:
        from cute_kernels.attention.decode_ops import _flash_attn_with_kvcache_cuda
        from schedules.decode import default_decode_schedule

        sched = schedule_with(default_decode_schedule(d, fp8 is not None, 1, hq // hk),
                              *op.split(":", 1)[1].split(","))
        return lambda: _flash_attn_with_kvcache_cuda(q, k, v, cache_seqlens=lens, block_table=table, schedule=sched,
                                                     **scales)
    return lambda: ck.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, **scales)


def _attention(op, dtype, causal, b, s, h, d):
    q, k, v = (randn(b, s, h, d, dtype=dtype, seed=i) for i in (1, 2, 3))
    if op == "flash_attn":
        return lambda: ck.flash_attn(q, k, v, causal=causal)
    if op in ("flash_attn_fp8", "flash_attn_fp8.head"):  # e4m3 operands with block (or per-head) scales
        args = ck.quantize_attention_fp8(q, k, v, "head" if op.endswith(".head") else "block")
        return lambda: ck.flash_attn_fp8(*args, causal=causal)
    if op == "flash_attn.double_p":  # the schedule option under test (docs/kernels/attention.md)
        from cute_kernels.attention.ops import _flash_attn_cuda
        from schedules.attention import AttentionSchedule, default_schedule

        sched = AttentionSchedule(tile_n=default_schedule(d).tile_n, overlap=True, double_p=True)
        return lambda: _flash_attn_cuda(q, k, v, causal, schedule=sched)
    if op.startswith("flash_attn.with:"):  # the default schedule with fields replaced: flash_attn.with:stages=2,...
        from cute_kernels.attention.ops import _flash_attn_cuda
        from schedules.attention import default_schedule

        sched = schedule_with(default_schedule(d, causal, k.shape[1]), *op.split(":", 1)[1].split(","))
        return lambda: _flash_attn_cuda(q, k, v, causal, schedule=sched)
    if op == "fa4.flash_attn":
        from flash_attn.cute.interface import flash_attn_func

        return lambda: flash_attn_func(q, k, v, causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return f


if __name__ == "__main__":
    main(sys.argv[1:])
