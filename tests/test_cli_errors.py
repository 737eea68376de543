"""Errors a user hits on the command line: one `ppd: error: ...` line and exit code 2, before any model loads.

Anything that is not the project's PpdError is a bug and keeps its traceback.
"""

import json
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from app.cli import build_parser, main
from app.commands.options import model_threads
from app.questions import DEFAULT_QUESTIONS
from ppd_core.errors import PpdError
from ports import free_port


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a command gets as far as loading a model."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("ppd_core.engine_load.load_model", refuse)  # what Engine.load calls
    monkeypatch.setattr("ppd_core.loading.load_model", refuse)  # the function itself (what `ppd train` calls)
    monkeypatch.delenv("PPD_AUTH", raising=False)


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_error(capsys, line, *args):
    code, out, err = run_cli(capsys, *args)
    assert (code, out, err) == (2, "", f"ppd: error: {line}\n")


@pytest.fixture
def fake_chat_app(monkeypatch):
    """Stand-ins for the model, the page and the server: records what the server is built with and where it serves."""
    launched = {}

    def close():
        assert launched["served until Ctrl+C"]
        launched["model freed on quit"] = True

    # nothing to calibrate beside the answers
    calibrated = types.SimpleNamespace(plan=types.SimpleNamespace(awaiting_calibration=False), close=close)

    def server_app(service, policy, *, page=None, auth=None, api_key=None, serve_api=True):
        launched.update(page=page, auth=auth, guarded=policy.bound)
        return "app"

    class Serving:
        def __init__(self, app, host, port):
            launched.update(server_name=host, server_port=port)

        def run(self, service, load, ready):
            assert not service.ready  # listening first, the model after
            service.attach(service.startup.run(load))
            ready()
            launched["served until Ctrl+C"] = True
            service.shutdown(1.0)

    monkeypatch.setattr("app.commands.chat.load_engine", lambda args, **_: calibrated)
    page = types.SimpleNamespace(build_app=lambda service, api="": "the page", api_line=lambda key=False: "API: /v1")
    monkeypatch.setitem(sys.modules, "app.ui", page)
    monkeypatch.setattr("app.server.server_app", server_app)
    monkeypatch.setattr("app.server.Serving", Serving)
    monkeypatch.delenv("PPD_AUTH", raising=False)
    return launched


# --- ppd chat: port, host and login -------------------------------------------------------------


def test_port_in_use(capsys, no_model_load):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_error(capsys, f"port {port} on 127.0.0.1 is already in use; pick another with --port", "chat", "--port", port)


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_max_queue_below_zero(capsys, no_model_load, command):
    assert_error(capsys, "--max-queue must be 0 or more, got -1", command, "--max-queue", -1)


def test_port_out_of_range(capsys, no_model_load):
    assert_error(capsys, "--port must be between 1 and 65535, got 70000", "chat", "--port", 70000)


def test_non_loopback_host_needs_a_login_choice(capsys, no_model_load):
    assert_error(
        capsys,
        "--host 0.0.0.0 serves beyond this machine: add --auth USER:PASS (or set PPD_AUTH), or --no-auth to serve it without a login",
        "chat", "--host", "0.0.0.0", "--port", free_port(),
    )


@pytest.mark.parametrize("value", ["alice", ":secret", "alice:", ":"])
def test_bad_auth_format(capsys, no_model_load, value):
    assert_error(capsys, "--auth must be USER:PASS with a non-empty user and password", "chat", "--auth", value)


def test_bad_auth_in_the_environment(capsys, no_model_load, monkeypatch):
    monkeypatch.setenv("PPD_AUTH", "no-colon")
    assert_error(capsys, "--auth must be USER:PASS with a non-empty user and password", "chat", "--host", "0.0.0.0")


def test_unresolvable_host(capsys, no_model_load):
    assert_error(capsys, "--host no-such-host.invalid is not an address or a name this machine can resolve",
                 "chat", "--host", "no-such-host.invalid")


