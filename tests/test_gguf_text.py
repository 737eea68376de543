"""The llama.cpp-native tokenizer, chat template and GGUF header (ppd_core.backends.llamacpp.text, ppd_core.backends.llamacpp.info).

The reference is transformers' tokenizer of the same GGUF file; small GGUF files made here with
``gguf.GGUFWriter`` (the default model's vocabulary, no tensors, loaded vocabulary-only) give a model
without a chat template, templates that refuse or fail, and the bad files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")  # the set-up builds it; test_llamacpp.py checks that it does

import gguf  # noqa: E402
import numpy as np  # noqa: E402

from ppd_core.backends.llamacpp.library import quiet_logs  # noqa: E402
from ppd_core.backends.llamacpp.info import (  # noqa: E402
    ARCHITECTURES_VERSION,
    GgufFileError,
    NotEnoughMemoryError,
    available_memory,
    check_memory,
    kv_cache_bytes,
    known_architecture,
    memory_needed,
    read_gguf_info,
)
from ppd_core.backends.llamacpp.text import CHATML_SOURCE, MODEL_TEMPLATE, ByteTextStream, ChatTemplateError, GgufTokenizer  # noqa: E402
from ppd_core.loading import default_model_file  # noqa: E402

TEXTS = [
    "Hello world",
    " one leading space",
    "   three leading spaces and trailing   ",
    # (not " ½": transformers' GGUF conversion drops SmolLM2's digit splitting and cuts "½" mid-character;
    # llama.cpp keeps the "smollm" pre-tokenizer, as the original tokenizer.json does)
    "héllo wörld, ünïcödé façade — “quotes” … x²",
    "日本語のテキストと中文字符 한국어",
    "emoji 🎉👍🏽🇫🇷 and a family 👨‍👩‍👧 ok",
    "def square(x):\n    return x ** 2  # comment\n\tif x != 0: print(f'{x=}')\n",
    "Hello <|im_start|>user\nworld<|im_end|>\n<|endoftext|>",
    "<|im_start|><|im_end|>",
    "",
    "\n\n \n",
    "a" * 500 + " " + "ß" * 200,
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi 🎉"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Code:\n```py\nx = 1\n```"}, {"role": "assistant", "content": " x is 1. "},
     {"role": "user", "content": "日本語で?"}],
]
GEMMA_LIKE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
              "{% endif %}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content']"
              " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def load(path: Path, vocab_only: bool = False):
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False  # this CPU has AMX: llama.cpp's repacking segfaults (ppd_core.device_policy)
    params.n_gpu_layers = 0
    params.vocab_only = vocab_only
    return llama_cpp.llama_model_load_from_file(str(path).encode(), params)


@pytest.fixture(scope="module")
def loaded():
    llama_cpp.llama_backend_init()
    quiet_logs(llama_cpp)
    models = []

    def open_model(path: Path, vocab_only: bool = False):
        model = load(path, vocab_only)
        assert model, f"llama.cpp did not load {path}"
        models.append(model)
        return model

    yield open_model
    for model in models:
        llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def tokenizer(loaded) -> GgufTokenizer:
    return GgufTokenizer(loaded(default_model_file()), llama_cpp)


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    path = default_model_file()
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def default_fields():
    """The default file's metadata as (key, value, type, sub type), read by gguf's reader."""
    reader = gguf.GGUFReader(default_model_file())
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        fields.append((key, field.contents(), kind, sub))
    last = max(reader.tensors, key=lambda tensor: tensor.data_offset)
    return fields, last.data_offset + last.n_bytes, len(reader.tensors)


def write_gguf(path: Path, default_fields, architecture: str = "llama", extra=(), **overrides) -> Path:
    """A GGUF with the default file's metadata and no tensors: ``extra`` (key, value, type, sub type) entries are
    added or replace the file's, ``overrides`` replace values (None drops the key; a new key is a string)."""
    entries = {key: (value, kind, sub) for key, value, kind, sub in [*default_fields[0], *extra]}
    for key, value in overrides.items():
        if value is None:
            entries.pop(key, None)
        else:
            entries[key] = (value, *entries.get(key, (None, gguf.GGUFValueType.STRING, None))[1:])
    writer = gguf.GGUFWriter(path, architecture)
    for key, (value, kind, sub) in entries.items():
        if architecture != "llama" and key.startswith("llama."):
            key = architecture + key.removeprefix("llama")
        writer.add_key_value(key, value, kind, sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def ids_of(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


# --- tokens <-> text ------------------------------------------------------------------------------


def test_encode_and_decode_equal_transformers(tokenizer, reference):
    for text in TEXTS:
        for add in (True, False):
            ids = tokenizer.encode(text, add_special_tokens=add)
            assert ids == reference.encode(text, add_special_tokens=add), text
        assert all(isinstance(token, int) for token in ids)
        for skip in (False, True):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
        assert tokenizer.decode(ids) == text  # this byte-level vocabulary round-trips


def test_special_tokens(tokenizer, reference):
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == \
        (reference.bos_token_id, reference.eos_token_id, reference.pad_token_id)
    assert tokenizer.eos_token == reference.eos_token == "<|im_end|>"
    assert tokenizer.bos_token == reference.bos_token
    assert isinstance(tokenizer.eog_token_ids, frozenset)
    every = {token for token in range(tokenizer.vocab_size) if llama_cpp.llama_vocab_is_eog(tokenizer.vocab, token)}
    assert tokenizer.eog_token_ids == every and tokenizer.eos_token_id in every
    im_end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert im_end == [tokenizer.eos_token_id]
    # special tokens: rendered, or left out when skipping them
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tokenizer.token_bytes(tokenizer.eos_token_id) == b"<|im_end|>"
    assert tokenizer.decode(np.array(ids)) == tokenizer.decode(ids)  # NumPy ids, as the decoding protocol has
    assert tokenizer.token_bytes(tokenizer.eos_token_id, skip_special_tokens=True) == b""
    # no BOS on this vocabulary: raw completion is the text's tokens
    assert tokenizer.complete_ids("Once upon a time") == reference.encode("Once upon a time")


def test_streaming_multibyte_characters(tokenizer):
    split = 0
    for text in TEXTS:
        ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
        stream = ByteTextStream(tokenizer)
        pieces = []
        for token in ids:
            data = tokenizer.token_bytes(token, skip_special_tokens=True)
            piece = stream.add(token)
            pieces.append(piece)
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:  # a token ending or starting inside a character
                split += 1
        assert stream.flush() == ""
        assert "".join(pieces) == stream.text == tokenizer.decode(ids, skip_special_tokens=True)
        assert stream.tokens == ids
        assert "\ufffd" not in stream.text
    assert split > 0, "no token split a character: the texts do not test streaming"
    # an answer that stops inside a character: the stream holds its bytes back; flush gives U+FFFD as decode does
    ids = tokenizer.encode("ok 🎉👍🏽")
    cut = next(n for n in range(1, len(ids)) if not _is_utf8(b"".join(map(tokenizer.token_bytes, ids[:n]))))
    stream = ByteTextStream(tokenizer)
    stream.extend(ids[:cut])
    held = stream.text
    assert not held.endswith("\ufffd")
    assert stream.flush().startswith("\ufffd") and stream.text.startswith(held)
    assert stream.text == tokenizer.decode(ids[:cut], skip_special_tokens=True)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_concurrent_encode_and_decode(tokenizer):
    expected = [(tokenizer.encode(text), text) for text in TEXTS]
    fresh = GgufTokenizer(tokenizer.model, llama_cpp)  # empty piece caches: the threads fill them at once
    failures = []

    def work(seed: int):
        try:
            for _ in range(100):
                for ids, text in expected[seed % 3 :: 2]:
                    assert fresh.encode(text) == ids
                    assert fresh.decode(ids) == text
                    assert ByteTextStream(fresh).extend(ids) == fresh.decode(ids, skip_special_tokens=True)
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


# --- chat template --------------------------------------------------------------------------------


def test_chat_template_equals_transformers(tokenizer, reference):
    assert tokenizer.template_source == MODEL_TEMPLATE
    assert tokenizer.chat_template == reference.chat_template
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=prompt)
            assert ids == ids_of(reference.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True))
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
            assert text == reference.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
            assert text.endswith("<|im_start|>assistant\n") == prompt


