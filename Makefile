# The README's two commands:  `make demo`  and  `make test`.
# Both create .venv, install the pinned packages and build the native code,
# skipping whatever is already done (stamp files under .venv/).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
NATIVE := $(shell find csrc jit_ops -name '*.cpp' -o -name '*.h' 2>/dev/null)

.PHONY: demo test bench build cpp-worker test-torch-backend

demo: $(VENV)/.built
	$(PY) tutorials/demo.py

test: $(VENV)/.built
	$(PY) -m pytest tests

bench: $(VENV)/.built
	$(PY) benchmarks/run_all.py

build: $(VENV)/.built

# A C++ program that joins a job with no Python (tutorials/cpp_worker).
cpp-worker: $(VENV)/.built
	$(PY) tutorials/cpp_worker/build.py

# PyTorch's own RPC test suite against the TORCHRPC backend
# (tests/torch_backend_upstream/upstream_suite.py); long, so `make test` runs
# only a smoke subset of it. Pick tests with ARGS, e.g.
# make test-torch-backend ARGS="-k test_add".
ARGS ?=
# Upstream's harness gives up on a hung test before pytest does, and prints
# every rank's stack.
test-torch-backend: $(VENV)/.built
	DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=240 $(PY) -m pytest tests/torch_backend_upstream/upstream_suite.py -p no:cacheprovider \
		-o addopts="" -o filterwarnings="" -o timeout=300 -q $(ARGS)

$(VENV)/.deps: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.built: $(VENV)/.deps setup.py $(NATIVE)
	MAX_JOBS=2 $(PY) -m pip install -q --no-build-isolation -e .
	touch $@
