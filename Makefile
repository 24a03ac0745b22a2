# Two entry points, as the README's quick start says: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint install install-dev

$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.dev: $(VENV)/.runtime pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.runtime
install-dev: $(VENV)/.dev

# The demo: migrates, seeds from real crashing workers, serves with Celery until Ctrl-C.
run: install
	$(PY) manage.py demo --host $(HOST) --port $(PORT)

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy recovery approvals console

test: install-dev lint
	$(VENV)/bin/pytest