def test_chatml_without_a_template(loaded, tokenizer, default_fields, tmp_path):
    path = write_gguf(tmp_path / "no-template.gguf", default_fields, **{"tokenizer.chat_template": None})
    assert not read_gguf_info(path).has_chat_template
    plain = GgufTokenizer(loaded(path, vocab_only=True), llama_cpp)
    assert plain.template_source == CHATML_SOURCE
    messages = CONVERSATIONS[1]
    text = plain.apply_chat_template(messages, tokenize=False)
    assert text == ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert plain.apply_chat_template(messages, add_generation_prompt=False, tokenize=False) == \
        text.removesuffix("<|im_start|>assistant\n")
    # SmolLM2's own template is ChatML once a system message is given: the same ids
    assert plain.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)
    assert plain.complete_ids("Once upon") == tokenizer.encode("Once upon")


def test_template_errors_are_one_line(loaded, default_fields, tmp_path):
    path = write_gguf(tmp_path / "gemma-like.gguf", default_fields, **{
        "tokenizer.chat_template": GEMMA_LIKE, "tokenizer.ggml.add_bos_token": True})
    gemma = GgufTokenizer(loaded(path, vocab_only=True), llama_cpp)
    with pytest.raises(ChatTemplateError) as refused:
        gemma.apply_chat_template(CONVERSATIONS[1])
    assert str(refused.value) == "the model's chat template refused the messages: System role not supported"
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    ids = gemma.apply_chat_template(CONVERSATIONS[0])  # no system message: rendered, the template's BOS first
    assert ids[0] == gemma.bos_token_id and ids.count(gemma.bos_token_id) == 1
    assert gemma.decode(ids).startswith("<|im_start|><start_of_turn>user\nHi 🎉<end_of_turn>\n")
    # this vocabulary adds BOS: raw completion starts with it
    assert gemma.adds_bos and gemma.complete_ids("Once") == [gemma.bos_token_id, *gemma.encode("Once", False)]

    broken = write_gguf(tmp_path / "broken.gguf", default_fields, **{
        "tokenizer.chat_template": "{% for message in messages %}{{ message['content'] }"})
    with pytest.raises(ChatTemplateError, match=r"^the model's chat template is not valid Jinja: .+ \(line 1\)$"):
        GgufTokenizer(loaded(broken, vocab_only=True), llama_cpp).apply_chat_template(CONVERSATIONS[0])
    failing = write_gguf(tmp_path / "failing.gguf", default_fields, **{"tokenizer.chat_template": (
        "{% if shout %}{{ messages[0]['content'] | upper }}{% else %}{{ messages[0]['content'] + 1 }}{% endif %}")})
    strict = GgufTokenizer(loaded(failing, vocab_only=True), llama_cpp)
    assert strict.apply_chat_template(CONVERSATIONS[0], tokenize=False, shout=True) == "HI 🎉"  # a template variable
    with pytest.raises(ChatTemplateError) as failed:
        strict.apply_chat_template(CONVERSATIONS[0])
    message = str(failed.value)
    assert message.startswith("the model's chat template failed on the messages: ") and "\n" not in message


