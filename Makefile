# ulorl — two commands from a fresh clone:
#   make quickstart   set up (.venv, CPU torch) and run the headline sweep on the embedded default
#   make test         set up and run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATA_DIR ?= $(abspath ../shared/data)
PYTEST_ARGS ?=

.PHONY: setup quickstart test test-slow test-vllm setup-vllm setup-browser clean

setup: $(VENV)/.ulorl-installed

# torch==2.13.0 first: a bare torch requirement can resolve to a multi-GB CUDA build (STACK.md).
$(VENV)/.ulorl-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	@touch $@

quickstart: setup
	$(BIN)/ulorl-sweep sweeps/mpt_threshold.yaml

# Chromium for the dashboard's real-browser test (Debian package; root or sudo).
setup-browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: setup setup-browser
	ULORL_DATA_DIR="$${ULORL_DATA_DIR:-$(DATA_DIR)}" $(BIN)/pytest -q --ignore=tests/vllm $(PYTEST_ARGS)

test-slow: setup setup-browser
	ULORL_DATA_DIR="$${ULORL_DATA_DIR:-$(DATA_DIR)}" $(BIN)/pytest -q --ignore=tests/vllm -m slow $(PYTEST_ARGS)

# vLLM's CPU build lives in its own venv (it pins transformers<5.20 and torch 2.13.0+cpu).
setup-vllm: setup
	$(BIN)/python -m ulorl.scale.vllm_env --venv $(VENV)-vllm --repo .

test-vllm: setup-vllm
	ULORL_DATA_DIR="$${ULORL_DATA_DIR:-$(DATA_DIR)}" $(VENV)-vllm/bin/pytest -q tests/vllm $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VENV)-vllm mlflow.db mlflow-artifacts runs
