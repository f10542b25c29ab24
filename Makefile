# The two set-up commands of the README: `make local` (the main job) and `make test`.
# Each installs what it needs; torch is pinned and installed first so that pip never pulls
# a CUDA build as a dependency of something else. On a CPU, install also JIT-builds
# DeepSpeed's CPU op and the fused kernels once (~45 s on 2 cores), not inside the first run.
PYTHON ?= python

.PHONY: install local test lint

install:
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[test]"
	$(PYTHON) -m scale_fpt.prebuild

local: install
	$(PYTHON) -m scale_fpt.cli sweep scale

test: install
	$(PYTHON) -m pytest -q

lint:
	ruff check . && ruff format --check .
