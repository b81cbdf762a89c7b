# The two commands the README opens with:
#   make demo   runs kmm on the embedded default (a local sandbox control plane)
#   make test   runs every check and every test, from a fresh clone
# Everything installs from this repo's own files into .venv.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all venv demo test lint typecheck layers unit integration protos clean

all: test

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/kmm sandbox up --nodes 3 --kernel 6.8.0-45-generic --kernel 6.1.0-27-amd64 --kernel 5.14.0-427.el9.x86_64
	$(BIN)/kmm sandbox status

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: venv
	$(BIN)/mypy

layers: venv
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest tests/unit

integration: venv
	$(BIN)/pytest tests/integration

test: lint typecheck layers
	$(BIN)/pytest

protos: venv
	$(BIN)/python scripts/gen_protos.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
