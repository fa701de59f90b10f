"""CPU: elementwise copy's TMA bulk variant (`mode=bulk`) compiles for sm_90a to one-thread bulk copies
(`cp.async.bulk` global -> shared on an mbarrier, shared -> global in a bulk group), a scalar tail,
no 128-bit vector accesses, no local memory and few registers; the schedule and catalogue refuse
what the kernel cannot do; the op's size-class hook is empty (the grid-stride path stays default)."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.bulk_chunks import SIZE_CLASSES, BulkChunks, pick

LOAD = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
STORE = "cp.async.bulk.global.shared::cta.bulk_group"

CASES = [
    dict(dtype="bf16"),
    dict(dtype="fp16", chunk_bytes=2048),
    dict(dtype="fp32", chunk_bytes=32768, pieces=4),
    dict(dtype="bf16", pieces=2, index64=True),
]


@pytest.mark.parametrize("over", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_bulk_copy_compiles_to_bulk_copies(over, tmp_path):
    spec = catalog.get("elementwise.copy")
    p = spec.resolve({"mode": "bulk", **over})
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    ptx = files["ptx"].read_text()
    pieces = p["pieces"]
    assert ptx.count(LOAD) == pieces and ptx.count(STORE) == pieces
    assert ptx.count("mbarrier.init") == pieces and ptx.count("mbarrier.arrive.expect_tx") == pieces
    assert "cp.async.bulk.commit_group" in ptx and "cp.async.bulk.wait_group.read" in ptx
    census = report.ptx_census
    assert census["ld/st.local"] == 0 and not report.spills
    assert census["ld.global.v4 (128-bit)"] == 0 and census["st.global.v4 (128-bit)"] == 0
    assert census["ld.global (all)"] == 1 and census["st.global (all)"] == 1  # the scalar tail
    k = report.kernels[0]
    assert k.registers <= 24, k.registers
    assert k.threads == (32, 1, 1)
    assert report.dynamic_smem_bytes == p["chunk_bytes"] + 8 * pieces
    if p["index64"]:  # sizes read as 64 bits (see tests/core/test_every_kernel_compiles.py)
        assert not re.search(r"ld\.param\.(?:b|u|s)32\s+%r\d+,\s*\[[^\]]*\+\d+\]", ptx)
    if report.sass_census is not None:
        sass = files["sass"].read_text()
        assert len(re.findall(r"\bUBLKCP\.S\.G\b", sass)) == pieces
        assert len(re.findall(r"\bUBLKCP\.G\.S\b", sass)) == pieces
        assert report.sass_census["LDL/STL (spills)"] == 0


def test_grid_mode_is_the_default_and_unchanged(tmp_path):
    spec = catalog.get("elementwise.copy")
    assert spec.resolve()["mode"] == "grid"
    report, _ = compile_with_artifacts(spec, spec.resolve(), str(tmp_path))
    assert report.ptx_census["ld.global.v4 (128-bit)"] > 0 and report.ptx_census["mbarrier"] == 0


def test_catalogue_refuses_what_bulk_cannot_do():
    spec = catalog.get("elementwise.copy")
    with pytest.raises(ValueError, match="aligned"):
        spec.resolve({"mode": "bulk", "aligned": False})
    with pytest.raises(ValueError, match="chunk_bytes"):
        spec.resolve({"mode": "bulk", "chunk_bytes": 1000})
    with pytest.raises(ValueError, match="unknown parameter 'mode'"):
        catalog.get("elementwise.add").resolve({"mode": "bulk"})


def test_schedule():
    assert str(BulkChunks()) == "bulk8k" and str(BulkChunks(4096, 4)) == "bulk4kp4"
    with pytest.raises(ValueError, match="chunk_bytes"):
        BulkChunks(1000)
    with pytest.raises(ValueError, match="pieces"):
        BulkChunks(8192, 3)
    s = BulkChunks(8192)
    assert s.grid(0) == 1 and s.grid(15) == 1 and s.grid(8192) == 1 and s.grid(8192 + 16) == 2
    assert s.grid(1 << 20) == 128 and s.grid((1 << 20) + 6) == 128  # the 6-byte tail is scalar


def test_size_class_hook_is_empty():
    """The lead fills it from H200 measurements; until then copy's default path is grid-stride."""
    assert SIZE_CLASSES == {}
    assert all(pick("copy", b) is None for b in (0, 1 << 20, 1 << 30))


def test_launch_routing(monkeypatch):
    """`ops.elementwise._launch` (CPU tensors, compiled kernels stubbed): a BulkChunks schedule compiles
    copy with mode=bulk; misaligned operands fall back to the grid-stride pick; no schedule keeps the
    grid-stride pick while the size classes are empty, and takes the bulk schedule once one lists it."""
    import torch

    from cute_kernels.elementwise import ops as ew
    from schedules import bulk_chunks

    calls = []

    class Stub:
        def compiled(self, **kw):
            return lambda *args: calls.append(kw)  # the params of the kernel that ran

    monkeypatch.setattr(ew.catalog, "get", lambda name: Stub())
    monkeypatch.setattr(ew, "num_sms", lambda dev=None: 132)
    monkeypatch.setattr(ew, "_fns", {})

    def launch(x, schedule=None):
        calls.clear()
        ew._launch("copy", x, x, torch.empty_like(x), 1.0, 0.0, schedule=schedule)
        return calls[-1]

    x = torch.zeros(2**19 + 3, dtype=torch.bfloat16)
    kw = launch(x, BulkChunks(4096, 2))
    assert kw["mode"] == "bulk" and kw["chunk_bytes"] == 4096 and kw["pieces"] == 2 and not kw["index64"]
    assert "mode" not in launch(x)  # default: grid-stride
    mis = torch.zeros(2**19 + 4, dtype=torch.bfloat16)[1:]
    assert mis.data_ptr() % 16
    assert "mode" not in launch(mis, BulkChunks())
    with pytest.raises(ValueError, match="copy only"):
        ew._launch("add", x, x, torch.empty_like(x), 1.0, 1.0, schedule=BulkChunks())
    sched = BulkChunks(16384)
    monkeypatch.setitem(bulk_chunks.SIZE_CLASSES, "copy", ((1 << 20, 2 << 20, sched),))
    assert launch(x)["chunk_bytes"] == 16384
    assert "mode" not in launch(torch.zeros(1000, dtype=torch.bfloat16))  # outside the class
    assert "mode" not in launch(mis)  # inside it, but misaligned
