"""EmbeddingRows: a GGUF file's token rows, which llama.cpp must turn into the logits of their tokens bit for bit.

Every case decodes the same positions twice in a llama.cpp context configured as ppd's backend configures
it (flash attention, Q8_0 KV cache, unified cells, full sliding-window cache): once as a token batch, once as
an embedding batch (``llama_batch_init(n, n_embd, ...)``) of ``EmbeddingRows`` rows, and the logits must be
``np.array_equal``.
"""

from __future__ import annotations

import gc
import tracemalloc

import llama_cpp
import numpy as np
import pytest
from tiny_gguf import ARCHITECTURES, quiet_llama_logs, tiny_models, write_table_gguf  # noqa: F401 - a fixture

from ppd_core.backends.llamacpp import rows as gguf_rows
from ppd_core.backends.llamacpp.rows import EmbeddingRows, EmbeddingRowsError
from ppd_core.errors import PpdError
from ppd_core.loading import default_model_file

# tokens of two consecutive decodes (the second reads the first's KV cells); 16 positions cross the tiny
# sliding window (8)
TOKENS = np.random.default_rng(7).integers(0, 49152, 16)
FIRST = 10


class Runner:
    """One model and context, as LlamaCppDecoder configures them (threads aside: 1 is fast on a shared CPU)."""

    def __init__(self, gguf_file, threads: int = 1):
        llama_cpp.llama_backend_init()
        quiet_llama_logs(llama_cpp)
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = False  # AMX repacking segfaults (ppd's extra-buffer policy)
        self.model = llama_cpp.llama_model_load_from_file(str(gguf_file).encode(), model_params)
        assert self.model, f"llama.cpp did not load {gguf_file}"
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 256, 512, 128, 2
        params.kv_unified = params.swa_full = True
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_Q8_0
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.context = llama_cpp.llama_init_from_model(self.model, params)
        assert self.context
        self.hidden = llama_cpp.llama_model_n_embd(self.model)
        self.vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def decode(self, start: int, tokens=None, rows=None, outputs=None) -> np.ndarray:
        """Logits [outputs, vocab] of one batch at positions start.. on sequence 0 (all rows are outputs by default)."""
        count = len(tokens) if rows is None else len(rows)
        batch = llama_cpp.llama_batch_init(count, 0 if rows is None else self.hidden, 1)
        try:
            if rows is None:
                np.ctypeslib.as_array(batch.token, shape=(count,))[:] = tokens
            else:
                np.ctypeslib.as_array(batch.embd, shape=(count, self.hidden))[:] = rows
            np.ctypeslib.as_array(batch.pos, shape=(count,))[:] = np.arange(start, start + count)
            np.ctypeslib.as_array(batch.n_seq_id, shape=(count,))[:] = 1
            for row in range(count):
                batch.seq_id[row][0] = 0
            flags = np.ones(count, dtype=np.int8) if outputs is None else outputs
            np.ctypeslib.as_array(batch.logits, shape=(count,))[:] = flags
            batch.n_tokens = count
            assert llama_cpp.llama_decode(self.context, batch) == 0
            logits = llama_cpp.llama_get_logits(self.context)
            return np.ctypeslib.as_array(logits, shape=(int(flags.sum()), self.vocab)).copy()
        finally:
            llama_cpp.llama_batch_free(batch)

    def logits(self, tokens=None, rows=None) -> np.ndarray:
        """Logits of the last 2 rows of a first decode and every row of a second one, from an empty cache."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.context), True)
        first = np.zeros(FIRST, dtype=np.int8)
        first[-2:] = 1
        part = (lambda a, b: {"tokens": tokens[a:b]}) if rows is None else (lambda a, b: {"rows": rows[a:b]})
        head = self.decode(0, outputs=first, **part(0, FIRST))
        tail = self.decode(FIRST, **part(FIRST, len(TOKENS)))
        return np.concatenate([head, tail])  # [2 + 6, vocab]

    def close(self) -> None:
        llama_cpp.llama_free(self.context)
        llama_cpp.llama_model_free(self.model)


def assert_rows_give_token_logits(gguf_file, expected_kind: str | None = None, threads: int = 1) -> EmbeddingRows:
    runner = Runner(gguf_file, threads)
    try:
        with EmbeddingRows(gguf_file) as table:
            if expected_kind is not None:
                assert table.kind == expected_kind
            assert table.hidden_size == runner.hidden and table.vocab_size == runner.vocab
            assert table.matches_tokens and table.dequantizer == "ggml"
            rows = table.rows(TOKENS)  # [16, hidden]
            assert rows.dtype == np.float32 and rows.shape == (len(TOKENS), runner.hidden)
            by_token = runner.logits(tokens=TOKENS)
            by_row = runner.logits(rows=rows)
            assert np.isfinite(by_token).all() and by_token.std() > 0.1  # a working model, not degenerate logits
            assert np.array_equal(by_row, by_token), f"max difference {np.abs(by_row - by_token).max()}"
            if table.scale is not None:  # the graph scales token rows only: unscaled rows must differ
                assert not np.array_equal(runner.logits(rows=rows / table.scale), by_token)
            return table
    finally:
        runner.close()


# (architecture, file type): llama.cpp's quantizer picks the token embedding's type; tied embeddings
# (all but phi3) get Q6_K for every K-quant file type
REQUANTIZED = [(architecture, "F16", "F16") for architecture in ARCHITECTURES] + [
    ("llama", "Q4_0", "Q6_K"), ("llama", "Q8_0", "Q8_0"), ("llama", "Q4_K_M", "Q6_K"), ("llama", "IQ4_NL", "Q6_K"),
    ("gemma3", "Q8_0", "Q8_0"), ("gemma3", "Q4_K_M", "Q6_K"), ("gemma2", "Q8_0", "Q8_0"), ("gemma2", "Q5_K_M", "Q6_K"),
    ("qwen2", "Q8_0", "Q8_0"), ("qwen2", "Q5_K_M", "Q6_K"), ("qwen3", "Q8_0", "Q8_0"), ("qwen3", "Q6_K", "Q6_K"),
    ("phi3", "Q4_0", "Q4_0"), ("phi3", "Q4_K_M", "Q4_K"), ("phi3", "Q8_0", "Q8_0"),
]


@pytest.mark.parametrize(("architecture", "file_type", "embedding_kind"), REQUANTIZED,
                         ids=[f"{a}-{t}" for a, t, _ in REQUANTIZED])
def test_requantized_models(tiny_models, architecture, file_type, embedding_kind):
    table = assert_rows_give_token_logits(tiny_models.get(architecture, file_type), embedding_kind)
    # Gemma 3 scales token rows only (so rows carry sqrt(256) = 16); Gemma 2 scales embedding rows too
    assert (table.scale == np.float32(16.0)) if architecture == "gemma3" else table.scale is None


# every other type llama.cpp's get_rows reads, as the token embedding (written directly; the rest stays F16)
EMBEDDING_TYPES = [("llama", kind) for kind in (
    "F32", "BF16", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS",
    "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0")] + [
    ("gemma3", "Q4_K"), ("gemma3", "IQ4_XS"), ("qwen3", "Q3_K"), ("phi3", "Q2_K"), ("qwen2", "IQ3_S")]


@pytest.mark.parametrize(("architecture", "kind"), EMBEDDING_TYPES, ids=[f"{a}-{k}" for a, k in EMBEDDING_TYPES])
def test_token_embedding_types(tiny_models, architecture, kind):
    assert_rows_give_token_logits(tiny_models.get(architecture, "F16", kind), kind)


def test_tiny_models_as_llama_cpp_reads_them(tiny_models):
    """Sliding window for Gemma; a chat template for all but gemma3; the default model's vocabulary."""
    for architecture in ARCHITECTURES:
        runner = Runner(tiny_models.get(architecture))
        try:
            template = llama_cpp.llama_model_chat_template(runner.model, None)
            assert (template is None) is (architecture == "gemma3"), architecture
            swa = llama_cpp.llama_model_n_swa(runner.model)
            assert swa == (8 if architecture.startswith("gemma") else 0), (architecture, swa)
            assert (runner.hidden, runner.vocab) == (256, 49152)
            assert llama_cpp.llama_model_n_layer(runner.model) == 2
        finally:
            runner.close()


