"""Start-up time of the command line (CPU): the median wall time of `cute-kernels --help`, `list` and a cached
`compile`, each run N times in a fresh process, and whether the process imported torch or cutlass.

    python3 -m perf.cli_startup [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "--help": ["--help"],
    "list": ["list"],
    "list -v": ["list", "-v"],
    "compile (cached)": ["compile", "elementwise.copy"],
}
_PROBE = ("import sys, runpy; sys.argv = ['cute-kernels', *sys.argv[1:]]\n"
          "try:\n    runpy.run_module('cute_kernels', run_name='__main__')\nexcept SystemExit:\n    pass\n"
          "print('LOADED', 'torch' in sys.modules, 'cutlass' in sys.modules, file=sys.stderr)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="perf.cli_startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    subprocess.run([sys.executable, "-m", "cute_kernels", *COMMANDS["compile (cached)"]], capture_output=True)
    print("| command | median s | min s | imports torch | imports cutlass |\n|---|---|---|---|---|")
    for name, cmd in COMMANDS.items():
        times, loaded = [], ""
        for _ in range(args.runs):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", _PROBE, *cmd], capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            loaded = [line for line in r.stderr.splitlines() if line.startswith("LOADED")][-1].split()[1:]
        print(f"| `cute-kernels {' '.join(cmd)}` | {statistics.median(times):.3f} | {min(times):.3f} | "
              f"{loaded[0]} | {loaded[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
