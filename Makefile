# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# Both create (or reuse) .venv and install torch==2.13.0 *before* the package: a bare `torch`
# requirement would pull a multi-GB CUDA build, while 2.13.0 resolves to the local CPU build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Where torch comes from. By default pip's own configuration decides (on this project's machines
# that is a local CPU wheel). Elsewhere, PyPI's Linux torch is the CUDA build plus ~20 nvidia-*
# packages; for the CPU build, name PyTorch's CPU index:
#   make setup TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# (or a CUDA one, e.g. .../whl/cu128). TORCH_VERSION picks another release of the supported range.
TORCH_VERSION   ?= 2.13.0
TORCH_INDEX_URL ?=
TORCH_PIP_ARGS  := $(if $(strip $(TORCH_INDEX_URL)),--index-url $(strip $(TORCH_INDEX_URL)))

.PHONY: setup demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
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
