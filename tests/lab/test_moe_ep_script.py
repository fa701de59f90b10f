"""CPU: the several-GPU MoE run's script (`perf/moe_ep.py`, issue 42) runs end to end in its smoke mode: 2 gloo
processes, the torch experts, every phase it times, and its correctness verdict against the one-rank layer."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke(tmp_path):
    res = subprocess.run([sys.executable, "perf/moe_ep.py", "--smoke", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "[PASS] calc_diff < 1e-3" in res.stdout
    text = (tmp_path / "moe_ep.md").read_text()
    for row in ("dispatch GB/s", "bare all_to_all ms", "eager dispatch ms", "layer ms chunks=4", "one-GPU layer ms"):
        assert row in text, row