def test_auth_and_no_auth_exclude_each_other(capsys, no_model_load):
    with pytest.raises(SystemExit) as exit_info:
        main(["chat", "--auth", "a:b", "--no-auth"])
    assert exit_info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_auth_is_passed_to_the_server(capsys, fake_chat_app):
    port = free_port()
    code, _, err = run_cli(capsys, "chat", "--host", "0.0.0.0", "--port", port, "--auth", "alice:pa:ss")
    assert code == 0 and "warning" not in err
    assert fake_chat_app == {"server_name": "0.0.0.0", "server_port": port, "auth": ("alice", "pa:ss"),
                             "page": "the page", "guarded": "0.0.0.0", "served until Ctrl+C": True,
                             "model freed on quit": True}


def test_auth_from_the_environment(capsys, fake_chat_app, monkeypatch):
    monkeypatch.setenv("PPD_AUTH", "bob:hunter2")
    assert run_cli(capsys, "chat", "--host", "0.0.0.0", "--port", free_port())[0] == 0
    assert fake_chat_app["auth"] == ("bob", "hunter2")


def test_no_auth_warns_in_one_line(capsys, fake_chat_app):
    code, out, err = run_cli(capsys, "chat", "--host", "0.0.0.0", "--port", free_port(), "--no-auth")
    lines = err.splitlines()
    assert code == 0 and fake_chat_app["auth"] is None
    assert lines[0] == ("ppd: warning: serving on 0.0.0.0 without a login (--no-auth): anyone who can reach it "
                        "can read the saved conversations and recalibrate")


def test_loopback_default_needs_no_login(capsys, fake_chat_app):
    port = free_port()
    code, _, err = run_cli(capsys, "chat", "--port", port)
    assert code == 0 and "warning" not in err
    assert fake_chat_app["server_name"] == "127.0.0.1" and fake_chat_app["server_port"] == port
    assert fake_chat_app["auth"] is None


# --- ppd bench: question files ------------------------------------------------------------------


def test_bench_missing_question_file(capsys, no_model_load, tmp_path):
    missing = tmp_path / "nope.jsonl"
    assert_error(capsys, f"question file not found: {missing}", "bench", "--questions", missing)


@pytest.mark.parametrize("line", ["not json", json.dumps({"question": "hi"}), json.dumps({"turns": "hi"}), json.dumps({"turns": []})])
def test_bench_malformed_question_file(capsys, no_model_load, tmp_path, line):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"turns": ["fine"]}) + "\n\n" + line + "\n")
    assert_error(capsys, f"{path}:3 is not a JSON object with a 'turns' list", "bench", "--questions", path)


