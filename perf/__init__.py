"""Benchmarks: the harness (`perf.harness`), the suites (`perf.suites`), committed results (`perf/results/`)."""