def test_type_newer_than_the_gguf_package(tiny_models):
    """Q2_0 (ggml type 42) is unknown to gguf 0.19: its row format and de-quantization come from ggml."""
    from gguf import GGMLQuantizationType

    assert 42 not in GGMLQuantizationType._value2member_map_
    assert_rows_give_token_logits(tiny_models.get("llama", "F16", "Q2_0", requantize_embedding=True), "Q2_0")


def test_default_model():
    """The default model (Q4_1, its token embedding Q8_0)."""
    assert_rows_give_token_logits(default_model_file(), "Q8_0")


def test_two_threads(tiny_models):
    """Two threads, as ppd decodes on this machine (each kernel splits its rows between them)."""
    assert_rows_give_token_logits(tiny_models.get("llama", "Q4_K_M"), "Q6_K", threads=2)


# --- rows against the gguf package ---------------------------------------------------------------------

TABLE_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
               "MXFP4", "NVFP4", "Q1_0"]


@pytest.mark.parametrize("kind", TABLE_TYPES)
def test_rows_agree_with_gguf_quants(tmp_path, monkeypatch, kind):
    """ggml's to_float and gguf.quants.dequantize agree bit for bit on every type both implement; where ggml's
    symbol is missing the gguf package de-quantizes (Q1_0 it cannot: a one-line error says so)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    path = tmp_path / f"{kind}.gguf"
    table = write_table_gguf(path, kind)
    ids = np.array([5, 0, 63, 5, 17])
    with EmbeddingRows(path) as embedding:
        assert (embedding.kind, embedding.dequantizer, embedding.vocab_size) == (kind, "ggml", 64)
        rows = embedding.rows(ids)
    assert rows.shape == (5, 256) and np.isfinite(rows).all()
    monkeypatch.setattr(gguf_rows, "ggml_to_float", lambda *args: None)  # as without llama_cpp's library
    with EmbeddingRows(path) as fallback:
        if kind in ("F32",):
            assert np.array_equal(fallback.rows(ids), rows)
            return
        assert fallback.dequantizer == "gguf.quants"
        try:
            reference = dequantize(table[ids], GGMLQuantizationType[kind])
        except NotImplementedError:
            with pytest.raises(EmbeddingRowsError, match="needs llama.cpp's ggml library") as error:
                fallback.rows(ids)
            assert "\n" not in str(error.value)
            return
        assert np.array_equal(rows, reference)
        assert np.array_equal(fallback.rows(ids), rows)


def test_reads_no_vocabulary():
    """The header read neither keeps nor builds the vocabulary's arrays (the stock GGUFReader allocates
    ~150 MB for the default model's 49k tokens and merges)."""
    from gguf.gguf_reader import GGUFReader, ReaderField

    gc.collect()
    tracemalloc.start()
    try:
        embedding = EmbeddingRows(default_model_file())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        gc.collect()
        assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB allocated while reading the header"
        assert not any(issubclass(type(item), (GGUFReader, ReaderField)) for item in gc.get_objects())
        assert embedding.rows([1, 2]).shape == (2, 576)
    finally:
        embedding.close()


