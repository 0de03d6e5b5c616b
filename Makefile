# Two commands do all the set-up on a fresh Linux or macOS machine:
#   make demo       create, kill, resume and show a task on the embedded SQLite default
#   make test       lint, type-check, the docs site (mkdocs build --strict), the whole
#                   suite (starts its own PostgreSQL), the reliability slice, then the
#                   demo from a fresh copy and from a built wheel: 55 to 70 minutes on
#                   2 cores; this is what CI runs
#   make test-fast  lint and the quick tests only (no PostgreSQL, nothing marked slow):
#                   about 3 minutes of CPU, without the benchmark peers installed

ifndef PYTHON
PYTHON := $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	2>/dev/null && echo $$p && break; done)
endif
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast check-install lint docs bench clean system-deps bytecode

# The demo needs ninelives alone; the tests add their tools on top.
$(VENV)/.core: pyproject.toml
	@test -n "$(PYTHON)" || { echo "ninelives needs Python 3.10 or newer" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@touch $@

# What lint and the quick tests need: the test extra (pytest, ruff, mypy, the
# official model clients, apsw), no benchmark peers and no bundled PostgreSQL.
$(VENV)/.dev: $(VENV)/.core
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

# The bench extra (DBOS, LangGraph) lets the test of bench/peers.py run every peer.
$(VENV)/.installed: $(VENV)/.dev
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	@# No PostgreSQL on this machine: the tests run the server bundled in a wheel.
	@if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
		echo "no PostgreSQL found: installing the pgserver wheel for the tests"; \
		$(BIN)/python -m pip install -q pgserver; fi
	@touch $@

# The documentation site's tools (the docs extra), apart from the tests'.
$(VENV)/.docs: $(VENV)/.core
	$(BIN)/python -m pip install -q -e '.[docs]'
	@touch $@

# The site into site/ (ignored by git); strict: a broken link or a warning fails
# (never with --quiet, which hides the warnings from --strict as well).
# Each command's --help is run in a subprocess while building (scripts/mkdocs_hooks.py).
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The I/O-fault tests inject errors with strace (Linux only); the report is loaded
# in a headless Chromium; the trace export is posted with curl.
system-deps:
	@bash scripts/system-deps.sh

demo: $(VENV)/.core
	NINELIVES=$(abspath $(BIN))/ninelives bash scripts/demo.sh

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests bench examples scripts
	$(BIN)/ruff format --check src tests bench examples scripts
	$(BIN)/mypy

# The suite starts thousands of ninelives processes. An editable install's modules
# are compiled by the first import that may write bytecode; with
# PYTHONDONTWRITEBYTECODE set none may, and each process compiled them all again
# (half of a SQLite command's start-up). compileall writes the caches either way.
bytecode: $(VENV)/.core
	@$(BIN)/python -m compileall -q src tests examples

test: $(VENV)/.installed lint docs system-deps bytecode
	@echo "==> the whole suite: real processes killed with SIGKILL, a throwaway PostgreSQL (about an hour on 2 cores)"
	NINELIVES_FORBID_SKIPS=1 $(BIN)/pytest --durations=25
	@echo "==> the reliability slice: random kills, power cuts, I/O faults, simulation seeds (about 1 minute)"
	$(BIN)/python bench/reliability.py --quick
	@$(MAKE) --no-print-directory check-install

# The README's first command in a fresh copy of this checkout, then a wheel and an
# sdist built and the wheel installed into a fresh virtualenv, running the demo.
check-install: $(VENV)/.installed
	@echo "==> make demo in a fresh copy, then python -m build and the demo from the wheel (about 1 minute)"
	PYTHON=$(PYTHON) BUILD_PYTHON=$(abspath $(BIN))/python bash scripts/check-install.sh

# The inner loop: lint and the quick tests, about 3 minutes of CPU; it installs
# only the test extra. Tests taking more than a few seconds are marked slow.
test-fast: lint bytecode
	@echo "==> the quick tests (no PostgreSQL, nothing marked slow); 'make test' runs everything"
	NINELIVES_BACKOFF=0 $(BIN)/pytest -q -x -m "not slow and not postgres"

bench: $(VENV)/.installed
	$(BIN)/python bench/step_overhead.py

clean:
	rm -rf $(VENV) demo dist site .pytest_cache .mypy_cache .ruff_cache
