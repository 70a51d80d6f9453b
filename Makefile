# Two commands from a fresh clone: `make demo` and `make test`. Both create .venv when missing.
# The interpreter that makes .venv: the newest of these that runs and is 3.11 or later (a pyenv shim of a version
# that is installed but not selected is on PATH and fails when run, so each candidate is run, not looked up).
# `make PYTHON=/path/to/python3.x` picks one; `make python` says which would be used. Found once, when first used.
PY_CANDIDATES := python3.13 python3.12 python3.11 python3
PY_NEEDS := 3.11
PY_OK := import sys; sys.exit(sys.version_info[:2] < (3, 11))
PY_VERSION := import sys; print("%d.%d.%d" % sys.version_info[:3])
PYTHON ?= $(eval PYTHON := $(shell for p in $(PY_CANDIDATES); do $$p -c '$(PY_OK)' >/dev/null 2>&1 && { echo $$p; break; }; done))$(PYTHON)
# What each candidate is, for the message when none fits
PY_SEEN = $(shell for p in $(if $(filter command line environment,$(origin PYTHON)),$(PYTHON),$(PY_CANDIDATES)); do \
	v=$$($$p -c '$(PY_VERSION)' 2>/dev/null) || v="not found"; printf '%s: %s; ' "$$p" "$$v"; done)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stallscope-installed
# This machine's pins (pyproject keeps ranges). torch 2.14.1 + torchvision 0.29.1 install from local disk.
PINS   := torch==2.14.1 torchvision==0.29.1
# NVIDIA DALI for the `dali` pipeline (~200 MB from PyPI; CPU pipelines run without a GPU). Optional for the
# package (the `dali` extra), installed here so that all three pipelines are tested.
DALI   := nvidia-dali-cuda130==2.4.0
# Holistic Trace Analysis, which tests/test_kernels.py runs beside `stallscope kernels --hta-window`: without its
# dependencies (jupyterlab, a hundred packages HTA's analyses do not import), and with those they do
HTA    := holistictraceanalysis==0.5.0
HTA_DEPS := pandas plotly networkx pydot

unexport PYTHONDONTWRITEBYTECODE

.PHONY: python install chromium pyc demo test test-fast test-timing test-docs stress lint bench gpu-check clean

# uv installs the ~6 GB of wheels in parallel: 4 s here from its cache, where pip took 75-80 s. Not byte-compiled:
# that took 40 s of a fresh-clone CI run's wall clock for every module of every package, where the suite imports a
# few of them. This machine sets PYTHONDONTWRITEBYTECODE=1; it is taken out of every recipe's environment (below) and
# of the suite's (tests/conftest.py), so the first interpreter that imports a module writes its .pyc and the
# others read it, as on a host without that setting (docs/testing.md). The venv is made without pip (ensurepip took
# 5.5 of the 9 s before uv could start) and this Python's own pip puts uv in it; pip in the venv where uv cannot be had.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || { $(MAKE) -s python > /dev/null && $(PYTHON) -m venv --without-pip $(VENV); }
	$(PYTHON) -m pip --python $(BIN)/python install -q uv && $(BIN)/python -m uv pip install -q --python $(BIN)/python \
		$(PINS) -e '.[dev]' $(DALI) $(HTA_DEPS) && $(BIN)/python -m uv pip install -q --python $(BIN)/python --no-deps $(HTA) \
	|| { $(BIN)/python -m ensurepip --upgrade > /dev/null && $(BIN)/python -m pip install -q --upgrade pip \
		&& $(BIN)/python -m pip install -q -e '.[dev]' $(PINS) $(DALI) $(HTA_DEPS) \
		&& $(BIN)/python -m pip install -q --no-deps $(HTA); }
	@touch $(STAMP)

