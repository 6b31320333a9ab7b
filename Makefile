# `make run` sets up and starts the console; `make test` sets up and runs the full test suite
# (`make test-quick`: the fast tier, for iteration).
# Both create their own virtual environment in .venv (Python >= 3.11 as python3).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test test-fast test-quick lint screenshot clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "samai-console needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

run: $(STAMP)
	$(BIN)/samai-console $(ARGS)

# Every module on one worker (its module fixtures set up once, as in a serial run), one worker per
# core (TEST_WORKERS=1: serially); the long modules are collected first (tests/conftest.py).
TEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# For iteration: quiet, stop at the first failure.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -x -q $(PYTEST_ARGS)

# For iteration: the fast tier, without the slow tests (pyproject.toml's markers); `make test` runs all.
test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q -n auto $(PYTEST_ARGS)

# The README's screenshot, rendered from the recorded box in tests/data.
screenshot: $(STAMP)
	$(BIN)/python docs/screenshot.py docs/screenshot.svg

# mypy reads the package as it is installed (samai.console is console/, ...): a folder of links.
lint: $(STAMP)
	$(BIN)/ruff check .
	rm -rf .mypy-src && mkdir -p .mypy-src/samai
	for d in console remote widgets themes; do ln -s ../../$$d .mypy-src/samai/$$d; done
	MYPYPATH=.mypy-src $(BIN)/mypy -p samai

clean:
	rm -rf $(VENV) build *.egg-info
