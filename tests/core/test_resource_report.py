"""CPU: the resource report's parsers: census regexes, cubin ELF attributes, nvdisasm discovery."""

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.report import PTX_PATTERNS, SASS_PATTERNS, census, find_nvdisasm, parse_cubin

PTX = """
    ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];
    ld.global.nc.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1+16];
    ld.global.b16 %rs1, [%rd2];
    st.global.v4.b32 [%rd3], {%r1, %r2, %r3, %r4};
    shfl.sync.bfly.b32 %r5, %r4, 16, 31, -1;
    bar.sync 0;
    wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {...};
    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2, %r3}], [%r4];
    mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], %r2;
    setmaxnreg.inc.sync.aligned.u32 232;
    st.local.b32 [%rd9], %r1;
"""


def test_ptx_census_counts_each_kind():
    c = census(PTX, PTX_PATTERNS)
    assert c["ld.global.v4 (128-bit)"] == 2
    assert c["ld.global (all)"] == 3
    assert c["st.global.v4 (128-bit)"] == 1
    assert c["shfl.sync"] == 1 and c["bar.sync"] == 1
    assert c["wgmma.mma_async"] == 1 and c["cp.async.bulk.tensor"] == 1
    assert c["mbarrier"] == 1 and c["setmaxnreg"] == 1 and c["ld/st.local"] == 1


def test_sass_census():
    sass = "LDG.E.128 R4, desc[UR4][R2.64] ;\nSTG.E.128 desc[UR4][R6.64], R8 ;\nHGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ ;\nSTL [R1], R2 ;\nSHFL.BFLY PT, R3, R2, 0x10, 0x1f ;"
    c = census(sass, SASS_PATTERNS)
    assert c["LDG.128"] == 1 and c["STG.128"] == 1 and c["HGMMA/QGMMA"] == 1
    assert c["LDL/STL (spills)"] == 1 and c["SHFL"] == 1


def test_cubin_attributes_match_the_kernel(tmp_path):
    spec = catalog.get("reduction.row_sum")
    p = spec.resolve({"threads": 256, "threads_per_row": 256})
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    ks = parse_cubin(files["cubin"].read_bytes())
    assert len(ks) == 1
    k = ks[0]
    assert k.name.startswith("kernel_")
    assert k.threads == (256, 1, 1)  # .reqntid from the launch's block size
    assert 8 <= k.registers <= 255 and k.local_bytes == 0
    assert report.dynamic_smem_bytes == 4 * 256 // 32
    text = report.format()
    assert "registers" in text and "PTX census" in text


def test_nvdisasm_found_when_installed():
    tool = find_nvdisasm()
    if tool is None:  # the test extra installs nvidia-cuda-nvdisasm; without it SASS is skipped
        return
    assert tool.endswith("nvdisasm")