# --- the GGUF header ------------------------------------------------------------------------------


def test_gguf_info_of_the_default_model(tokenizer, default_fields):
    path = default_model_file()
    info = read_gguf_info(path)
    model = tokenizer.model
    assert info.architecture == tokenizer.metadata("general.architecture") == "llama"
    assert info.name == tokenizer.metadata("general.name")
    assert info.file_size == path.stat().st_size
    assert info.context_length == llama_cpp.llama_model_n_ctx_train(model)
    assert info.block_count == llama_cpp.llama_model_n_layer(model)
    assert info.embedding_length == llama_cpp.llama_model_n_embd(model)
    assert info.head_count == llama_cpp.llama_model_n_head(model)
    assert info.head_count_kv == llama_cpp.llama_model_n_head_kv(model)
    assert info.key_length == info.value_length == info.embedding_length // info.head_count
    assert info.sliding_window is None and info.sampling == {}
    assert info.vocab_size == tokenizer.vocab_size
    assert info.has_chat_template
    assert info.tensor_count == default_fields[2]
    assert info.data_end == default_fields[1] == info.file_size  # the last tensor ends the file


def test_gguf_info_reads_per_layer_heads_and_sampling(default_fields, tmp_path):
    array, uint32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
    path = write_gguf(tmp_path / "layers.gguf", default_fields, extra=[
        ("llama.attention.head_count_kv", [3, 1] * 15, array, uint32),  # replaces the file's one count
        ("llama.attention.sliding_window", 4096, uint32, None),
        ("general.sampling.temp", 0.6, gguf.GGUFValueType.FLOAT32, None),
        ("general.sampling.top_k", 20, gguf.GGUFValueType.INT32, None),
    ])
    info = read_gguf_info(path)
    assert info.head_count_kv == (3, 1) * 15 and info.kv_heads(0) == 3 and info.kv_heads(1) == 1
    assert info.sliding_window == 4096
    assert info.sampling == {"temp": pytest.approx(0.6), "top_k": 20}
    assert info.tensor_count == 0 and info.vocab_size == 49152
    per_position = 15 * (3 + 1) * (64 + 64)  # layers of 3 and of 1 key/value heads, keys and values of 64
    assert kv_cache_bytes(info, 1000, "f16") == per_position * 1000 * 2


