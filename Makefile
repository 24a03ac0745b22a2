# Two entry points, as the README's quick start says: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# pytest-xdist: one test process per core, at most four (each has a test database, and
# may start a Celery worker, of its own). PYTEST_WORKERS=0 runs them in this process;
# PYTEST_ARGS adds to the command line (-x, -k NAME, a path).
PYTEST_WORKERS ?= auto
PYTEST_ARGS ?=

.PHONY: run test test-fast lint install install-dev

# The demo's workers and the host test processes use the client library, installed beside
# Settle: it is not a dependency of the server (a production `pip install .` runs without).
$(VENV)/.runtime: pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet -e './clients/python[mcp]'
	touch $@

$(VENV)/.dev: $(VENV)/.runtime pyproject.toml $(VENV)/.mcp-tools
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# What the gateway's tests (tests/mcp) drive settle-mcp with, installed here, never at test
# time: a published MCP server in a venv of its own (it needs the SDK 1.x), and the
# TypeScript SDK's client from the committed package-lock.json.
$(VENV)/.mcp-tools: harness/mcp_sqlite.txt tests/mcp/ts/package-lock.json
	$(PYTHON) -m venv $(VENV)/mcp-sqlite
	$(VENV)/mcp-sqlite/bin/python -m pip install --quiet -r harness/mcp_sqlite.txt
	cd tests/mcp/ts && npm ci --no-audit --no-fund --silent
	touch $@

install: $(VENV)/.runtime
install-dev: $(VENV)/.dev

# The demo: migrates, seeds from real crashing workers, serves with Celery until Ctrl-C.
run: install
	$(PY) manage.py demo --host $(HOST) --port $(PORT)

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy dbsql common approvals audit policies recovery webhooks monitoring identity bulk customers console settle
	cd clients/python && ../../$(VENV)/bin/mypy --strict src/settle_client

# What it runs is pyproject.toml's testpaths: tests/ and the client library's tests in
# clients/python/tests that need no live server.
test: install-dev lint
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --maxprocesses 4 $(PYTEST_ARGS)

# The edit-test loop: every test but those that start servers, worker processes or
# Chromium (markers ``processes`` and ``browser``), without lint. `make test` is the suite.
test-fast: install-dev
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --maxprocesses 4 -m "not processes and not browser" $(PYTEST_ARGS)
