# The two commands of the README. Each sets up .venv on first use (see .ci/install).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: main test install sweep figures

# The set-up runs once (and again when pyproject.toml or the install script change); `make install` forces it.
STAMP := $(VENV)/.installed
$(STAMP): pyproject.toml .ci/install
	VENV=$(VENV) bash .ci/install

install:
	VENV=$(VENV) bash .ci/install

# On a CPU: compile every kernel for sm_90a and print its resource report.
# On a GPU: also run the benchmarks and write perf/results/local/.
main: $(STAMP)
	$(PY) -m cute_kernels main --out perf/results/local

# Lint (ruff, pyproject's rules), then the tests: CPU tests always run; GPU tests run when a GPU is
# present and skip cleanly otherwise. Without a GPU the tests run in two processes (pytest-xdist): they are
# compile-bound, and on CI's 2 cores that halves the time; with a GPU, one
# process (the GPU tests share one device). Each family's CPU tests keep to a compile budget of about a minute
# (tests/budget.py); `make sweep` runs the rest.
XDIST ?= $(shell nvidia-smi -L >/dev/null 2>&1 || echo "-n 2")
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(XDIST) tests

# What the default run leaves out: the full compile sweep of every kernel config, and each family's compile
# cases past its budget of about a minute in the default run (tests/budget.py). Slow.
sweep: $(STAMP)
	$(PY) -m pytest -q -m sweep tests

figures: $(STAMP)
	$(PY) docs/figures/make_figures.py