def test_kv_cache_and_memory_check(tokenizer):
    info = read_gguf_info(default_model_file())
    model = tokenizer.model
    heads_kv = llama_cpp.llama_model_n_head_kv(model)
    head_dim = llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model)
    layers = llama_cpp.llama_model_n_layer(model)
    per_position = layers * 2 * heads_kv * head_dim  # values: keys and values of every layer
    assert kv_cache_bytes(info, 8192, "f16") == per_position * 8192 * 2
    assert kv_cache_bytes(info, 8192) == per_position * 8192 * 34 // 32  # Q8_0: 34 bytes per 32 values
    needed = memory_needed(info, 8192)
    assert needed > info.file_size + kv_cache_bytes(info, 8192)
    check_memory(info, 8192, available_bytes=needed)  # fits: no error
    with pytest.raises(NotEnoughMemoryError) as short:
        check_memory(info, 8192, available_bytes=needed - 1)
    assert str(short.value) == (f"{info.path.name} needs about {needed / 2**30:.1f} GiB (the file and a 8192-token "
                                f"KV cache) but only {(needed - 1) / 2**30:.1f} GiB is free")
    assert available_memory() > 0
    check_memory(info, 2048)  # this machine runs the default model


def test_bad_files(loaded, default_fields, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n" * 10)
    with pytest.raises(GgufFileError, match=r"^notes\.gguf is not a GGUF file"):
        read_gguf_info(text)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GgufFileError, match=r"^empty\.gguf is not a GGUF file"):
        read_gguf_info(tmp_path / "empty.gguf")

    source = default_model_file()
    size = source.stat().st_size
    short = tmp_path / "short.gguf"
    with open(source, "rb") as original, open(short, "wb") as copy:
        shutil.copyfileobj(original, copy)
        copy.truncate(size - 1000)  # the last tensor's data is cut
    with pytest.raises(GgufFileError) as truncated:
        read_gguf_info(short)
    assert str(truncated.value) == (f"short.gguf is truncated: its tensor data ends at byte {size} but the file has "
                                    f"only {size - 1000} bytes; download it again")
    assert not load(short), "llama.cpp loaded a truncated file: the check would refuse a file it reads"
    with open(short, "r+b") as copy:
        copy.truncate(200_000)  # now the header is cut too
    with pytest.raises(GgufFileError, match=r"^short\.gguf is truncated: its header ends past the end of the file"):
        read_gguf_info(short)

    unknown = write_gguf(tmp_path / "alien.gguf", default_fields, architecture="alien-lm")
    with pytest.raises(GgufFileError) as alien:
        read_gguf_info(unknown)
    assert str(alien.value) == ("alien.gguf has architecture 'alien-lm', which this llama.cpp (llama-cpp-python "
                                "0.3.36) does not know")
    assert metadata.version("llama-cpp-python") == ARCHITECTURES_VERSION, \
        "llama-cpp-python changed: refresh LLAMA_CPP_ARCHITECTURES from its llama.cpp's src/llama-arch.cpp"
    assert not known_architecture("alien-lm") and known_architecture("llama") and known_architecture("gemma3")
    assert read_gguf_info(unknown, check_architecture=False).architecture == "alien-lm"
    assert not load(unknown, vocab_only=True), "llama.cpp loaded an architecture the list says it does not know"
    assert loaded(write_gguf(tmp_path / "known.gguf", default_fields), vocab_only=True)  # the same file, known name
    for message in (str(truncated.value), str(alien.value)):
        assert "\n" not in message


def test_imports_stay_light():
    code = ("import sys, ppd_core.backends.llamacpp.text, ppd_core.backends.llamacpp.info; "
            "heavy = sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules); "
            "print(json.dumps(heavy))")
    result = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert json.loads(result.stdout) == []
