"""CPU: the command line: list, compile (artifacts + census), errors for unknown kernels."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cute_kernels", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_list_shows_the_curriculum():
    r = _run("list")
    assert r.returncode == 0, r.stderr
    for name in ("elementwise.add", "reduction.row_sum", "gemm", "fp8_gemm", "flash_attn"):
        assert name in r.stdout
    assert "ready" in r.stdout
    for name in ("flow.update", "voxel.hard", "qat.fake_quant"):  # lessons 15-17
        assert name in r.stdout


def test_compile_writes_artifacts_and_census(tmp_path):
    r = _run("compile", "elementwise.copy", "--config", "dtype=fp32", "unroll=2", "--dump", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "ld.global.v4 (128-bit)" in r.stdout and "registers" in r.stdout
    assert (tmp_path / "elementwise_copy.ptx").exists() and (tmp_path / "elementwise_copy.cubin").exists()
    v4 = [line for line in r.stdout.splitlines() if "ld.global.v4" in line][0]
    assert int(v4.split()[-1]) > 0


def test_compile_reduction_shows_shuffles(tmp_path):
    r = _run("compile", "reduction.row_sum", "--config", "threads_per_row=32", "--dump", str(tmp_path))
    assert r.returncode == 0, r.stderr
    shfl = [line for line in r.stdout.splitlines() if "shfl.sync" in line][0]
    assert int(shfl.split()[-1]) >= 5  # a 32-lane butterfly


def test_bad_requests_are_named():
    r = _run("compile", "elementwise.nope")
    assert r.returncode != 0 and "unknown kernel" in r.stderr
    r = _run("compile", "elementwise.add", "--config", "unroll=3")
    assert r.returncode != 0 and "unroll" in r.stderr


def test_bench_takes_several_shapes(monkeypatch):
    """`bench SUITE --shape ... --shape ...`: one table over the given shapes (the row-wise suite, whose
    per-shape torch.compile column compiles once per shape, runs in parts)."""
    from cute_kernels.cli import build_parser

    a = build_parser().parse_args(["bench", "rowwise", "--shape", "131072", "1024", "--shape", "512", "262144"])
    assert a.shape == [[131072, 1024], [512, 262144]]
    assert build_parser().parse_args(["bench", "rowwise"]).shape is None
    import torch

    import cute_kernels.bench as S
    from cute_kernels.bench import harness as H

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(H, "environment", lambda: {"gpu": "x", "date": "d", "commit": "c"})
    monkeypatch.setattr(H, "copy_bandwidth", lambda *a: 4.0)
    monkeypatch.setattr(H, "read_bandwidth", lambda *a: 4.0)
    monkeypatch.setattr(H, "peer_versions", lambda *a: {})
    monkeypatch.setattr(S, "suites", lambda: ({"rowwise": lambda **kw: seen.update(kw) or ([], [], [], "", {})},
                                              {"rowwise": ()}))
    monkeypatch.setattr(H, "write_results", lambda *a, **k: None, raising=False)
    try:
        S.run("rowwise", shapes=a.shape)
    except Exception:  # writing / plotting an empty table is not what is tested here
        pass
    assert seen["shapes"] == [(131072, 1024), (512, 262144)]
    seen.clear()
    try:
        S.run("rowwise", shapes=[8192, 16384])  # one shape, as before
    except Exception:
        pass
    assert seen["shapes"] == [(8192, 16384)]


def test_schedule_search_times_candidates_in_one_interleaved_run(monkeypatch):
    """`cute-kernels schedules`: every candidate and the torch reference go to one `do_bench_interleaved` call
    (timed one after another, the clock moved the ranks), each under its own key even when two
    candidates print alike, and each time comes back to its candidate."""
    from cute_kernels.bench import harness as H
    from cute_kernels.bench import schedule_search as S

    seen = []

    def fake(fns, **kw):
        seen.append(list(fns))
        return {k: {"median_ms": float(i + 1)} for i, k in enumerate(fns)}

    monkeypatch.setattr(H, "do_bench_interleaved", fake)
    monkeypatch.setattr(H, "progress", lambda *a, **k: None)
    cands = ["a", "b", "a"]
    t_ref, timed = S._timed("ref", lambda: None, cands, lambda c: None, 1e12)
    assert len(seen) == 1 and seen[0][0] == "ref" and len(set(seen[0])) == 4
    assert t_ref == 1.0 and timed == [("a", 2.0), ("b", 3.0), ("a", 4.0)]


def test_schedules_attention_fp8_lists_configs_without_a_gpu(capsys):
    """`cute-kernels schedules attention --fp8` on a machine without a GPU lists the FP8 forward's configs (the
    default first); a head dim it lacks and --fp8 with --backward or with gemm are named errors."""
    import pytest

    from cute_kernels import cli
    from schedules.attention import fp8_candidates

    run = cli.main
    assert run(["schedules", "attention", "--shape", "2", "4096", "8", "128", "--fp8"]) == 0
    out = capsys.readouterr().out
    assert "FP8 forward's configs" in out and str(fp8_candidates(128)[0]) in out
    for argv, msg in ((["--shape", "2", "4096", "8", "96", "--fp8"], "D must be one of"),
                      (["--shape", "2", "4096", "8", "128", "--fp8", "--backward"], "has no backward")):
        with pytest.raises(SystemExit, match=msg):
            run(["schedules", "attention", *argv])
    with pytest.raises(SystemExit, match="--fp8 is for attention"):
        run(["schedules", "gemm", "--shape", "1", "2", "3", "--fp8"])
