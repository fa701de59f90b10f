"""The benchmark suite of the QAT family (lesson 17): fake-quant forward and STE backward, the learnable backward, the
fused observer and `QATLinear`, against torch's own ops (eager) and torch.compile of them.

Same conventions as every suite (`cute_kernels.bench`): CUDA-event medians with L2 flushed, TB/s over the bytes each
case must move (our floor: x read and y written, plus the packed STE mask, 1/8 byte an element; the learnable
backward x, dy read and dx written; the observer two reads of x and one write), % of the copy ceiling measured in
the same run, ratios (> 1: ours faster). torch's forwards also write a bool mask (1 byte an element) and its
learnable backward three full fp32 tensors, which is most of what the ratios measure. The per-group and e4m3 modes
have no torch op: their reference is the torch composite (`reference.fake_quant`), eager and compiled.
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


def _row(rows, case, dt, shape, nbytes, ours, refs, copy_bw):
    H.progress(f"  {case} {H.dtype_name(dt)} {shape}")
    t = H.do_bench(ours)["median_ms"]
    r = {k: H.do_bench(f)["median_ms"] for k, f in refs.items()}
    rows.append(H.Row(case, H.dtype_name(dt), "x".join(map(str, shape)), nbytes, 0, t, r, "copy", copy_bw))


def qat(shapes=None, dtypes=(torch.bfloat16, torch.float32), quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.qat import reference as R

    A = torch.ops.aten
    C = torch.ops.cute_kernels
    run_linear = shapes is None
    shapes = shapes or ([(8192, 8192)] if quick else [(4096, 8192), (8192, 8192), (16384, 16384)])
    copy_bw = ceilings["copy"]
    rows = []
    fq_pt = H.compiled(lambda x, s, z: torch.fake_quantize_per_tensor_affine(x, s, z, -128, 127))
    fq_pc = H.compiled(lambda x, s, z: torch.fake_quantize_per_channel_affine(x, s, z, 0, -128, 127))
    ste = H.compiled(lambda g, m: g * m)
    grp = H.compiled(lambda x, s: R.fake_quant(x, s, None, -8, 7, group_size=128)[0])
    e4 = H.compiled(lambda x, s: R.fake_quant(x, s, None, -448, 448, qtype="e4m3")[0])
    for dt in dtypes:
        for shape in shapes:
            if dt == torch.float32 and shape[0] * shape[1] > 8192 * 8192:
                continue
            x = H.randn(*shape, dtype=dt, seed=1)
            g = H.randn(*shape, dtype=dt, seed=2)
            n, es = x.numel(), x.element_size()
            m_bytes = -(-n // 8)
            fq = 2 * n * es + m_bytes
            s0 = float(x.float().abs().amax()) / 127
            sc = (x.float().abs().amax(1) / 127).clamp_min(1e-8)
            zc = torch.zeros(shape[0], dtype=torch.int32, device="cuda")
            _, mask = C.fake_quant_scalar(x, s0, 0, -128, 127, "int", True)
            tmask = A.fake_quantize_per_tensor_affine_cachemask(x, s0, 0, -128, 127)[1]
            _row(
                rows,
                "fq.fwd.tensor",
                dt,
                shape,
                fq,
                lambda: C.fake_quant_scalar(x, s0, 0, -128, 127, "int", True),
                {
                    "torch": lambda: A.fake_quantize_per_tensor_affine_cachemask(x, s0, 0, -128, 127),
                    "torch.compile": lambda: fq_pt(x, s0, 0),
                },
                copy_bw,
            )
            _row(
                rows,
                "fq.fwd.channel",
                dt,
                shape,
                fq,
                lambda: C.fake_quant(x, sc, zc, -128, 127, 0, None, "int", None, True),
                {
                    "torch": lambda: A.fake_quantize_per_channel_affine_cachemask(x, sc, zc, 0, -128, 127),
                    "torch.compile": lambda: fq_pc(x, sc, zc),
                },
                copy_bw,
            )
            _row(
                rows,
                "fq.bwd",
                dt,
                shape,
                fq,
                lambda: C.fake_quant_backward(g, mask),
                {
                    "torch": lambda: A.fake_quantize_per_tensor_affine_cachemask_backward(g, tmask),
                    "torch.compile": lambda: ste(g, tmask),
                },
                copy_bw,
            )
            sg = (x.float().reshape(-1, 128).abs().amax(1) / 7).clamp_min(1e-8)
            _row(
                rows,
                "fq.fwd.group128.int4",
                dt,
                shape,
                fq,
                lambda: C.fake_quant(x, sg, None, -8, 7, None, 128, "int", None, True),
                {
                    "torch": lambda: R.fake_quant(x, sg, None, -8, 7, group_size=128),
                    "torch.compile": lambda: grp(x, sg),
                },
                copy_bw,
            )
            se = torch.tensor(s0 * 127 / 448, device="cuda")
            _row(
                rows,
                "fq.fwd.e4m3",
                dt,
                shape,
                fq,
                lambda: C.fake_quant(x, se, None, -448, 448, None, None, "e4m3", None, True),
                {
                    "torch": lambda: R.fake_quant(x, se, None, -448, 448, qtype="e4m3"),
                    "torch.compile": lambda: e4(x, se),
                },
                copy_bw,
            )
            # learnable backward (torch's per-tensor op takes fp32 only)
            st = torch.tensor([s0], device="cuda")
            zt = torch.tensor([0.3], device="cuda")
            zcf = torch.zeros(shape[0], device="cuda")
            lb = 3 * n * es
            if dt == torch.float32:
                _row(
                    rows,
                    "learnable.bwd.tensor",
                    dt,
                    shape,
                    lb,
                    lambda: C.fake_quant_learnable_backward(g, x, st, zt, -128, 127, None, None, 1.0),
                    {
                        "torch": lambda: A._fake_quantize_learnable_per_tensor_affine_backward(
                            g, x, st, zt, -128, 127, 1.0
                        )
                    },
                    copy_bw,
                )
            theirs = {
                "torch": lambda: A._fake_quantize_learnable_per_channel_affine_backward(
                    g, x, sc, zcf, 0, -128, 127, 1.0
                )
            }
            _row(
                rows,
                "learnable.bwd.channel",
                dt,
                shape,
                lb,
                lambda: C.fake_quant_learnable_backward(g, x, sc, zcf, -128, 127, 0, None, 1.0),
                theirs if _runs(theirs["torch"]) else {},
                copy_bw,
            )
            # the fused observer: each side keeps its own state (updated every call)
            on = torch.ones(1, dtype=torch.long, device="cuda")

            def state(c):
                return [
                    torch.full((c,), float("inf"), device="cuda"),
                    torch.full((c,), float("-inf"), device="cuda"),
                    torch.ones(c, device="cuda"),
                    torch.zeros(c, dtype=torch.int32, device="cuda"),
                ]

            ob = 3 * n * es + m_bytes
            for per_row, c in ((False, 1), (True, shape[0])):
                ours_s, theirs_s = state(c), state(c)
                xr = x.detach().requires_grad_()  # (the training forward: the STE mask is kept)
                theirs = {
                    "torch": lambda: torch._fused_moving_avg_obs_fq_helper(
                        xr, on, on, *theirs_s, 0.01, -128, 127, 0, per_row, per_row
                    )
                }
                _row(
                    rows,
                    f"observer.{'channel' if per_row else 'tensor'}",
                    dt,
                    shape,
                    ob,
                    lambda: ck.fake_quant_observed(xr, on, on, *ours_s, 0.01, -128, 127, 0, per_row, per_row),
                    theirs if _runs(theirs["torch"]) else {},
                    copy_bw,
                )  # (torch's op: fp32 x only)
    extra = _qat_linear(rows, copy_bw) if run_linear else {}
    checks = _checks(rows, extra)
    return rows, ["torch", "torch.compile"], checks, "", extra


def _runs(fn) -> bool:
    """Whether a torch reference runs for these operands (older torch: no bf16 learnable per-channel backward)."""
    try:
        fn()
        return True
    except RuntimeError:
        return False


def _qat_linear(rows, copy_bw, m=4096, k=4096, n=4096):
    """QATLinear (training mode: both observers on, the STE masks kept) against its GEMM alone."""
    import cute_kernels as ck
    from cute_kernels.qat import QATLinear

    lin = QATLinear(k, n, bias=True, device="cuda", dtype=torch.bfloat16).train()
    x = H.randn(m, k, dtype=torch.bfloat16, seed=5).requires_grad_()
    w = lin.weight.detach()
    H.progress(f"  qat_linear {m}x{k}x{n}")
    t = H.do_bench_interleaved({"qat": lambda: lin(x), "gemm": lambda: ck.gemm(x.detach(), w.t(), lin.bias.detach())})
    fq_bytes = (3 * (m * k + n * k)) * 2 + (m * k + n * k) // 8
    rows.append(
        H.Row(
            "qat_linear.fwd",
            "bf16",
            f"{m}x{k}x{n}",
            fq_bytes,
            0,
            t["qat"]["median_ms"],
            {},
            "copy",
            copy_bw,
            note="bytes: the two fake-quants' floor; time: the whole layer",
        )
    )
    return {
        "qat_linear": {
            "qat_ms": t["qat"]["median_ms"],
            "gemm_ms": t["gemm"]["median_ms"],
            "overhead": t["qat"]["median_ms"] / t["gemm"]["median_ms"] - 1,
        }
    }


def _checks(rows, extra):
    checks = []
    big = [r for r in rows if r.bytes >= 2 * 64 * MiB and not r.case.startswith("qat_linear")]
    fw = H.worst(big, lambda r: r.case.startswith("fq."))
    if fw:
        checks.append(
            {
                "target": "fake-quant fwd / STE bwd >= 90% of copy bandwidth (>= 64 MiB tensors)",
                "measured": f"min {fw.pct_ceiling:.1f}% ({fw.case} {fw.dtype} {fw.shape})",
                "ok": fw.pct_ceiling >= 90.0,
            }
        )
    lw = H.worst(big, lambda r: r.case.startswith(("learnable.", "observer.")))
    if lw:
        checks.append(
            {
                "target": "learnable bwd / observer >= 90% of copy bandwidth (>= 64 MiB tensors)",
                "measured": f"min {lw.pct_ceiling:.1f}% ({lw.case} {lw.dtype} {lw.shape})",
                "ok": lw.pct_ceiling >= 90.0,
            }
        )
    plain = [r for r in rows if r.case in ("fq.fwd.tensor", "fq.fwd.channel", "fq.bwd")]
    if plain:
        w = min(plain, key=lambda r: r.ratio("torch"))
        checks.append(
            {
                "target": ">= 1.0x torch's plain fake-quant ops (fwd cachemask, STE bwd)",
                "measured": f"min {w.ratio('torch'):.3f}x ({w.case} {w.dtype} {w.shape})",
                "ok": w.ratio("torch") >= 1.0,
            }
        )
    fused = [r for r in rows if r.case.startswith(("learnable.", "observer.")) and "torch" in r.refs_ms]
    if fused:
        w = min(fused, key=lambda r: r.ratio("torch"))
        checks.append(
            {
                "target": ">= 3x torch's learnable backward and fused-observer paths",
                "measured": f"min {w.ratio('torch'):.3f}x ({w.case} {w.dtype} {w.shape})",
                "ok": w.ratio("torch") >= 3.0,
            }
        )
    ql = extra.get("qat_linear")
    if ql:
        checks.append(
            {
                "target": "QATLinear fake-quant overhead <= 25% of its GEMM (4096^3, training)",
                "measured": f"{100 * ql['overhead']:.1f}% ({ql['qat_ms']:.4f} vs {ql['gemm_ms']:.4f} ms)",
                "ok": ql["overhead"] <= 0.25,
            }
        )
    return checks


SUITES = {"qat": qat}
PEERS: dict[str, tuple[str, ...]] = {"qat": ()}
