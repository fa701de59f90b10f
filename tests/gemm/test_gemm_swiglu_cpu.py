"""CPU: the fused SwiGLU GEMM's pieces that need no GPU: the gate / up interleave and its inverse, the schedule
rules of the gated epilogue (and the op's fallback choice), the registers each product reads (every thread's
gate and up columns are its own, for the MMA layouts the epilogue stores through), the compiled kernels' census,
and the layer's packed weight."""

import pytest
import torch

from cute_kernels.gemm.ops import _glu_halves, pack_gate_up
from schedules.gemm import GLU_BLOCK, GemmSchedule, adapted, call_schedule


def test_pack_and_halves_invert():
    wg, wu = torch.randn(48, 5), torch.randn(48, 5)
    w = pack_gate_up(wg, wu)
    assert w.shape == (96, 5)
    for b in range(48 // GLU_BLOCK):
        assert torch.equal(w[2 * b * GLU_BLOCK:(2 * b + 1) * GLU_BLOCK], wg[b * GLU_BLOCK:(b + 1) * GLU_BLOCK])
        assert torch.equal(w[(2 * b + 1) * GLU_BLOCK:(2 * b + 2) * GLU_BLOCK], wu[b * GLU_BLOCK:(b + 1) * GLU_BLOCK])
    a = torch.randn(7, 5)
    g, u = _glu_halves(a @ w.t())
    torch.testing.assert_close(g, a @ wg.t())
    torch.testing.assert_close(u, a @ wu.t())
    for bad in ((torch.randn(12, 5), torch.randn(12, 5)), (torch.randn(16, 5), torch.randn(8, 5)),
                (torch.randn(16), torch.randn(16))):
        with pytest.raises(ValueError):
            pack_gate_up(*bad)


def test_schedule_rules():
    assert GemmSchedule().gated_error() is None
    assert GemmSchedule(kind="pingpong", tile_m=64, tile_n=128).gated_error() is None
    assert "split_k" in GemmSchedule(split_k=2).gated_error()
    assert "multiple of 64" in GemmSchedule(kind="pingpong", tile_m=64, tile_n=96).gated_error()
    s = adapted(GemmSchedule(split_k=4), 4096, False, True)
    assert s.split_k == 1 and s.gated_error() is None
    # the layer's gate / up projections: prefill and decode shapes get a schedule the epilogue runs
    for m in (1, 16, 300, 4096, 8192):
        assert call_schedule(m, 28672, 4096, 2, 2, True, False, True).gated_error() is None, m


@pytest.mark.parametrize("tile_n,atoms,rows", [(256, (2, 1, 1), 128), (192, (1, 1, 1), 64), (128, (1, 1, 1), 64),
                                               (256, (1, 1, 1), 64)])
def test_products_read_their_own_threads_columns(tile_n, atoms, rows):
    import cutlass.cute as cute

    from cute_kernels.jit import compile_fn  # noqa: F401  (sets up the DSL target)
    from tests.gemm import _probe as probe

    cute.compile(probe.glu_probe, tile_n, atoms, rows)
    for t, half, gate, up in probe.OUT[("glu", tile_n, atoms, rows)]:
        assert len(half) == len(gate) == len(up) == rows * tile_n // 2 // (128 * atoms[0])
        for (m, n), (gm, gn), (um, un) in zip(half, gate, up):
            col = 2 * GLU_BLOCK * (n // GLU_BLOCK) + n % GLU_BLOCK
            assert (gm, gn) == (m, col) and (um, un) == (m, col + GLU_BLOCK), f"thread {t}"


def test_gated_kernels_compile_clean(tmp_path):
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get("gemm")
    for over in ({"activation": "swiglu"}, {"activation": "swiglu", "schedule": "pingpong", "tile_m": 64,
                                            "tile_n": 128, "a_rows": 16, "cluster_m": 1, "cluster_n": 2}):
        report, _ = compile_with_artifacts(spec, spec.resolve(over), str(tmp_path))
        assert not report.spills and report.ptx_census["wgmma.mma_async"] > 0, over
        assert report.ptx_census["cp.async.bulk.tensor"] > 0
    with pytest.raises(ValueError, match="split_k"):
        spec.resolve({"activation": "swiglu", "split_k": 2})


@pytest.mark.parametrize("weights", ["bf16", "w4a16"])
def test_layer_packs_gate_up(weights):
    """The bf16 and W4A16 layers hold gate / up interleaved (the fused SwiGLU GEMMs' layout); W4A16 quantizes that."""
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer
    from cute_kernels.w4a16.pack import unpack_int4

    cfg = LlamaConfig.tiny()
    sd = random_state_dict(cfg, device="cpu")
    layer = LlamaDecoderLayer(cfg, weights, device="cpu").load_hf_state_dict(sd)
    g, u = _glu_halves(layer.p["w_gu"].t())
    assert torch.equal(g.t(), sd["mlp.gate_proj.weight"]) and torch.equal(u.t(), sd["mlp.up_proj.weight"])
    if weights == "w4a16":
        wq = unpack_int4(*layer.q["w_gu"], 128)
        assert (wq.float() - layer.p["w_gu"].float()).abs().max() < 0.2 * layer.p["w_gu"].float().abs().max()
