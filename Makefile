# Every target bootstraps .venv from nothing but Python 3.11 and pip.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/waypoint demo

test: $(STAMP)
	$(BIN)/ruff check engine adapters stores middleware service cmd
	$(BIN)/pytest -q -n 4 --dist loadfile

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.run_all
	$(BIN)/python -m bench.ecosystem

clean:
	rm -rf $(VENV) build *.egg-info .waypoint
