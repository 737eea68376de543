"""The llama.cpp backend: GGUF models decoded by llama.cpp (llama-cpp-python's low-level API).

llama.cpp owns the kernels, threads and devices (CPU, CUDA, Metal); this module owns the tree.

* **A tree in one ``llama_decode``.** The context's KV cache is unified and every token row carries the sequence ids
  of the leaves below it (``sequences.tree_sequences``), at position cache length + depth. llama.cpp lets a query
  see the cells holding its first sequence id at positions up to its own: exactly its ancestors. The context's
  cells belong to every sequence a tree uses.
* **Bitwise equal to single-token decoding** with flash attention and a Q8_0 KV cache, whose CPU kernel takes the
  same path for one query and many (the default f16 cache splits a single query's keys across threads, so long
  contexts round differently).
* **Rejected rows are parked, never freed.** A freed cell would take the next token ahead of accepted cells and the
  attention sums would run in another order. Parked cells keep only ``park``, a sequence no query uses. Since no
  cell is ever freed between rebuilds, llama.cpp places every new cell after all others, so accepted cells stay in
  position order. When parked cells fill the context, the cells after the first parked one are freed and the
  accepted tokens re-decoded in order (``LlamaCache.clean`` tracks that prefix).
* **Prompt-token rows are embeddings**: such a step is an embedding batch whose token rows are the file's own
  ``token_embd`` rows, de-quantized as llama.cpp does (bitwise the same logits).

One context serves every cache, the resident one's cells at a time (``cache``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ppd_core.backend import BackendInfo, StepRows
from ppd_core.cpu_cores import usable_cores
from ppd_core.device_memory import read_memory
from ppd_core.device_policy import cpu_properties, llama_extra_buffers, rows_bitwise
from ppd_core.faults import fault
from ppd_core.backends.llamacpp.grammar import Grammar
from ppd_core.backends.llamacpp import compute_thread
from ppd_core.backends.llamacpp.batch import BATCH_ROWS, Batch
from ppd_core.backends.llamacpp.cache import (
    DEFAULT_MAX_CONTEXT, INITIAL_CONTEXT, PREFILL_ROWS, SPARE_CELLS, TREE_ROWS, LlamaCache,
)
from ppd_core.backends.llamacpp.library import LIVE_MODELS, LlamaCppError, import_llama_cpp, quiet_logs, system_info
from ppd_core.backends.llamacpp.rows import EmbeddingRows
from ppd_core.backends.llamacpp.sequences import tree_sequences
from ppd_core.backend_registry import BackendName
from ppd_core.sampling.logits import HostLogits

log = logging.getLogger(__name__)

class LlamaCppDecoder:
    """``Decoder`` on llama.cpp for a GGUF file."""

    name: BackendName = "llamacpp"
    forward = "llamacpp"
    # what ``close`` frees, None until made (a constructor that fails anywhere leaves a decoder close() can free;
    # the embedding batch is made on the first step with prompt-token rows)
    model = context = _token_batch = _embedding_batch = _embeddings = None

    def __init__(self, gguf_file: Path, threads: int = 0, gpu_layers: int | None = None,
                 max_context: int | None = None, kv_type: str = "q8_0", spare_cells: int = SPARE_CELLS,
                 initial_context: int = INITIAL_CONTEXT, architecture: str | None = None):
        llama = self.llama = import_llama_cpp()
        llama.llama_backend_init()
        quiet_logs(llama)
        self.gguf_file = Path(gguf_file)
        try:
            self._load(llama, threads, gpu_layers, max_context, kv_type, spare_cells, initial_context, architecture)
        except BaseException:
            self.close()  # nothing of a failed load stays in memory
            raise

    def _load(self, llama, threads, gpu_layers, max_context, kv_type, spare_cells, initial_context, architecture) -> None:
        model_params = self._model_params = llama.llama_model_default_params()
        offload = llama.llama_supports_gpu_offload()
        model_params.n_gpu_layers = (-1 if offload else 0) if gpu_layers is None else gpu_layers
        self.gpu_layers = model_params.n_gpu_layers if offload else 0
        self.bitwise = rows_bitwise(cpu_properties(), self.gpu_layers)
        self.system = system_info(llama)
        model_params.use_extra_bufts = llama_extra_buffers(self.system)
        self._load_model()
        fault("load.model")
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.vocab_size = llama.llama_vocab_n_tokens(self.vocab)
        self.hidden = llama.llama_model_n_embd(self.model)
        trained = llama.llama_model_n_ctx_train(self.model)
        self.max_context = min(max_context or DEFAULT_MAX_CONTEXT, trained if trained > 0 else DEFAULT_MAX_CONTEXT)
        self.threads = threads or usable_cores()
        self.kv_type = kv_type
        params = self._params = llama.llama_context_default_params()
        self.row_limit = TREE_ROWS["gpu" if self.gpu_layers else "cpu"]  # the most rows one step may have
        # sequence ids: one per leaf (a tree has at most as many leaves as rows), the padding, the park, the keep marker
        self.seq_max = self.row_limit + 3
        self.park, self.keep_marker = self.seq_max - 1, self.seq_max - 2  # rejected rows; a path changing hands
        self.pad_seq = self.seq_max - 3  # padding rows: no real row holds it, so none sees them
        params.n_batch, params.n_ubatch = BATCH_ROWS, max(self.row_limit, PREFILL_ROWS)  # a tree is one ubatch
        params.n_seq_max = self.seq_max
        params.kv_unified = True
        # sliding-window models (Gemma, Mistral with a window) keep every position's cells, as other models do: the
        # tree's rejected rows and the cache copies between sequences then work the same (the window is in the mask)
        params.swa_full = True
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = params.type_v = {"q8_0": llama.GGML_TYPE_Q8_0, "f16": llama.GGML_TYPE_F16, "f32": llama.GGML_TYPE_F32}[kv_type]
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        self.spare_cells = spare_cells
        # a recurrent or hybrid cache (Mamba, RWKV, Jamba...) cannot hold a tree's branches: plain decoding there
        recurrent = llama.llama_model_is_recurrent(self.model) or getattr(llama, "llama_model_is_hybrid", lambda m: False)(self.model)
        self.tree_note = (f"{self.gguf_file.name} keeps a recurrent state, which cannot hold a tree of guesses: "
                          "plain decoding") if recurrent else None
        self._resident: LlamaCache | None = None  # the cache whose cells the context holds
        self._open(min(initial_context, self.max_context))
        self._token_batch = Batch(llama, self.seq_max)
        self.rebuilds = self.grows = 0  # re-decodes that dropped parked cells; contexts made larger for a conversation
        self._embeddings = EmbeddingRows(self.gguf_file, architecture)
        if self.bitwise:  # the policy allows it; this file's kernels must show it (not every type's do)
            self.bitwise = self.rows_match_single_steps()
            if not self.bitwise and self._model_params.use_extra_bufts:
                # the weights repacked for batched kernels (Q4_0, Q4_K, IQ4_NL on x86) can round a batch otherwise:
                # the plain layout's kernels instead, where they are row-invariant (exact output before speed)
                self._model_params.use_extra_bufts = False
                self._reload_model()
                self.bitwise = self.rows_match_single_steps()
        # prompt-token rows go in as embeddings: only where an embedding row is what its token gives the model
        self.accepts_embeddings = self._embeddings.matches_tokens
        self.info = self.make_info()

    def make_info(self) -> BackendInfo:
        """What this decoder is, for everything outside decoding (threads are the context's, fixed at load)."""
        properties = cpu_properties(self.threads)  # llama.cpp offloads by itself: the process's device is the CPU
        return BackendInfo(
            name=self.name, forward=self.forward, vocab_size=self.vocab_size, max_context=self.max_context,
            bitwise=self.bitwise, threads=self.threads, max_tree_rows=self.row_limit,
            accepts_embeddings=self.accepts_embeddings, tree_note=self.tree_note, pads_steps=True,
            kernels=self.describe(), dtype="float32", device="cpu", device_kind="cpu", properties=properties,
            read_memory=functools.partial(read_memory, properties, None), offloaded=self.gpu_layers)

    def _load_model(self) -> None:
        self.model = self.llama.llama_model_load_from_file(str(self.gguf_file).encode(), self._model_params)
        if not self.model:
            raise LlamaCppError(f"llama.cpp could not load {self.gguf_file.name}")
        LIVE_MODELS.add(id(self))

    def _reload_model(self) -> None:
        """The model loaded again with ``_model_params`` (its context, vocabulary and batches made anew)."""
        llama = self.llama
        llama.llama_free(self.context)
        self.context = None
        llama.llama_model_free(self.model)
        self.model = None
        LIVE_MODELS.discard(id(self))
        self._load_model()
        self.vocab = llama.llama_model_get_vocab(self.model)
        self._resident = None
        self._open(self.positions)

    def rows_match_single_steps(self, context: int = 32, rows: int = 8) -> bool:
        """Whether a batch of ``rows`` chained rows gets, bit for bit, the logits single-token steps give them
        after ``context`` cached tokens. With llamafile's GEMM or ggml's tiled K-quant multiply on (not ppd's build),
        K-quant, IQ4_NL and F16 files' batches came out 0.3-0.9 logits away from single steps; then greedy PPD
        equals plain decoding only up to near-ties, and the device panel says so."""
        tokens = np.linspace(100, self.vocab_size - 1, context + rows).astype(np.int64).tolist()
        cache = self.new_cache()
        self.prefill(cache, tokens[:context])
        batch = self._decode_tokens(cache, tokens[context:], context, all_rows=True)  # [rows, vocab]
        cache.tokens.extend(tokens[context:])
        self.truncate(cache, context)  # the same cells again, one token at a time
        steps = [self.prefill(cache, [token]).values[0] for token in tokens[context:]]
        self.llama.llama_memory_clear(self.memory, True)
        self._evict()
        return bool(np.array_equal(batch.values, np.stack(steps)))

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value of the model, as text (None where the file has no such key)."""
        buffer = ctypes.create_string_buffer(256)
        length = self.llama.llama_model_meta_val_str(self.model, key.encode(), buffer, len(buffer))
        return buffer.value.decode(errors="replace") if length >= 0 else None

    def close(self) -> None:
        """Free llama.cpp's model, context and batches and the embedding map (idempotent, and on a half-made decoder)."""
        llama = getattr(self, "llama", None)
        for batch in (self._token_batch, self._embedding_batch):
            if batch is not None:
                batch.free()
        self._token_batch = self._embedding_batch = None
        if self.context:
            llama.llama_free(self.context)
            self.context = None
        if self.model:
            llama.llama_model_free(self.model)
            self.model = None
            LIVE_MODELS.discard(id(self))
        if self._embeddings is not None:
            self._embeddings.close()
            self._embeddings = None

    def __del__(self) -> None:  # a decoder dropped without close() still frees llama.cpp's memory
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()

    # --- the protocol -------------------------------------------------------------------------

    pads_steps = True

    def set_threads(self, threads: int) -> None:
        """Nothing: llama.cpp's threads are the context's, chosen at load (``threads``)."""

    def grammar(self, text: str) -> Grammar:
        """llama.cpp's grammar sampler for GBNF ``text`` on this model's vocabulary, before any token."""
        return Grammar(self.llama, self.vocab, text, vocab_size=self.vocab_size)

    def new_cache(self) -> LlamaCache:
        return LlamaCache()

    def cache_length(self, cache: LlamaCache) -> int:
        return len(cache.tokens)

    def prefill(self, cache: LlamaCache, token_ids: Sequence[int]) -> HostLogits:
        self._make_resident(cache, len(token_ids))
        in_order = cache.clean == len(cache.tokens) == cache.cells  # no parked cell: the new cells extend the prefix
        logits = self._decode_tokens(cache, list(token_ids), len(cache.tokens))  # [1, vocab]
        cache.tokens.extend(token_ids)
        if in_order:
            cache.clean = len(cache.tokens)
        return logits

    def tree_logits(self, cache: LlamaCache, rows: StepRows) -> HostLogits:
        """The step's rows in one ``llama_decode``; with ``rows.pad_to`` (R) as exactly R rows, all with logits: the
        tree's, then padding rows on ``pad_seq`` that no real row sees, freed after the step. On CUDA llama.cpp keeps
        one graph for one batch shape, so steps of one shape replay it where a tree between 1-token steps re-captured
        it every time (docs, "On a GPU"). Without it each step is its own shape (the CPU's best)."""
        T, start = rows.num_rows, len(cache.tokens)
        R = rows.pad_to or T  # rows decoded: the tree's, then padding
        if T > self.row_limit or not T <= R <= self.row_limit:
            raise LlamaCppError(f"a step of {T} rows padded to {R}: llama.cpp computes 1 to {self.row_limit} at once here")
        sequences, leaves = tree_sequences(rows.parents)
        self._make_resident(cache, R)
        self._widen(cache, leaves)
        N, node_tokens = len(rows.tokens), rows.tokens
        positions = (rows.positions + start).astype(np.int32)  # [T]
        if rows.embeddings is None:
            batch = self._token_batch
            batch.tokens[:T] = node_tokens
            batch.tokens[T:R] = node_tokens[0]
        else:
            batch = self._embedding_rows_batch()
            batch.embeddings[:N] = self._embeddings.rows(node_tokens.tolist())
            batch.embeddings[N:T] = rows.embeddings
            batch.embeddings[T:R] = batch.embeddings[0]
        padding = np.arange(start, start + R - T, dtype=np.int32)  # [R - T] on the padding sequence alone
        batch.fill(np.concatenate([positions, padding]), [*sequences, *[[self.pad_seq]] * (R - T)], outputs=1)
        logits = self._run(batch, R, R)  # [R, vocab]
        if R > T:  # the padding's cells lie after the tree's: freed, the next step's cells take their place in order
            self.llama.llama_memory_seq_rm(self.memory, self.pad_seq, -1, -1)
            logits = HostLogits(logits.values[:T])  # [T, vocab]
        cache.cells += T
        return logits

    def keep(self, cache: LlamaCache, start: int, path: Sequence[int], rows: StepRows) -> None:
        llama, memory = self.llama, self.memory
        end = start + len(path)
        if len(path) < rows.num_rows:  # park the step's other rows
            last = tree_sequences(rows.parents)[0][path[-1]][0]  # its cells from ``start`` to ``end``: the path
            llama.llama_memory_seq_cp(memory, last, self.keep_marker, start, end)
            for seq in range(cache.width):  # every row holds a leaf's sequence, and leaves <= width
                llama.llama_memory_seq_cp(memory, seq, self.park, start, -1)
                llama.llama_memory_seq_rm(memory, seq, start, -1)
            for seq in range(cache.width):
                llama.llama_memory_seq_cp(memory, self.keep_marker, seq, start, end)
            llama.llama_memory_seq_rm(memory, self.keep_marker, -1, -1)
        else:  # a chain accepted whole: its rows hold sequence 0 only
            for seq in range(1, cache.width):
                llama.llama_memory_seq_cp(memory, 0, seq, start, -1)
        if cache.clean == start == cache.cells - rows.num_rows:  # no parked cell before the step's rows:
            # its accepted rows before the first rejected one sit in the cells after the clean prefix
            cache.clean += next((i for i, row in enumerate(path) if row != i), len(path))
        cache.tokens.extend(int(rows.tokens[i]) for i in path)

    def truncate(self, cache: LlamaCache, length: int) -> None:
        if length >= len(cache.tokens):
            return
        if self._resident is cache:
            if cache.clean >= length:  # cells 0..length-1 hold tokens 0..length-1: free every other cell
                self._free_after(length)
                cache.cells, cache.clean = length, length
            else:  # accepted cells after a parked one: park them too
                for seq in range(cache.width):
                    self.llama.llama_memory_seq_cp(self.memory, seq, self.park, length, -1)
                    self.llama.llama_memory_seq_rm(self.memory, seq, length, -1)
        else:
            cache.clean = min(cache.clean, length)
        del cache.tokens[length:]

    def embedding_rows(self, token_ids: np.ndarray) -> np.ndarray:
        return self._embeddings.rows(np.asarray(token_ids).tolist())  # [k, hidden]

    def describe(self) -> dict:
        return {"backend": self.name, "gpu_layers": self.gpu_layers, "threads": self.threads,
                "kv_cache": self.kv_type, "flash_attention": True, "llama_cpp_python": self.llama.__version__,
                "system": self.system, "repacked_weights": bool(self._model_params.use_extra_bufts)}

    # --- the context ----------------------------------------------------------------------------

    def _open(self, positions: int) -> None:
        """(Re)create the context with room for ``positions`` positions plus the spare cells; it holds no cache."""
        if self.context:
            self.llama.llama_free(self.context)
        self._params.n_ctx = positions + self.spare_cells
        self.context = self.llama.llama_init_from_model(self.model, self._params)
        if not self.context:
            raise LlamaCppError(f"llama.cpp could not create a context of {self._params.n_ctx} cells for {self.gguf_file.name}")
        self.cells = self.llama.llama_n_ctx(self.context)  # llama.cpp rounds it up
        self.positions = min(self.max_context, self.cells - self.spare_cells)
        self.memory = self.llama.llama_get_memory(self.context)
        self._evict()

    def _evict(self) -> None:
        """The resident cache's cells are gone: all of it is re-decoded when it returns."""
        if self._resident is not None:
            self._resident.clean = 0
        self._resident = None

    def _make_resident(self, cache: LlamaCache, new_rows: int) -> None:
        """Put ``cache`` in the context with room for ``new_rows`` more cells (re-decoding it if needed), in a
        larger context if its positions outgrow this one."""
        needed = len(cache.tokens) + new_rows
        if needed > self.cells:
            if needed > self.max_context + self.spare_cells:
                raise LlamaCppError(f"{needed} positions exceed llama.cpp's context of {self.max_context + self.spare_cells}")
            self._open(min(self.max_context, max(2 * self.positions, needed)))
            self.grows += 1
            log.info("llama.cpp: context grown to %d positions", self.positions)
        if self._resident is not cache:
            self.llama.llama_memory_clear(self.memory, True)
            self._evict()
            self._resident = cache
            cache.cells = cache.clean = 0
            cache.width = 1
        elif cache.cells + new_rows <= self.cells:
            return
        # free everything after the clean prefix, then decode the accepted tokens after it in order
        self._free_after(cache.clean)
        cache.cells = cache.clean
        rest = cache.tokens[cache.clean :]
        if rest:
            log.info("llama.cpp: re-decoding %d cached tokens to drop parked cells", len(rest))
            self.rebuilds += 1
            self._decode_tokens(cache, rest, cache.clean, logits=False)
        cache.clean = len(cache.tokens)

    def _free_after(self, length: int) -> None:
        """Free every cell but the first ``length``, which must hold tokens 0..length-1 in order (parked
        cells always lie after them, though a parked cell's position may be lower than ``length``)."""
        self.llama.llama_memory_seq_rm(self.memory, -1, length, -1)
        self.llama.llama_memory_seq_rm(self.memory, self.park, -1, -1)

    def _widen(self, cache: LlamaCache, leaves: int) -> None:
        """Give the accepted cells sequences 0..leaves-1 as well."""
        for seq in range(cache.width, leaves):
            self.llama.llama_memory_seq_cp(self.memory, 0, seq, -1, -1)
        cache.width = max(cache.width, leaves)

    def _decode_tokens(self, cache: LlamaCache, tokens: list[int], start: int, logits: bool = True,
                       all_rows: bool = False) -> HostLogits | None:
        """Decode a chain of tokens at positions ``start, ...`` on sequences 0..width-1, a batch at a time;
        the last token's logits [1, vocab] (``all_rows``: every row's, for a chain of at most one batch)."""
        batch, seqs = self._token_batch, [list(range(cache.width))] * BATCH_ROWS
        result = None
        for begin in range(0, len(tokens), BATCH_ROWS):
            chunk = tokens[begin : begin + BATCH_ROWS]
            count = len(chunk)
            batch.tokens[:count] = chunk
            outputs = np.zeros(count, dtype=np.int8)
            last = begin + count == len(tokens)
            outputs[-1] = logits and last
            if all_rows:
                outputs[:] = 1
            batch.fill(np.arange(start + begin, start + begin + count, dtype=np.int32), seqs[:count], outputs)
            out = self._run(batch, count, int(outputs.sum()))
            cache.cells += count
            if last and logits:
                result = out
        return result

    def _embedding_rows_batch(self):
        if self._embedding_batch is None:
            self._embedding_batch = Batch(self.llama, self.seq_max, self.hidden)
        return self._embedding_batch

    def _run(self, batch, rows: int, outputs: int) -> HostLogits:
        """``llama_decode`` of the batch's first ``rows`` rows; the logits of its ``outputs`` rows [outputs, vocab]."""
        batch.raw.n_tokens = rows
        status = compute_thread.run(self.llama.llama_decode, self.context, batch.raw)  # one OpenMP team for all callers
        if status != 0:
            raise LlamaCppError(f"llama_decode failed with status {status} ({rows} rows)")
        pointer = self.llama.llama_get_logits(self.context)
        logits = np.ctypeslib.as_array(pointer, shape=(outputs, self.vocab_size))  # llama.cpp's buffer
        return HostLogits(logits.copy())  # the next decode overwrites the buffer