# The interpreter that makes .venv, or one line naming what was found and the version needed (exit 2)
python:
	@if [ -n "$(PYTHON)" ] && $(PYTHON) -c '$(PY_OK)' > /dev/null 2>&1; then \
		echo "$(PYTHON) ($$($(PYTHON) -c '$(PY_VERSION)'), $$(command -v $(PYTHON)))"; \
	else echo "make: stallscope needs Python $(PY_NEEDS) or later; found $(PY_SEEN)set PYTHON=/path/to/python3.x" >&2; \
		exit 2; fi

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/stallscope run fashion-vgg

# Debian's chromium, for the headless-browser check of the HTML report (tests/test_html_chromium.py). Where it is
# missing and apt-get runs as root, `make chromium` starts its install and returns: apt runs beside what comes next
# (about 20 s on a new machine, which CI spent before its first test) and holds a lock on $(CHROMIUM_LOG) until it
# ends; the test waits for that lock. Elsewhere that test is skipped, saying why.
CHROMIUM := /usr/bin/chromium
CHROMIUM_LOG := .chromium-install.log
APT_CHROMIUM := [ -x $(CHROMIUM) ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

chromium:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif ! command -v apt-get >/dev/null || ! command -v flock >/dev/null || [ "$$(id -u)" != 0 ]; then \
		echo "no chromium (needs root, apt-get and flock): tests/test_html_chromium.py will be skipped"; \
	elif flock -n $(CHROMIUM_LOG) true; then \
		nohup flock $(CHROMIUM_LOG) nice -n 10 sh -c '$(APT_CHROMIUM); echo "apt-get exit $$?"' \
			>> $(CHROMIUM_LOG) 2>&1 < /dev/null & \
		for i in $$(seq 100); do flock -n $(CHROMIUM_LOG) true || break; sleep 0.05; done; \
		echo "chromium: installing beside the rest (log: $(CHROMIUM_LOG))"; \
	fi

# The suite in tiers (docs/testing.md); `make test` runs all of them, three tests at a time (pytest-xdist; each
# doc's commands stay together on one worker). Four at a time took 814-834 s against 878 (two fresh-clone runs
# against one), and the second was red on two timing checks; on 2026-11-26, 629 s against 638 of pytest: nothing
# worth the risk (docs/testing.md). PYTEST_ARGS adds flags
# (e.g. --junitxml=FILE).
XDIST := -n 3 --dist loadgroup
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
# This checkout's own modules byte-compiled first, in parallel, before the test processes race to write them.
pyc: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 profiler pipelines scenarios tests examples benchmarks > /dev/null

test: chromium pyc
	$(PYTEST) $(XDIST) --durations=25

test-fast: pyc
	$(PYTEST) $(XDIST) -m "not timing and not docs and not slow and not gpu"

test-timing: pyc
	$(PYTEST) $(XDIST) -m timing

test-docs: chromium pyc
	$(PYTEST) $(XDIST) -m docs

# The timing tier N times (default 5) beside two busy processes competing for the cores: docs/testing.md
stress: $(STAMP)
	$(BIN)/python benchmarks/stress_timing.py

lint: $(STAMP)
	$(BIN)/ruff check profiler pipelines scenarios tests benchmarks examples
	$(BIN)/ruff format --check profiler pipelines scenarios tests benchmarks examples
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/zerocode.py
	$(BIN)/python benchmarks/instrument.py
	$(BIN)/python benchmarks/loaders.py
	$(BIN)/python benchmarks/sweep.py
	$(BIN)/python benchmarks/whatif.py
	$(BIN)/python benchmarks/soak.py
	$(BIN)/python benchmarks/integrations_overhead.py
	$(BIN)/python benchmarks/kernel_windows.py
	$(BIN)/python benchmarks/window_cost.py
	$(BIN)/python benchmarks/sim_calibration.py
	$(BIN)/python benchmarks/tune_vs_grid.py
	$(BIN)/python benchmarks/host_speed.py --seconds 60 --window 10

# On a machine with an NVIDIA GPU: the gpu-marked tests, then every scenario x pipeline on cuda and on its
# simulated twin (benchmarks/gpu_check.py). Exit 0 all passed, 1 any failed, 3 no CUDA device here.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py

clean:
	rm -rf runs .pytest_cache
