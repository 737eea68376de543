"""Step-cost curves of real model shapes without their weights: a random-weight GGUF of a named shape, made here.

    .venv/bin/python benchmarks/scripts/model_shapes.py --shape llama-3.2-1b --type Q4_K_M \\
        [--threads 2] [--sizes 1,2,3,4,6,8,12,16,24,32] [--repeats 5] [--context 512] \\
        [--out-dir benchmarks/measurements/shapes] [--gguf-dir DIR [--keep]]
    .venv/bin/python benchmarks/scripts/model_shapes.py --list

Nothing here downloads weights (nor anything else). The file is written on this machine: the shape's real sizes
(hidden, FFN, layers, attention and KV heads, head size, Llama 3 rope with its ``rope_freqs`` factors, tied or untied
output, a 128256-row vocabulary) with seeded normal values of std 0.02 (norms 1), F16 matrices drawn from one 32 MB
pool of random values at a random offset per tensor. Other types are that F16 file re-quantized by llama.cpp's own
quantizer (``ppd_core.backends.llamacpp.quantize.quantize_file``), so the tensors get the type mix a real Q4_K_M or Q4_0 file has
(e.g. Q6_K output and some ``attn_v``/``ffn_down`` in Q4_K_M); the F16 intermediate is deleted. The tokenizer is the
default model's (``tokenizer.ggml.*``, chat template; ``tests/tiny_gguf.py``'s ``default_vocabulary``) padded with
UNUSED tokens to the shape's vocabulary, so the LM head and the logits cost what the real model's do. A step's cost
does not depend on the weights' values: a random file of the same shape and types costs what the real one costs
(greedy acceptance is meaningless on it, and nothing here uses it).

The curve: the repo's ``LlamaCppDecoder`` (what ``ppd`` decodes with: flash attention, Q8_0 KV cache, its own
choice of repacked weights after the bitwise check), ``--context`` random cached tokens, then for each tree size R
(``latency.probe_tree``: prompt-token rows on the root as embeddings, like decoding with the shipped 3-token prompt
table; ``--prompt-rows 0`` for token rows only) calibration's own ``latency.step_ms`` (medians after a warm-up,
stopping early once the median holds still) in three patterns:

* ``repeated_ms``: R, R, R, ... (one batch shape all along);
* ``latency_ms`` (calibration's figure, as ``step_alternation.py``): the pair (R, then a 1-token step) less half a
  1-token pair, i.e. an R-step between 1-token steps;
* ``fixed_ms``: with the decoder padding every step to R rows (``pad_steps(R)``), the pair (R, then a 1-token step
  padded to R) halved, i.e. a step when every step has R rows. Skipped (said in ``fixed_note``) where the decoder
  has no ``pad_steps``.

One JSON per shape and type goes to ``--out-dir``, named ``SHAPE-TYPE-CPU-Nthreads.json``, in the format of
``profiles/curves/*.json`` (``device``, ``model``, ``source``, ``latency_ms`` by context), so that
``ppd calibrate --latency-curve FILE`` reads it; the other patterns, the CPU, llama.cpp's system info, the
tensor types, the wall time of making the file and the exact command are extra keys. The random GGUF goes to a
temporary folder (deleted after) unless ``--gguf-dir`` names one; ``--keep`` keeps it there, and a file already
there of that shape and type is used again (its making time then reads null). Writing holds one tensor at a time
(at most ~2 GB, for 8B's token embedding), and the folder needs the F16 file plus the output at once (8B: 15 + 4.3
GiB for Q4_0). On this project's 2-core EPYC: 1B Q4_K_M took 19 s to write and 145 s to quantize, 8B Q4_0 58 s and
82 s. Step timings share the cores with whatever else runs: the JSON records the load averages before and after,
and ``--wait-load 2.5`` waits (up to ``--wait-max`` s) for a quiet machine before measuring.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

LLAMA3_VOCAB = 128256
WEIGHT_STD = 0.02
POOL_VALUES = 1 << 24  # 16 Mi F16 random values (32 MB), sliced per tensor
SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PROMPT_ROWS = 3  # the shipped prompt-token table's rows (3 tokens, ensemble 1)
UNUSED_TOKEN = 5  # gguf TokenType.UNUSED: not a special token, so tokenization does not scan 79k of them


@dataclass(frozen=True)
class Shape:
    """A Llama-architecture model's sizes (the Hugging Face config.json values)."""

    hf_name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool
    vocab: int = LLAMA3_VOCAB
    context: int = 131072
    rope_theta: float = 500000.0
    rope_factor: float = 8.0  # llama3 rope scaling
    rope_low_freq: float = 1.0
    rope_high_freq: float = 4.0
    rope_original_context: int = 8192
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attention + 3 * self.hidden * self.ffn + 2 * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden


SHAPES = {
    "llama-3.2-1b": Shape("meta-llama/Llama-3.2-1B-Instruct", 2048, 16, 32, 8, 8192, tied=True, rope_factor=32.0),
    "llama-3.2-3b": Shape("meta-llama/Llama-3.2-3B-Instruct", 3072, 28, 24, 8, 8192, tied=True, rope_factor=32.0),
    "llama-3.1-8b": Shape("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 32, 8, 14336, tied=False, rope_factor=8.0),
}
TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")  # any ppd_core.backends.llamacpp.quantize.TYPES key works; these are tried


def rope_factors(shape: Shape) -> np.ndarray:
    """``rope_freqs.weight`` [head_dim / 2] as llama.cpp's converter computes it for ``rope_type: llama3``."""
    dim = shape.head_dim
    freqs = 1.0 / (shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen = shape.rope_original_context / shape.rope_low_freq
    high_wavelen = shape.rope_original_context / shape.rope_high_freq
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(shape.rope_factor)
        else:
            smooth = (shape.rope_original_context / wavelen - shape.rope_low_freq) / (shape.rope_high_freq - shape.rope_low_freq)
            factors.append(1 / ((1 - smooth) / shape.rope_factor + smooth))
    return np.array(factors, dtype=np.float32)


def tensor_plan(shape: Shape) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, numpy shape [rows, columns], dtype) of every tensor, in the converter's order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan = [("token_embd.weight", (shape.vocab, h), np.float16),
            ("rope_freqs.weight", (shape.head_dim // 2,), np.float32)]
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        plan += [(f"{block}.attn_norm.weight", (h,), np.float32),
                 (f"{block}.attn_q.weight", (q, h), np.float16),
                 (f"{block}.attn_k.weight", (kv, h), np.float16),
                 (f"{block}.attn_v.weight", (kv, h), np.float16),
                 (f"{block}.attn_output.weight", (h, q), np.float16),
                 (f"{block}.ffn_norm.weight", (h,), np.float32),
                 (f"{block}.ffn_gate.weight", (shape.ffn, h), np.float16),
                 (f"{block}.ffn_up.weight", (shape.ffn, h), np.float16),
                 (f"{block}.ffn_down.weight", (h, shape.ffn), np.float16)]
    plan.append(("output_norm.weight", (h,), np.float32))
    if not shape.tied:
        plan.append(("output.weight", (shape.vocab, h), np.float16))
    return plan


def padded_tokens(vocabulary, size: int) -> tuple[list[str], list[int]]:
    """The default tokenizer's tokens and types, padded with unique UNUSED tokens to ``size``."""
    tokens, types = list(vocabulary.tokens), list(vocabulary.token_types)
    if len(tokens) > size:
        raise SystemExit(f"the default tokenizer has {len(tokens)} tokens, more than the shape's {size}")
    tokens += [f"[ppd-shape-pad-{i}]" for i in range(len(tokens), size)]
    types += [UNUSED_TOKEN] * (size - len(types))
    return tokens, types


def write_f16_gguf(path: Path, name: str, shape: Shape, seed: int = 0) -> None:
    """The shape as an F16 GGUF at ``path``, one tensor in memory at a time (the largest: the token embedding)."""
    from gguf import GGUFWriter, LlamaFileType  # noqa: PLC0415
    from ppd_core.loading import default_model_file  # noqa: PLC0415
    from tiny_gguf import add_vocabulary, default_vocabulary  # noqa: PLC0415 - tests/tiny_gguf.py: the default's tokenizer keys

    vocabulary = default_vocabulary(default_model_file())
    tokens, token_types = padded_tokens(vocabulary, shape.vocab)
    generator = np.random.default_rng(seed)
    pool = (generator.standard_normal(POOL_VALUES, dtype=np.float32) * WEIGHT_STD).astype(np.float16)

    writer = GGUFWriter(path, "llama")
    writer.add_name(f"random {name} (ppd model_shapes, shape only)")
    writer.add_vocab_size(shape.vocab)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    add_vocabulary(writer, vocabulary, tokens, token_types)

    plan = tensor_plan(shape)
    for tensor_name, dims, dtype in plan:
        count = int(np.prod(dims))
        writer.add_tensor_info(tensor_name, dims, np.dtype(dtype), count * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor_name, dims, dtype in plan:
        if tensor_name == "rope_freqs.weight":
            data = rope_factors(shape)
        elif dtype == np.float32:  # norms
            data = np.ones(dims, dtype=np.float32)
        else:  # a run of the pool from a random offset, wrapping around
            count = int(np.prod(dims))
            offset = int(generator.integers(POOL_VALUES))
            data = np.tile(pool, -(-(offset + count) // POOL_VALUES))[offset:offset + count].reshape(dims)
        writer.write_tensor_data(data)
        del data
    writer.close()


def make_gguf(name: str, type_name: str, folder: Path, threads: int) -> tuple[Path, dict]:
    """The random GGUF of shape ``name`` in ``type_name`` in ``folder`` (reused if there); its making times."""
    from ppd_core.backends.llamacpp.quantize import quantize_file  # noqa: PLC0415

    shape = SHAPES[name]
    final = folder / f"random-{name}-{type_name}.gguf"
    if final.is_file():
        print(f"using {final} (already there)", flush=True)
        return final, {"reused": True, "write_f16_s": None, "quantize_s": None}
    estimate = shape.parameters() * 2 * (1 if type_name == "F16" else 1.35)
    free = shutil.disk_usage(folder).free
    if free < estimate * 1.05:
        raise SystemExit(f"{folder} has {free / 2**30:.1f} GiB free; the F16 file (and its {type_name} copy) need "
                         f"about {estimate / 2**30:.1f} GiB")
    f16 = final if type_name == "F16" else folder / f"random-{name}-F16.partial.gguf"
    start = time.perf_counter()
    print(f"writing {f16.name} ({shape.parameters() / 1e9:.2f} B parameters, "
          f"{shape.parameters() * 2 / 2**30:.1f} GiB in F16)", flush=True)
    write_f16_gguf(f16, name, shape)
    timing = {"reused": False, "write_f16_s": round(time.perf_counter() - start, 1), "quantize_s": None}
    print(f"  written in {timing['write_f16_s']} s", flush=True)
    if type_name != "F16":
        start = time.perf_counter()
        print(f"quantizing to {type_name} with llama.cpp ({threads} threads)", flush=True)
        try:
            quantize_file(f16, final, type_name, threads)
        finally:
            f16.unlink(missing_ok=True)
        timing["quantize_s"] = round(time.perf_counter() - start, 1)
        print(f"  quantized in {timing['quantize_s']} s", flush=True)
    return final, timing


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each ggml type the file holds, and the token embedding's and output's types."""
    from gguf import GGUFReader  # noqa: PLC0415

    reader = GGUFReader(path)
    counts = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    named = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors
             if tensor.name in ("token_embd.weight", "output.weight")}
    del reader
    return {"counts": dict(sorted(counts.items())), **named}


def measure(path: Path, threads: int, sizes: list[int], context: int, repeats: int, warmup: int,
            prompt_rows: int) -> dict:
    """Step milliseconds for each size in the three patterns, on ppd's llama.cpp decoder."""
    from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder  # noqa: PLC0415
    from ppd_core.calibration import latency  # noqa: PLC0415
    from ppd_core.decoding import Speculator, prefill  # noqa: PLC0415
    from ppd_core.tree import TreeFamily  # noqa: PLC0415

    start = time.perf_counter()
    decoder = LlamaCppDecoder(path, threads=threads)
    load_s = time.perf_counter() - start
    try:
        limit = getattr(decoder, "row_limit", None) or decoder.max_tree_rows
        if max(sizes) > limit:
            raise SystemExit(f"llama.cpp computes at most {limit} rows per step here; sizes go up to {max(sizes)}")
        generator = np.random.default_rng(0)
        n = prompt_rows if prompt_rows and decoder.accepts_embeddings else 0
        table = (generator.standard_normal((n, decoder.hidden), dtype=np.float32) * WEIGHT_STD) if n else None
        cache = decoder.new_cache()
        start = time.perf_counter()
        prefill(decoder, cache, generator.integers(decoder.vocab_size, size=context).tolist())
        prefill_s = time.perf_counter() - start
        plain = latency.probe_tree(1, n, 1)
        padded = hasattr(decoder, "pad_steps")
        out = {"repeated_ms": {}, "pair_ms": {}, "fixed_pair_ms": {}}
        for size in sizes:
            tree = latency.probe_tree(size, n, 1)
            guesses = generator.integers(decoder.vocab_size, size=(max(tree.depth, 1), max(tree.max_rank + 1, 1)))
            speculator = Speculator(decoder, TreeFamily(f"probe-{size}", (tree,)), table)
            t0 = time.perf_counter()
            out["repeated_ms"][size] = latency.step_ms(speculator, cache, tree, guesses, context, warmup, repeats)
            out["pair_ms"][size] = latency.step_ms(speculator, cache, tree, guesses, context, warmup, repeats,
                                                   then=plain)
            if padded:
                decoder.pad_steps(size)
                try:
                    out["fixed_pair_ms"][size] = latency.step_ms(speculator, cache, tree, guesses, context, warmup,
                                                                 repeats, then=plain)
                finally:
                    decoder.pad_steps(None)
            print(f"  R={size:2d}: repeated {out['repeated_ms'][size]:8.2f} ms, pair {out['pair_ms'][size]:8.2f} ms"
                  + (f", fixed pair {out['fixed_pair_ms'][size]:8.2f} ms" if padded else "")
                  + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        single = out["pair_ms"][sizes[0]] / 2  # sizes start at 1
        result = {
            "latency_ms": {str(context): {str(s): round(max(out["pair_ms"][s] - single, 1e-3), 3) for s in sizes}},
            "repeated_ms": {str(s): round(v, 3) for s, v in out["repeated_ms"].items()},
            "pair_ms": {str(s): round(v, 3) for s, v in out["pair_ms"].items()},
        }
        if padded:
            result["fixed_ms"] = {str(s): round(v / 2, 3) for s, v in out["fixed_pair_ms"].items()}
            result["fixed_note"] = "pad_steps(R): an R-row step then a 1-token step padded to R rows, halved"
        else:
            result["fixed_note"] = "not measured: this LlamaCppDecoder has no pad_steps"
        result["decoder"] = {
            "load_s": round(load_s, 1), f"prefill_{context}_s": round(prefill_s, 2), "bitwise": decoder.bitwise,
            "gpu_layers": decoder.gpu_layers, "repacked_weights": bool(decoder._model_params.use_extra_bufts), "kv_type": decoder.kv_type,
            "prompt_rows": n, "accepts_embeddings": decoder.accepts_embeddings, "vocab_size": decoder.vocab_size,
            "system_info": decoder.system}
        return result
    finally:
        decoder.close()


def gpu_name() -> str | None:
    """``nvidia-smi``'s name, driver and memory of the first GPU, with the CUDA version; None without one."""
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=True).stdout.splitlines()[0]
        cuda = re.search(r"CUDA Version: ([0-9.]+)", subprocess.run(["nvidia-smi"], capture_output=True, text=True,
                                                                    timeout=20).stdout)
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    name, driver, memory = (part.strip() for part in line.split(","))
    return f"{name} ({memory}, driver {driver}" + (f", CUDA {cuda.group(1)})" if cuda else ")")


def wait_for_load(limit: float, at_most: float) -> float:
    """Seconds waited (at most ``at_most``) until the 1-minute load average is below ``limit``."""
    start = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - start < at_most:
        time.sleep(10)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--type", default="Q4_K_M", help=f"file type ({', '.join(TYPES)}, or another `ppd quantize` type)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "measurements" / "shapes")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--gguf-dir", type=Path, default=None, help="where the random GGUF goes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the random GGUF in --gguf-dir")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="tree sizes (rows per step), from 1")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per size and pattern (at most)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--context", type=int, default=512, help="cached tokens before each step")
    parser.add_argument("--prompt-rows", type=int, default=PROMPT_ROWS,
                        help="prompt-token rows (embeddings) on a tree's root; 0: token rows only")
    parser.add_argument("--wait-load", type=float, default=None,
                        help="before measuring, wait until the 1-minute load average is below this (shared machines)")
    parser.add_argument("--wait-max", type=float, default=1800, help="seconds --wait-load waits at most")
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    args = parser.parse_args()
    if args.list or args.shape is None:
        for name, shape in SHAPES.items():
            print(f"{name}: {shape.parameters() / 1e9:.2f} B parameters, {json.dumps(asdict(shape))}")
        return 0 if args.list else 2
    from ppd_core.backends.llamacpp.quantize import TYPES as QUANT_TYPES  # noqa: PLC0415

    if args.type not in QUANT_TYPES:
        parser.error(f"unknown type {args.type}; one of {', '.join(QUANT_TYPES)}")
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {1})
    python = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
    command = shlex.join([python, *sys.argv])
    temporary = args.gguf_dir is None
    folder = Path(tempfile.mkdtemp(prefix="ppd-shape-", dir=os.environ.get("TMPDIR"))) if temporary else args.gguf_dir
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    final = folder / f"random-{args.shape}-{args.type}.gguf"
    made = not final.is_file()  # a file already there (kept earlier) is used, and left there
    try:
        path, timing = make_gguf(args.shape, args.type, folder, args.threads)
        timing["file_bytes"] = path.stat().st_size
        types = tensor_types(path)
        print(f"{path.name}: {path.stat().st_size / 2**30:.2f} GiB, tensors {types}", flush=True)
        print(f"measuring sizes {sizes} after {args.context} cached tokens, {args.threads} threads", flush=True)
        waited = None
        if args.wait_load is not None:
            waited = round(wait_for_load(args.wait_load, args.wait_max))
            print(f"  waited {waited:.0f} s for the load average to fall below {args.wait_load}", flush=True)
        load_before = os.getloadavg()
        result = measure(path, args.threads, sizes, args.context, args.repeats, args.warmup, args.prompt_rows)
        result["load_average"] = {"before": [round(x, 2) for x in load_before],
                                  "after": [round(x, 2) for x in os.getloadavg()],
                                  "wait_load": args.wait_load, "waited_s": waited,
                                  "note": "1/5/15-minute load averages: above the thread count, other work shared "
                                          "the cores and the figures are slower and noisier than the device's"}
    finally:
        (folder / f"random-{args.shape}-F16.partial.gguf").unlink(missing_ok=True)
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)
        elif made and not args.keep:
            final.unlink(missing_ok=True)
    from ppd_core.device_policy import cpu_name  # noqa: PLC0415
    import llama_cpp  # noqa: PLC0415

    cpu = cpu_name()
    shape = SHAPES[args.shape]
    gpu = gpu_name() if result["decoder"]["gpu_layers"] else None
    where = (f"{gpu}, every layer offloaded, llama.cpp CUDA" if gpu
             else f"{cpu}, {args.threads} threads, llama.cpp CPU")
    record = {
        "device": f"{where} (llama-cpp-python {llama_cpp.__version__}, ppd's LlamaCppDecoder: flash attention, "
                  f"Q8_0 KV cache)",
        "model": f"{args.shape} {args.type} ({shape.hf_name}'s shape, random weights)",
        "source": f"measured with benchmarks/scripts/model_shapes.py on a random-weight GGUF of the shape made on the "
                  f"machine (step costs do not depend on the weights' values): median ms of a tree step of N rows "
                  f"between 1-token steps after {args.context} cached tokens; `{command}`",
        **{key: result.pop(key) for key in ("latency_ms", "repeated_ms", "pair_ms")},
        **{key: result.pop(key) for key in ("fixed_ms", "fixed_note") if key in result},
        "context": args.context,
        "shape": {"name": args.shape, **asdict(shape), "head_dim": shape.head_dim, "parameters": shape.parameters()},
        "type": args.type,
        "tensor_types": types,
        "making": timing,
        "cpu": cpu,
        "gpu": gpu,
        "machine": platform.machine(),
        "threads": args.threads,
        "cores": os.cpu_count(),
        **result,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "command": command,
        "wall_s": round(time.perf_counter() - started, 1),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    slug = "-".join(word for word in "".join(c if c.isalnum() else " " for c in (gpu.split(" (")[0] if gpu else cpu).lower()).split()
                    if word not in ("processor", "cpu", "with", "radeon", "graphics"))[:40] or platform.machine()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{args.shape}-{args.type}-{slug}-{'cuda' if gpu else f'{args.threads}threads'}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    print(json.dumps({k: record[k] for k in ("latency_ms", "repeated_ms")}
                     | ({"fixed_ms": record["fixed_ms"]} if "fixed_ms" in record else {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
