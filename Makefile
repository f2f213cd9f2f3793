# Two commands do all the set-up (README "Quick start"):
#   make run    run the bundled example as rank 4097 of 8192 and print the report
#               (its first run profiles the example and caches its graph, so
#               peers show pipeline bubbles and stragglers; later runs start at once)
#   make test   run the test suite
# Both create .venv, install the pinned dependencies and provision CRIU
# (tools/provision_criu.sh) on first use; later calls find the stamp up to
# date and start at once.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.prism-debug-installed
LINT_STAMP := $(VENV)/.prism-debug-lint-installed
DOCS_STAMP := $(VENV)/.prism-debug-docs-installed

.PHONY: run test test-fast lint docs bench clean bytecode

run: $(STAMP) bytecode
	$(BIN)/prism-debug run --report prism-report.json

test: $(STAMP) bytecode
	tools/run_tests.sh $(BIN)/python

# the tests that start no real rank, no CRIU and no torchrun, on two workers
test-fast: $(STAMP) bytecode
	$(BIN)/python -m pytest -n 2 -m "not slow and not serial" --durations=10

# ruff (style, bugs, complexity <= 15) and mypy (strict on the pure core)
lint: $(LINT_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# the documentation site (docs/, mkdocs.yml), built strictly: a broken link fails it
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python tools/bench_overhead.py
	$(BIN)/python tools/bench_overhead.py --real-pair
	$(BIN)/python tools/bench_snapshot.py
	$(BIN)/python tools/bench_cut.py
	$(BIN)/python tools/bench_restore.py
	$(BIN)/python tools/bench_regression.py
	$(BIN)/python tools/bench_bus.py
	$(BIN)/python tools/bench_engine.py
	$(BIN)/python tools/bench_fidelity.py
	$(BIN)/python tools/bench_predict.py
	$(BIN)/python tools/bench_variability.py
	$(BIN)/python tools/bench_incident.py

# torch==2.13.0 is pinned exactly: pip takes the CPU wheel from the local disk
# (a looser pin would pull gigabytes of CUDA wheels).
$(STAMP): pyproject.toml tools/provision_criu.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" "setuptools>=68"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test]"
	bash tools/provision_criu.sh $(BIN)/python
	touch $(STAMP)

$(LINT_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test,lint]"
	touch $(LINT_STAMP)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test,lint,docs]"
	touch $(DOCS_STAMP)

# The package's compiled modules, brought up to date (a few hundredths of a
# second when they are): an editable install has none, and where the
# environment sets PYTHONDONTWRITEBYTECODE every process compiled the
# package again, 0.35 s of CPU per `prism-debug run` (its controller and
# its rank), hundreds of times in make test.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q prism_debug hooks

clean:
	rm -rf $(VENV) prism-report.json .pytest_cache .hypothesis site
	find prism_debug hooks -name __pycache__ -prune -exec rm -rf {} +
