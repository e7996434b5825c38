# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# Both create (or reuse) .venv and install torch==2.13.0 *before* the package: a bare `torch`
# requirement would pull a multi-GB CUDA build, while 2.13.0 resolves to the local CPU build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/scalerl demo

test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q
	$(VENV)/bin/ruff check .

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

# Multi-process tests (torch.distributed ranks on gloo; deselected from `make test` by pyproject's addopts).
# The Ray backend's tests need the `distributed` extra, installed here only: `make test` stays lean.
DIST_STAMP := $(VENV)/.installed-distributed
$(DIST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,distributed]"
	touch $(DIST_STAMP)

.PHONY: test-distributed
test-distributed: $(DIST_STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m distributed tests/distributed