def test_bench_empty_question_file(capsys, no_model_load, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n")
    assert_error(capsys, f"{path} holds no questions (expected one JSON object with a 'turns' list per line)",
                 "bench", "--questions", path)


def test_bench_unknown_category(capsys, no_model_load):
    assert_error(capsys, "no question of category 'cooking'; the file has coding, extraction, humanities, math, "
                 "reasoning, roleplay, stem, writing", "bench", "--category", "cooking")


def test_bench_bad_numbers(capsys, no_model_load):
    assert_error(capsys, "--limit must be at least 1", "bench", "--limit", 0)
    assert_error(capsys, "--max-new-tokens must be at least 1", "bench", "--max-new-tokens", 0)
    assert_error(capsys, "top-k must be 0 (off) or positive, got -1", "bench", "--top-k", -1)


def test_shipped_questions_are_inside_the_package():
    import app

    assert DEFAULT_QUESTIONS.is_file() and DEFAULT_QUESTIONS.parent.parent == __import__("pathlib").Path(app.__file__).parent
    from app.questions import read_questions

    assert len(read_questions(DEFAULT_QUESTIONS, None)) == 80 and len(read_questions(DEFAULT_QUESTIONS, 2)) == 2


def test_bench_default_questions_from_any_directory(capsys, tmp_path, tiny_model_dir, monkeypatch):
    """`ppd bench --limit 2` in a folder far from the repo (its working directory), on the tiny model; its JSON is
    written whole."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "bench", "--limit", 2, "--max-new-tokens", 6, "--model", tiny_model_dir,
                           "--tree", "medium", "--json", "out/b.json")
    assert code == 0, err
    result = json.loads((tmp_path / "out" / "b.json").read_text())
    assert result["questions"] == 2 and result["identical"] is True
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["b.json"]  # no temp file left behind


# --- ppd train: user files fail before the model loads ------------------------------------------


def test_train_missing_eval_questions(capsys, no_model_load, tmp_path):
    missing = tmp_path / "eval.jsonl"
    assert_error(capsys, f"question file not found: {missing}", "train", "--eval-questions", missing)


def test_train_missing_data(capsys, no_model_load, tmp_path):
    missing = tmp_path / "chats.jsonl"
    assert_error(capsys, f"conversation file not found: {missing}", "train", "--data", missing)


def test_train_missing_init(capsys, no_model_load, tmp_path):
    missing = tmp_path / "init.safetensors"
    assert_error(capsys, f"prompt-token file not found: {missing}", "train", "--init", missing)


def test_train_init_into_an_ensemble_it_cannot_become(capsys, no_model_load):
    """The shipped 2-member ensemble can be distilled into 1 member, not regrown into 3: one line before any model loads."""
    ensemble = Path(__file__).resolve().parents[1] / "assets" / "smollm2-135m-instruct.prompt-tokens-ensemble2.safetensors"
    assert_error(capsys, "can shrink an ensemble to 1 member or grow 1 member into several, not 2 into 3", "train",
                 "--init", ensemble, "--ensemble", 3)


def test_train_data_without_conversations(capsys, tmp_path, tiny_model_dir):
    """Checked where the data is read (after the model loads: the tiny one here)."""
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"text": "no messages here"}) + "\n")
    assert_error(capsys, f"{data} holds no conversations (expected ShareGPT 'conversations' or chat 'messages')",
                 "train", "--model", tiny_model_dir, "--data", data, "--work-dir", tmp_path / "work", "--eval-limit", 0)
    data.write_text("{not json\n")
    code, out, err = run_cli(capsys, "train", "--model", tiny_model_dir, "--data", data, "--work-dir", tmp_path / "work")
    assert code == 2 and err.startswith(f"ppd: error: {data}: ") and err.count("\n") == 1


def test_train_bad_numbers(capsys, no_model_load):
    assert_error(capsys, "--samples must be positive, got 0", "train", "--samples", 0)
    assert_error(capsys, "--eval-limit must be 0 (no evaluation) or positive, got -1", "train", "--eval-limit", -1)
    assert_error(capsys, "--curriculum must be a fraction of the steps, at least 0 and below 1, got 1.0", "train",
                 "--curriculum", 1)
    assert_error(capsys, "--acceptance-prompts must be between 0 (skip) and 40, got 41", "train", "--acceptance-prompts", 41)


# --- ppd generate -------------------------------------------------------------------------------


def test_generate_bad_input(capsys, no_model_load):
    assert_error(capsys, "the message is empty", "generate", "   ")
    assert_error(capsys, "--max-new-tokens must be at least 1", "generate", "hi", "--max-new-tokens", 0)
    assert_error(capsys, "temperature must be 0 (greedy) or between 0.001 and 2, got -1.0", "generate", "hi", "--temperature", -1)
    assert_error(capsys, "repeat-penalty must be between 0.001 and 100 (1: off), got 0.0", "generate", "hi", "--repeat-penalty", 0)
    assert_error(capsys, "repeat-last-n must be -1 (the whole context), 0 (off) or positive, got -2", "bench",
                 "--repeat-last-n", -2)
    assert_error(capsys, "presence-penalty must be between -2 and 2, got 3.0", "generate", "hi", "--presence-penalty", 3)
    assert_error(capsys, "min-p must be between 0 (off) and 1, got 1.5", "generate", "hi", "--min-p", 1.5)
    assert_error(capsys, "frequency-penalty must be between -2 and 2, got -2.5", "bench", "--frequency-penalty", -2.5)
    assert_error(capsys, "unknown tree 'huge'; use auto, small, medium, large or a token budget such as 12",
                 "generate", "hi", "--tree", "huge")
    assert_error(capsys, "--threads must be at least 1, got 0", "generate", "hi", "--threads", 0)


def test_generate_modes(capsys):
    """``--mode`` takes ppd and plain; "vanilla", plain decoding's name in the README before, is read as plain; any
    other word is refused, naming the two."""
    parser = build_parser()
    assert [parser.parse_args(["generate", "hi", "--mode", mode]).mode for mode in ("ppd", "plain", "vanilla")] == [
        "ppd", "plain", "plain"]
    assert parser.parse_args(["generate", "hi"]).mode == "ppd"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "hi", "--mode", "fast"])
    assert "invalid choice: 'fast' (choose from 'ppd', 'plain')" in capsys.readouterr().err


def test_chat_leaves_a_core_to_the_browser(monkeypatch, tmp_path):
    monkeypatch.setattr("ppd_core.cpu_cores.CGROUP", tmp_path)  # no CPU quota
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)  # the cores it may use
    monkeypatch.setattr("os.cpu_count", lambda: 8)  # where there is no sched_getaffinity
    assert model_threads(types.SimpleNamespace(command="chat", threads=None)) == 7
    assert model_threads(types.SimpleNamespace(command="calibrate", threads=None)) == 7  # the profile the chat uses
    assert model_threads(types.SimpleNamespace(command="generate", threads=None)) == 0  # one per core
    assert model_threads(types.SimpleNamespace(command="chat", threads=3)) == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert model_threads(types.SimpleNamespace(command="chat", threads=None)) == 1


# --- what main() catches ------------------------------------------------------------------------


def test_error_types_are_ppd_errors_and_value_errors():
    from ppd_core.calibration.profiles import ProfileError
    from ppd_core.answer_request import PromptTooLongError
    from ppd_core.loading import ModelLoadError
    from ppd_core.drafters.prompt_tokens import PromptTokenError

    for error in (ModelLoadError, PromptTokenError, PromptTooLongError, ProfileError):
        assert issubclass(error, PpdError) and issubclass(error, ValueError)
    assert issubclass(ModelLoadError, RuntimeError)  # as before


@pytest.mark.parametrize("bug", [KeyError("bug"), ValueError("an internal ValueError"), FileNotFoundError("internal")])
def test_internal_errors_keep_their_traceback(monkeypatch, bug):
    def broken(args, auto_calibrate=True):
        raise bug

    monkeypatch.setattr("app.commands.generate.load_engine", broken)
    with pytest.raises(type(bug)):
        main(["generate", "hi"])


def test_interrupt_exits_130(capsys, monkeypatch):
    def interrupted(args, auto_calibrate=True):
        raise KeyboardInterrupt

    monkeypatch.setattr("app.commands.generate.load_engine", interrupted)
    assert run_cli(capsys, "generate", "hi") == (130, "", "ppd: interrupted\n")


@pytest.mark.parametrize("value", ["x", "-1", "65"])
def test_bad_lookup_length(capsys, no_model_load, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hi", "--lookup", value])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ppd generate: error: argument --lookup: expected auto, fixed, 0 (off) or a number of tokens up to 64, got '{value}'")


def test_help_and_argument_errors_import_neither_torch_nor_model_code():
    """`ppd --help` and bad arguments answer before any heavy import (a fresh interpreter, so nothing is loaded yet)."""
    code = """
import sys
from app.cli import main
for argv in (["--help"], ["chat", "--help"], ["generate", "hi", "--temperature", "-1"], ["chat", "--port", "70000"],
             ["generate", "hi", "--quant", "nope"], ["serve", "--max-queue", "-1"], ["bench", "--threads", "0"]):
    try:
        code = main(argv)
    except SystemExit as exit:
        code = exit.code
    assert code != 1, argv
heavy = sorted(name for name in ("torch", "transformers", "gradio", "llama_cpp", "numpy") if name in sys.modules)
print("heavy:", heavy)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("heavy: []"), done.stdout[-500:]
    assert "temperature must be 0 (greedy) or between 0.001 and 2, got -1.0" in done.stderr and "--max-queue must be 0 or more" in done.stderr


@pytest.mark.parametrize("key", ["clé-secrète", "two words", " "])
def test_an_api_key_clients_cannot_send_is_refused_at_start(capsys, no_model_load, key):
    """A key with characters outside printable ASCII could never be sent in an Authorization header."""
    assert_error(capsys, "--api-key must be a non-empty key of printable ASCII characters without spaces (clients "
                 "cannot send others in a header)", "serve", "--api-key", key, "--port", free_port())
