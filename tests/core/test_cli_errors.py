"""CPU: what a newcomer's mistakes get from the command line: one line naming the argument or the valid range, exit
code 1, no traceback; a schedule's defaults follow the schedule; a second compile is the compile cache's."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cute_kernels", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,says", [
    (("compile", "gemmm"), "unknown kernel 'gemmm'; did you mean gemm"),
    (("compile", "gemm", "--config", "nosuch=1"), "unknown parameter 'nosuch'"),
    (("compile", "gemm", "--config", "tile_n=abc"), "parameter tile_n must be int, got 'abc'"),
    (("compile", "gemm", "--config", "tile_n=999"), "parameter tile_n must be one of"),
    (("compile", "gemm", "--config", "persistent=maybe"), "parameter persistent must be true or false"),
    (("compile", "gemm", "--config", "schedule=pingpong", "tile_n=256"), "fp32 accumulators per thread"),
    (("compile", "gemm", "--arch", "sm_80"), "arch must be one of ('sm_90a',)"),
    (("swizzle", "9", "4", "3", "--tile", "8x64"), "S<9,4,3> is not a swizzle: it needs B >= 0, M >= 0 and |S| >= B"),
    (("layout", "S<3,4,2> o 0 o (8,64):(64,1)"), "S<3,4,2> is not a swizzle"),
    (("bench", "nosuch"), "no suite 'nosuch'"),
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else None)
def test_one_line_and_exit_code_1(args, says):
    r = _run(*args)
    assert r.returncode == 1, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]
    assert len([line for line in r.stderr.splitlines() if line.strip() and "Warning" not in line]) == 1, r.stderr


def test_a_closed_pipe_is_not_an_error():
    p = subprocess.Popen([sys.executable, "-m", "cute_kernels", "swizzle", "3", "4", "3", "--tile", "64x64"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()  # `| head -1`
    err = p.stderr.read()
    p.wait(timeout=120)
    assert "BrokenPipeError" not in err and "Traceback" not in err, err


def test_defaults_follow_the_schedule():
    from cute_kernels import catalog

    assert catalog.get("gemm").resolve({"schedule": "pingpong"})["tile_n"] == 128
    assert catalog.get("fp8_gemm").resolve({"schedule": "pingpong"})["tile_m"] == 64
    p = catalog.get("flash_attn").resolve({"schedule": "fa2"})
    assert not p["pingpong"] and not p["overlap"] and not p["split_mask"]
    with pytest.raises(ValueError, match="pingpong"):
        catalog.get("flash_attn").resolve({"schedule": "fa2", "pingpong": True})


def test_a_second_compile_is_found_in_the_cache(tmp_path):
    env = {"CUTE_KERNELS_CACHE_DIR": str(tmp_path / "cache")}
    first = _run("compile", "elementwise.copy", "--config", "unroll=1", env=env)
    second = _run("compile", "elementwise.copy", "--config", "unroll=1", env=env)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert "\n  compiled in" in first.stdout and "found in the compile cache" in second.stdout
    assert first.stdout.split("compiled in")[0] == second.stdout.split("found in")[0]  # the same report
    # without --dump the artifacts are the cache's (nothing is left in /tmp)
    paths = [line.split(": ", 1)[1] for line in second.stdout.splitlines() if line.startswith("  ptx: ")]
    assert paths and paths[0].startswith(str(tmp_path / "cache"))


def test_precompile_says_what_it_compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    code = ("from cute_kernels.precompile import item, precompile\n"
            "items = [item('elementwise.copy', {'unroll': 1}), item('elementwise.copy', {'unroll': 2})]\n"
            "print(precompile(items, 1)[:2], precompile(items, 1)[:2])")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.stdout.split() == ["(2,", "2)", "(2,", "0)"], r.stdout + r.stderr
