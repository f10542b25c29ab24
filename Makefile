# The set-up commands of the README: `make local` (the main job), `make test` (the whole
# suite, what CI runs) and `make check` (the fast tier for the inner loop, docs/testing.md).
# `local` and `test` install what they need first; torch is pinned and installed first so
# that pip never pulls a CUDA build as a dependency of something else. pip byte-compiles what
# it installs but not an editable package: `compileall` does, once, so that where
# PYTHONDONTWRITEBYTECODE is set (CI containers) a sweep's processes do not each compile
# scale_fpt again. On a CPU, install also JIT-builds DeepSpeed's CPU op and the fused kernels
# once (~40 s on 2 cores), not inside the first run.
PYTHON ?= python

.PHONY: install local test check lint

install:
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[test]"
	$(PYTHON) -m compileall -q scale_fpt
	$(PYTHON) -m scale_fpt.prebuild

local: install
	$(PYTHON) -m scale_fpt.cli sweep scale

# Two pytest workers (docs/testing.md): most of a serial run's wall time is waiting (Ray's
# start-up, subprocess drivers, the SSH node), which the other worker's tests fill. Each
# worker runs whole test files, so a module's fixtures (its sweep, its own Ray) are built once,
# in the order tests/conftest.py gives them (the files of most slow tests first).
XDIST = -n 2 --dist loadfile --no-loadscope-reorder

test: install
	$(PYTHON) -m pytest -q $(XDIST) --durations=20

# No install step: the inner loop runs it on an environment `make install` (or `make test`)
# has set up. Every test not marked `slow`; the ten slowest are printed to keep it fast.
check:
	$(PYTHON) -m pytest -q $(XDIST) -m "not slow" --durations=10

lint:
	ruff check . && ruff format --check .