# --- errors and lifetime --------------------------------------------------------------------------------------


def one_line_error(path, match: str) -> None:
    with pytest.raises(EmbeddingRowsError, match=match) as error:
        EmbeddingRows(path)
    assert isinstance(error.value, PpdError) and "\n" not in str(error.value)


def test_files_that_are_not_complete_ggufs(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n" * 10)
    one_line_error(text, "notes.gguf is not a GGUF file")
    one_line_error(tmp_path / "absent.gguf", "cannot read absent.gguf")
    whole = tmp_path / "whole.gguf"
    write_table_gguf(whole, "Q4_K")
    data = whole.read_bytes()
    cut_in_data = tmp_path / "cut-data.gguf"
    cut_in_data.write_bytes(data[: len(data) - 100])
    one_line_error(cut_in_data, "cut-data.gguf is truncated")
    cut_in_header = tmp_path / "cut-header.gguf"
    cut_in_header.write_bytes(data[:40])
    one_line_error(cut_in_header, "cut-header.gguf is not a complete GGUF file")


def test_file_without_token_embedding(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "norms.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    one_line_error(path, "norms.gguf has no token_embd.weight tensor")


def test_lifetime_and_bad_ids(tmp_path):
    path = tmp_path / "table.gguf"
    write_table_gguf(path, "Q8_0", architecture="gemma3")
    embedding = EmbeddingRows(path)
    assert embedding.scale == np.float32(16.0)  # gemma3: sqrtf(n_embd)
    assert EmbeddingRows(path, architecture="llama").scale is None  # the caller's architecture wins
    assert embedding.rows([]).shape == (0, 256)
    assert np.array_equal(embedding.rows(np.array([3])), embedding.rows([3]))
    with pytest.raises(EmbeddingRowsError, match=r"token ids must lie in 0\.\.63"):
        embedding.rows([64])
    with embedding:
        pass
    embedding.close()  # idempotent
    with pytest.raises(EmbeddingRowsError, match="closed"):
        embedding.rows([0])


@pytest.mark.parametrize(("architecture", "matches"), [("gemma3n", False), ("cogvlm", False), ("qwen3vl", False),
                                                        ("gemma2", True), ("qwen3", True)])
def test_architectures_whose_embedding_batches_take_another_path(tmp_path, architecture, matches):
    path = tmp_path / "table.gguf"
    write_table_gguf(path, "F16", architecture=architecture)
    with EmbeddingRows(path) as embedding:
        assert embedding.matches_tokens is matches
        assert (embedding.mismatch is None) is matches
