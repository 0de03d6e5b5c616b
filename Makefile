# Two commands do all the set-up on a fresh Linux or macOS machine:
#   make demo   create, kill, resume and show a task on the embedded SQLite default
#   make test   lint, type-check and run the whole test suite (starts its own PostgreSQL)

PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	&& echo $$p && break; done)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "ninelives needs Python 3.10 or newer" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

demo: $(VENV)/.installed
	NINELIVES=$(BIN)/ninelives bash scripts/demo.sh

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

test: lint
	NINELIVES_FORBID_SKIPS=1 $(BIN)/pytest

bench: $(VENV)/.installed
	$(BIN)/python bench/step_overhead.py

clean:
	rm -rf $(VENV) demo .pytest_cache .mypy_cache .ruff_cache
