"""Benchmarks: the harness (`cute_kernels.bench.harness`), the suites (`cute_kernels.bench`), committed results (`perf/results/`)."""
