# One command to run, one to test. Both create .venv when it is missing and install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: run test lint venv install-run install-test memcached clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

venv: $(BIN)/python

install-run: venv
	$(BIN)/python -m pip install --quiet -e '.[local]'

install-test: venv
	$(BIN)/python -m pip install --quiet -e '.[test]'

# memcached backs BEST_EFFORT counters and the rollup cache; the tests need a real one.
memcached:
	@command -v memcached >/dev/null 2>&1 || [ -x /usr/bin/memcached ] || { \
	  echo "installing memcached with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -qq memcached >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq memcached; }; }

run: install-run
	$(BIN)/counter up

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install-test memcached
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache --no-logo
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .counter .pytest_cache .ruff_cache .mypy_cache .hypothesis *.egg-info
