"""CPU: the compile cache: keys, memory/disk hits, fingerprint, and concurrent compiles of one key."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cute_kernels import catalog
from cute_kernels.jit import CacheKey, CompileCache, source_fingerprint

ROOT = Path(__file__).resolve().parents[2]


def test_keys_separate_config_signature_and_arch():
    spec = catalog.get("elementwise.add")
    a = spec.key(spec.resolve())
    b = spec.key(spec.resolve({"unroll": 2}))
    c = spec.key(spec.resolve({"dtype": "fp16"}))
    assert len({a.digest(), b.digest(), c.digest()}) == 3
    assert "unroll=2" in b.config and "dtype=fp16" in c.signature
    assert CacheKey("k", "c", "s", "sm_90a").digest() != CacheKey("k", "c", "s", "sm_100a").digest()
    assert "sm_90a" in str(a)


def test_kernels_compile_against_symbolic_sizes():
    # Every extent and stride of the tensors a kernel is compiled against is symbolic (or a static
    # unit stride), so a new size never recompiles; the cache key holds no size either. The one
    # exception is an extent that *is* a signature parameter (GEMV's 1-8 columns of x), which names
    # the compiled variant anyway.
    from cutlass.cute.typing import SymInt

    for spec in catalog.ready():
        p = spec.resolve()
        static_ok = {v for k, v in p.items() if spec.params[k].role == "signature" and type(v) is int}
        fixed = spec.static_extents(p)  # a workspace tile the variant itself fixes (the attention backward's dQ)
        _, args = spec.build(p)
        tensors = [a for a in args if hasattr(a, "shape") and hasattr(a, "stride")]
        assert tensors
        for t in tensors:
            assert all(isinstance(d, SymInt) or d in static_ok | fixed for d in t.shape), (spec.name, t.shape)
            assert all(isinstance(d, SymInt) or d == 1 or d in fixed for d in t.stride), (spec.name, t.stride)


def test_memory_then_disk_hits(tmp_path):
    spec = catalog.get("elementwise.copy")
    p = spec.resolve({"dtype": "fp32"})
    c1 = CompileCache(tmp_path)
    f1 = c1.get(spec.key(p), lambda: spec.build(p))
    assert c1.stats.compiles == 1
    assert c1.get(spec.key(p), lambda: spec.build(p)) is f1
    assert c1.stats.memory_hits == 1
    objs = list((tmp_path / source_fingerprint()).glob("*.o"))
    assert len(objs) == 1 and objs[0].stat().st_size > 0
    c2 = CompileCache(tmp_path)  # a new process's view of the same directory
    c2.get(spec.key(p), lambda: (_ for _ in ()).throw(AssertionError("must load, not compile")))
    assert c2.stats.disk_hits == 1 and c2.stats.compiles == 0


def test_corrupt_entry_is_recompiled(tmp_path):
    spec = catalog.get("elementwise.copy")
    p = spec.resolve({"dtype": "fp16"})
    CompileCache(tmp_path).get(spec.key(p), lambda: spec.build(p))
    obj = next((tmp_path / source_fingerprint()).glob("*.o"))
    obj.write_bytes(b"not an object file")
    c = CompileCache(tmp_path)
    import warnings

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        c.get(spec.key(p), lambda: spec.build(p))
    assert c.stats.compiles == 1


def test_memory_only_mode(tmp_path):
    spec = catalog.get("elementwise.copy")
    p = spec.resolve()
    c = CompileCache(tmp_path, disk=False)
    c.get(spec.key(p), lambda: spec.build(p))
    assert c.stats.compiles == 1 and not list(tmp_path.rglob("*.o"))


def test_fingerprint_covers_project_sources(tmp_path):
    import shutil

    from cute_kernels.jit import fingerprint_of

    for pkg in ("cute_kernels", "collectives", "schedules"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = fingerprint_of(tmp_path)
    assert before == fingerprint_of(ROOT)
    kernel = tmp_path / "collectives" / "reduce.py"
    kernel.write_text(kernel.read_text() + "\n# an edit\n")
    assert fingerprint_of(tmp_path) != before  # an edited collective invalidates every cached kernel


def test_concurrent_processes_compile_a_key_once(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from cute_kernels import catalog
        from cute_kernels.jit import CompileCache
        spec = catalog.get("elementwise.axpby")
        p = spec.resolve({{"dtype": "fp16", "unroll": 2}})
        c = CompileCache({str(tmp_path)!r})
        c.get(spec.key(p), lambda: spec.build(p))
        print("compiles", c.stats.compiles, "disk_hits", c.stats.disk_hits)
        """
    )
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    compiles = sum(int(o[0].split()[1]) for o in outs)
    hits = sum(int(o[0].split()[3]) for o in outs)
    assert compiles == 1 and hits == 2, outs
