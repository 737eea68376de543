"""`ppd quantize` and the perplexity it reports: llama.cpp's quantizer on tiny GGUF files, perplexity against a
token-by-token brute force, and every refusal as one line that writes nothing."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
import pytest

from app.cli import main
from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder
from ppd_core.backends.llamacpp.text import GgufTokenizer
from ppd_core.backends.llamacpp.perplexity import SHIPPED_TEXT, perplexity
from ppd_core.backends.llamacpp.quantize import read_source
from tiny_gguf import tiny_models  # noqa: F401 - the fixture

TEXT = SHIPPED_TEXT.read_text(encoding="utf-8")[:1500]


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_shipped_text_is_chapters_one_and_two():
    text = SHIPPED_TEXT.read_text(encoding="utf-8")
    assert text.startswith("CHAPTER I. Down the Rabbit-Hole") and "CHAPTER II. The Pool of Tears" in text
    assert "CHAPTER III" not in text and len(text) > 20_000


def test_perplexity_equals_a_token_by_token_brute_force(tiny_models):  # noqa: F811
    path = tiny_models.get("llama", "F16")
    measured = perplexity(path, TEXT, threads=2, context=32)
    decoder = LlamaCppDecoder(path, threads=2)
    try:
        tokens = GgufTokenizer(decoder.model, decoder.llama).encode(TEXT)
        bos = decoder.llama.llama_vocab_bos(decoder.vocab)
        total, scored = 0.0, 0
        for chunk in range(len(tokens) // 32):
            ids = tokens[chunk * 32 : (chunk + 1) * 32]
            ids[0] = bos
            for row in range(16, 31):  # the second half's rows, each predicting the next token
                logits = decoder.prefill(decoder.new_cache(), ids[: row + 1]).rows(slice(0, 1))[0].astype(np.float64)
                total += math.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[ids[row + 1]]
                scored += 1
        decoder_tokens = scored
    finally:
        decoder.close()
    assert (measured.scored_tokens, measured.chunks) == (decoder_tokens, len(tokens) // 32)
    # mean negative log-likelihoods (a random tiny model's perplexity is ~1e15): F16 rows batched round otherwise
    assert math.log(measured.value) == pytest.approx(total / scored, rel=2e-4)


def test_quantize_writes_the_type_and_reports_both_perplexities(capsys, tiny_models, tmp_path):  # noqa: F811
    source = tiny_models.get("llama", "F16")
    out = tmp_path / "tiny.Q4_0.gguf"
    code, stdout, stderr = run_cli(capsys, "quantize", source, "--to", "q4_0", "--out", out, "--threads", "2")
    assert code == 0, stderr
    assert read_source(out)[0] == "Q4_0" and read_source(out)[1] == read_source(source)[1]
    assert f"-> {out} (Q4_0, about" in stdout and f"wrote {out}" in stdout
    line = next(line for line in stdout.splitlines() if line.startswith("perplexity on alice-chapters-1-2.txt"))
    before, after = perplexity(source, SHIPPED_TEXT.read_text(), 2), perplexity(out, SHIPPED_TEXT.read_text(), 2)
    assert f"F16 {before.value:.3f}, Q4_0 {after.value:.3f}" in line and "warning" not in stderr
    # a 4-bit source: allowed, with a warning; --force replaces an existing output
    again = tmp_path / "again.gguf"
    again.write_text("old")
    code, stdout, stderr = run_cli(capsys, "quantize", out, "--to", "Q8_0", "--out", again, "--force", "--no-perplexity")
    assert code == 0 and read_source(again)[0] == "Q8_0" and "perplexity" not in stdout
    assert "ppd: warning: tiny.Q4_0.gguf is already Q4_0" in stderr
    assert not list(tmp_path.glob("*.partial"))


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("args, line", [
    (["--to", "Q9"], "unknown type 'Q9'; choose one of F32, F16, BF16"),
    (["--to", "IQ2_XS"], "IQ2_XS needs an importance matrix, which ppd does not make"),
    (["--to", "Q4_0", "--out", "{exists}"], "{exists} exists: choose another name, or --force to replace it"),
    (["--to", "Q4_0", "--out", "{source}", "--force"], "the output would replace the source: choose another name"),
    (["--to", "Q4_0", "--out", "{tmp}/no/such/folder/x.gguf"], "{tmp}/no/such/folder is not a folder"),
    (["--to", "F32", "--out", "{tmp}/big.gguf", "--small-disk"], "{tmp} has 0.00 GiB free; the F32 file needs about"),
])
def test_bad_input_is_one_line_and_writes_nothing(capsys, tiny_models, tmp_path, monkeypatch, args, line):  # noqa: F811
    source = tiny_models.get("llama", "F16")
    exists = tmp_path / "exists.gguf"
    exists.write_text("keep me")
    names = {"exists": exists, "source": source, "tmp": tmp_path}
    if "--small-disk" in args:
        args = [a for a in args if a != "--small-disk"]
        monkeypatch.setattr("shutil.disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    before = sorted(tmp_path.rglob("*"))
    code, stdout, stderr = run_cli(capsys, "quantize", source, *[a.format(**names) for a in args])
    assert code == 2 and stdout == "" and stderr.startswith(f"ppd: error: {line.format(**names)}")
    assert len(stderr.splitlines()) == 1 and sorted(tmp_path.rglob("*")) == before and exists.read_text() == "keep me"


def test_calibrate_times_flatter_types_for_a_wide_file_only(capsys, tiny_models, monkeypatch, tmp_path):  # noqa: F811
    """An F16 file (with no prompt tokens: lookup alone) calibrates, then its curve and Q4_0's, IQ4_NL's and
    Q4_K_M's, made in a temporary folder that is gone afterwards; a Q4_0 file gets no such lines."""
    import re
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the candidates are made
    source = tiny_models.get("llama", "F16")
    code, stdout, stderr = run_cli(capsys, "calibrate", "--model", source, "--threads", "1")
    assert code == 0, stderr
    lines = stdout[stdout.index("step ms after 256 cached tokens, 1 / 2 / 4 / 8 / 16 rows"):].splitlines()[1:]
    number = r"\d+\.\d"
    for line, name in zip(lines, ("F16 \\(this file\\)", "Q4_0", "IQ4_NL", "Q4_K_M")):
        assert re.fullmatch(rf"  {name}: ({number} / ){{4}}{number}; 16 rows cost {number}x one; plain {number} tokens/s.*", line), line
    assert len(lines) == 4 and "`ppd quantize tiny-llama-F16.gguf --to Q4_0` makes it" in lines[1]
    assert not list(tmp_path.iterdir())
    code, stdout, stderr = run_cli(capsys, "calibrate", "--model", tiny_models.get("llama", "Q4_0"), "--threads", "1")
    assert code == 0 and "step ms after" not in stdout
