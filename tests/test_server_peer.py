"""`ppd bench --compare-llama-server`: the server's command line and requests, and its bad input.

The comparison itself runs a real llama-server (built from llama-cpp-python's vendored llama.cpp by
benchmarks/scripts/llama_server_bench.py --build-only, minutes on this CPU: not in the suite); its figures are in
benchmarks/measurements/ with their commands.
"""

import stat

import pytest

from app.server_peer import SPEC_TYPES, executable, server_command, server_request
from ppd_core.errors import PpdError
from ppd_core.sampling.params import GREEDY, SamplingParams
from test_cli_errors import assert_error, no_model_load  # noqa: F401 - a fixture

HELP = "-fa, --flash-attn [on|off|auto]\n--no-webui\n--cache-ram N\n--spec-type [none|ngram-simple|ngram-mod]\n"


def test_the_command_matches_ppds_backend_and_names_the_drafts(tmp_path, monkeypatch):
    monkeypatch.setattr("app.server_peer.has_amx", lambda: False)
    binary, gguf = tmp_path / "llama-server", tmp_path / "m.gguf"
    for spec, drafts in (("plain", []), ("ngram-simple", ["--spec-type", "ngram-simple"]), ("ngram-mod", ["--spec-type", "ngram-mod"])):
        command = server_command(binary, gguf, 2, spec, 8080, HELP)
        assert command == [str(binary), "-m", str(gguf), "-t", "2", "-tb", "2", "-fa", "on", "-ctk", "q8_0", "-ctv",
                           "q8_0", "-c", "4096", "-np", "1", "--no-webui", "--cache-ram", "0", "--slot-save-path",
                           command[command.index("--slot-save-path") + 1], "--host", "127.0.0.1", "--port", "8080", *drafts]
    older = "-fa, --flash-attn\n--no-repack\n"  # a build of before the on|off switch, the RAM cache and ngram-mod
    monkeypatch.setattr("app.server_peer.has_amx", lambda: True)
    command = server_command(binary, gguf, 1, "plain", 1, older)
    assert "-fa" in command and "on" not in command and "--no-repack" in command and "--cache-ram" not in command
    with pytest.raises(PpdError, match=r"^--compare-llama-server: .* has no --spec-type"):
        server_command(binary, gguf, 1, "ngram-mod", 1, older)
    with pytest.raises(PpdError, match="unknown llama-server decoding 'eagle'"):
        server_command(binary, gguf, 1, "eagle", 1, HELP)
    assert set(SPEC_TYPES) == {"plain", "ngram-simple", "ngram-mod"}


def test_requests_are_greedy_and_carry_the_benchs_penalties():
    plain = server_request([{"role": "user", "content": "Hi"}], 96, GREEDY)
    assert (plain["samplers"], plain["top_k"], plain["repeat_penalty"], plain["cache_prompt"]) == (["top_k"], 1, 1.0, True)
    penalised = server_request([], 8, SamplingParams(repeat_penalty=1.1, repeat_last_n=64, presence_penalty=0.5))
    assert penalised["samplers"] == ["penalties", "top_k"]
    assert (penalised["repeat_penalty"], penalised["repeat_last_n"], penalised["presence_penalty"]) == (1.1, 64, 0.5)
    assert server_request([], 8, SamplingParams(min_p=0.1))["min_p"] == 0.1  # every field by llama-server's name


def test_a_binary_that_is_not_one_is_one_line_before_the_model_loads(capsys, tmp_path, no_model_load):  # noqa: F811
    text = tmp_path / "notes.txt"
    text.write_text("not a program")
    for binary in (tmp_path / "missing", text, tmp_path):
        assert_error(capsys, f"--compare-llama-server: {binary} is not an executable file",
                     "bench", "--compare-llama-server", binary)
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert executable(script) == script
