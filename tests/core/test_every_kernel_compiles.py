"""CPU: every ready kernel compiles for sm_90a; the census shows what the kernel is meant to do
(128-bit global accesses, shuffles where it reduces), no local memory, 64-bit variants index in 64
bits. The full config sweep runs under `-m sweep`."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import loads_128_bits

READY = catalog.ready()


def _id(spec, p):
    return f"{spec.name}:{spec.key(p).config}:{spec.key(p).signature}"


REPRESENTATIVE = [(s, p) for s in READY for p in s.representative()]
SWEEP = [(s, p) for s in READY for p in s.sweep()]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for spec, p in REPRESENTATIVE:
        out[_id(spec, p)] = compile_with_artifacts(spec, p, str(tmp_path_factory.mktemp("art")))
    return out


@pytest.mark.parametrize("spec,p", REPRESENTATIVE, ids=[_id(s, p) for s, p in REPRESENTATIVE])
def test_representative_compiles(reports, spec, p):
    report, files = reports[_id(spec, p)]
    assert files["ptx"].read_text().count(".target sm_90a") == 1
    assert files["cubin"].read_bytes()[:4] == b"\x7fELF"
    assert report.kernels and report.kernels[0].registers and report.kernels[0].registers <= 255
    # the softmax forward holding a staged row (`HeldRowPlan.hold`, 80 registers): the tile loop's trip
    # count in local memory (8 B: one store before the loop, one load per tile); nothing else anywhere
    hold = p.get("hold", False)
    assert (report.kernels[0].local_bytes <= 8) if hold else not report.spills, report.format()
    if spec.name == "transpose.tma":  # no ld/st.global at all: TMA moves the tiles
        assert report.ptx_census["cp.async.bulk.tensor"] >= 2
        return
    if spec.name in ("w4a16.stream", "gemv.stream"):  # W and x by TMA; only scales and the split partials by ld
        assert report.ptx_census["cp.async.bulk.tensor"] >= 2 and report.ptx_census["ld/st.local"] == 0
        return

    if spec.family in ("gemm", "fp8_gemm") and spec.name != "gemm.simt":
        _check_gemm(report)
        return
    if spec.name == "flash_attn":  # tests/attention/test_forward_compile.py has more
        _check_attention(report, p)
        return
    if spec.family == "attention":  # the backward's three kernels, decode and the merge (tests/attention/ has more)
        ptx = report.ptx_census
        assert ptx["ld/st.local"] == 0
        if spec.name == "flash_attn_fp8":  # Q / K / V by TMA, V^T written by the producer warps, O from registers
            assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] >= 3 and ptx["setmaxnreg"] >= 2
        elif spec.name == "flash_attn_bwd":
            assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] >= 6 and ptx["setmaxnreg"] >= 2
        elif spec.name == "flash_decode":
            assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] >= 4
        elif spec.name == "merge_attention_states":
            # 4 elements a thread: 16-byte vectors for fp32 states, 8-byte ones for 16-bit states
            assert p["in_dtype"] != "fp32" or ptx["ld.global.v4 (128-bit)"] > 0
        else:
            assert ptx["ld.global.v4 (128-bit)"] > 0
        return
    if spec.name in ("moe.route", "moe.layouts"):  # a warp a token / 32 copies a round: scalar int32 / fp32 loads
        assert report.ptx_census["ld/st.local"] == 0 and report.ptx_census["shfl.sync"] + files["ptx"].read_text(
        ).count("match.any") > 0
        return
    if spec.name == "flow.timestep_embedding":  # a thread an output element: one scalar t load, one store
        assert report.ptx_census["ld/st.local"] == 0 and report.ptx_census["st.global (all)"] >= 1
        return
    if spec.name == "gemm.simt":  # scalar, predicated loads by design; smem tiles behind barriers
        assert report.ptx_census["bar.sync"] > 0 and report.ptx_census["ld/st.local"] == 0
        return
    assert loads_128_bits(report, files["ptx"].read_text(), p), "aligned variants must load 128 bits at a time"
    if spec.family == "elementwise":
        assert report.ptx_census["st.global.v4 (128-bit)"] > 0
    if spec.family == "reduction":
        assert report.ptx_census["shfl.sync"] > 0
    if report.sass_census is not None:
        staged = p.get("staging") == "smem"  # cp.async is LDGSTS.128 in SASS, not LDG.128
        assert report.sass_census["LDG.128"] > 0 or (staged and "LDGSTS" in files["sass"].read_text())
        assert report.sass_census["LDL/STL (spills)"] <= (2 if hold else 0)


def _check_gemm(report, spilled: int = 0):
    """Warp-specialized TMA + WGMMA: the PTX has the async tensor-core and bulk-tensor instructions
    and the register hand-over between warpgroups; nothing goes to local memory (but a known spill: `known_spill`)."""
    ptx = report.ptx_census
    assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] > 0 and ptx["setmaxnreg"] >= 2
    assert ptx["ld/st.local"] == 0
    if report.sass_census is not None:
        assert report.sass_census["HGMMA/QGMMA"] > 0 and report.sass_census["UTMALDG (TMA load)"] > 0
        assert report.sass_census["UTMASTG (TMA store)"] > 0
        if not spilled:
            assert report.sass_census["LDL/STL (spills)"] == 0


def _check_attention(report, p):
    """FA3 has the producer's setmaxnreg hand-over, FA2 none; varlen stores O by predicated st.global (a TMA box
    would clobber the next sequence), the fixed-length kernels by TMA."""
    ptx = report.ptx_census
    assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] > 0 and ptx["ld/st.local"] == 0
    assert (ptx["setmaxnreg"] >= 2) if p["schedule"] == "fa3" else (ptx["setmaxnreg"] == 0)
    if report.sass_census is not None:
        assert report.sass_census["HGMMA/QGMMA"] > 0 and report.sass_census["UTMALDG (TMA load)"] > 0
        assert (report.sass_census["UTMASTG (TMA store)"] == 0) if p["varlen"] else \
            (report.sass_census["UTMASTG (TMA store)"] > 0)


@pytest.mark.parametrize("name", [s.name for s in READY if "index64" in s.params])
def test_64bit_variants_take_64bit_sizes(name, tmp_path):
    spec = catalog.get(name)
    report, files = compile_with_artifacts(spec, spec.resolve({"index64": True}), str(tmp_path))
    ptx = files["ptx"].read_text()
    # Sizes and strides are members of the tensor parameters (loaded at `param+offset`); each must
    # be read as 64 bits, a 32-bit read would truncate tensors past 2^31 elements. (Plain scalar
    # parameters, like axpby's fp32 a and b, have no offset.)
    assert not re.search(r"ld\.param\.(?:b|u|s)32\s+%r\d+,\s*\[[^\]]*\+\d+\]", ptx), "a size is read as 32 bits"
    assert "ld.param.v2.b32" not in ptx


@pytest.mark.parametrize("name", ["elementwise.add", "reduction.row_sum", "reduction.col_sum"])
def test_misaligned_variants_use_scalar_accesses(name, tmp_path):
    spec = catalog.get(name)
    report, _ = compile_with_artifacts(spec, spec.resolve({"aligned": False}), str(tmp_path))
    assert report.ptx_census["ld.global.v4 (128-bit)"] == 0
    assert report.ptx_census["ld.global (all)"] > 0


def known_spill(spec, p) -> int:
    """Local memory (bytes) a sweep configuration is known to spill, each with its reason (0: none
    allowed). Every one is a production plan; the GPU tests check their results."""
    slow_row = spec.family == "rowwise" and (not p.get("aligned", True) or p.get("dtype") == "fp32")
    if slow_row and spec.name in ("rmsnorm.bwd", "layernorm.bwd", "layernorm.fwd"):
        # the norms' slower paths (scalar rows: N not a multiple of 8; fp32 rows) at 512 threads x 32 values a
        # thread, x and dy held: 8-24 B
        return 24
    if spec.name == "layernorm.bwd" and p["threads_per_row"] == 64 and p["vpt"] == 2:
        return 8  # the 1k default's register plan (64 threads x 16 elements a row, 4 rows a CTA; measured)
    if spec.name == "gemm" and p["activation"] == "gelu":
        return 16  # erf (libdevice) over the 128 fp32 accumulators a consumer thread holds at 128 x 256
    if p.get("hold", False):
        return 8  # (as the representative test) a held staged softmax row's tile-loop trip count
    return 0


@pytest.mark.sweep
@pytest.mark.parametrize("spec,p", SWEEP, ids=[_id(s, p) for s, p in SWEEP])
def test_sweep_compiles(spec, p, tmp_path):
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    allowed = known_spill(spec, p)
    assert (report.kernels[0].local_bytes <= allowed) if allowed else not report.spills, report.format()
    if spec.family in ("gemm", "fp8_gemm") and spec.name != "gemm.simt":
        _check_gemm(report, allowed)
    elif spec.family == "attention":  # (tests/attention/test_forward_compile.py checks each schedule's ingredients)
        if spec.name == "flash_attn":
            _check_attention(report, p)
        elif spec.name == "flash_attn_fp8":  # e4m3 WGMMAs, TMA loads, the producer's register hand-over
            ptx = report.ptx_census
            assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] > 0 and ptx["setmaxnreg"] >= 2
        # (the other attention kernels, decode, backward, quantizers, merge: their own tests check their ingredients)
    elif spec.name == "gemm.simt" or p.get("mode") == "merge":  # (merge: the per-split fp32 (m, l) states)
        pass
    elif p.get("aligned", True) and report.ptx_census["cp.async.bulk.tensor"] == 0:  # (TMA kernels load no LDG)
        assert loads_128_bits(report, files["ptx"].read_text(), p), "aligned variants must load 128 bits at a time"
