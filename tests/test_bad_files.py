"""Issue 50, item 6: one bad file never breaks every start. A calibration profile of the wrong shape (``"latency_ms":
[]`` crashed `ppd chat` and `ppd serve` at every start until deleted) and a conversation file of valid JSON with wrong
types are set aside (``NAME.bad``) with one line; the rest goes on (the page's side: tests/test_page_conversations.py)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from app.commands.loading import load_engine
from app.cli import build_parser
from app.history import Conversation, ConversationStore
from ppd_core.calibration.calibrate import find_profile, profile_key
from ppd_core.calibration.profiles import DeviceProfile, ProfileError, profile_path, read_profile, save_profile
from test_quit import health, launch, quit_seconds, wait_for
from ports import free_port

THREADS = "1"  # the same thread count in the test and in the process: the profile's key holds it


def profile_for(engine) -> DeviceProfile:
    """A well-formed profile for ``engine``'s key, made of its static tree family (no calibration run)."""
    family = engine.plan.family
    n = engine.prompt_tokens.num_prompt_tokens
    ensemble = family.trees[-1].ensemble_size
    specs = [tree.spec for tree in family.trees]
    return DeviceProfile(key=profile_key(engine.loaded, engine.prompt_tokens), latency_ms={128: {1: 10.0, 8: 12.0}},
                         acceptance=[[0.5] * 4 for _ in range(n)], acceptance_positions=100, budget=8, trees=specs,
                         tree_sizes=[tree.num_tokens for tree in family.trees], expected_tokens_per_step=1.5,
                         expected_ms_per_step=11.0, expected_speedup=1.3, ensemble_size=ensemble)


@pytest.fixture(scope="module")
def engines():
    """The default model as `ppd serve` and `ppd chat` load it with ``--threads THREADS`` (their profiles' keys)."""
    loaded = {command: load_engine(build_parser().parse_args([command, "--threads", THREADS]), auto_calibrate=False)
              for command in ("serve", "chat")}
    yield loaded
    for engine in loaded.values():
        engine.close()


WRONG = [("latency_ms", []), ("latency_ms", {"128": []}), ("latency_ms", {"128": {"1": "fast"}}),
         ("latency_ms", {"128": {"4": 3.0}}), ("acceptance", 5), ("acceptance", [["x"]]), ("budget", "8"),
         ("trees", {}), ("tree_sizes", None), ("expected_speedup", "1.2x"), ("lookup_lengths", "abc"),
         ("step_policy", []), ("step_policy", {"kind": "fixed", "rows": 4, "fixed_ms": {}}),
         ("step_policy", {"kind": "fast"}), ("expected_with_lookup_by_turn", []), ("created", 5), ("budgets", [1]),
         ("expected_ms_per_step", True)]


def test_a_profile_of_any_wrong_shape_is_one_error(engines, tmp_path):
    engine = engines["serve"]
    good = profile_for(engine)
    path = save_profile(good, tmp_path)
    assert read_profile(path) == good  # the well-formed one reads back as it was
    for field, value in WRONG:
        path.write_text(json.dumps({**good.to_json(), field: value}))
        with pytest.raises(ProfileError, match="malformed") as error:
            read_profile(path)
        assert len(str(error.value).splitlines()) == 1, (field, value)


def test_a_wrong_profile_is_set_aside_with_one_line(engines, monkeypatch, tmp_path, caplog):
    engine = engines["serve"]
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path)
    path = profile_path(profile_key(engine.loaded, engine.prompt_tokens))
    path.write_text(json.dumps({**profile_for(engine).to_json(), "latency_ms": []}))
    with caplog.at_level(logging.WARNING):
        assert find_profile(engine.loaded, engine.prompt_tokens) is None
    lines = [r.getMessage() for r in caplog.records if "ignoring the saved calibration" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0].splitlines()) == 1 and "moved to" in lines[0]
    assert not path.exists() and path.with_name(path.name + ".bad").exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert find_profile(engine.loaded, engine.prompt_tokens) is None  # nothing there now: nothing said
    assert not caplog.records


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_ppd_starts_with_a_profile_of_the_wrong_shape_and_sets_it_aside(engines, tmp_path, command):
    """Before: ``AttributeError: 'list' object has no attribute 'items'`` and no server, at every start."""
    engine = engines[command]
    folder = tmp_path / "data" / "ppd" / "profiles"
    path = profile_path(profile_key(engine.loaded, engine.prompt_tokens), folder)
    folder.mkdir(parents=True)
    path.write_text(json.dumps({**profile_for(engine).to_json(), "latency_ms": []}))
    port = free_port()
    process, _ = launch(command, tmp_path, port, "--threads", THREADS)
    try:
        wait_for(lambda: (response := health(port)) is not None and response.status_code == 200, 120,
                 "the model did not load", process)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert answer.status_code == 200
        if command == "chat":
            assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200
        assert not path.exists() and path.with_name(path.name + ".bad").exists()
        time.sleep(0.5)
        seconds, output = quit_seconds(process)
    finally:
        process.kill()
    lines = [line for line in output.splitlines() if "ignoring the saved calibration" in line]
    assert len(lines) == 1 and "moved to" in lines[0], output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_conversation_files_of_the_wrong_shape_are_set_aside_and_the_others_listed(tmp_path, caplog):
    store = ConversationStore(tmp_path / "c")
    good = Conversation(messages=[{"role": "user", "content": "Fine"}, {"role": "assistant", "content": "Yes"}])
    store.save(good)
    base = {"id": "x", "messages": [{"role": "user", "content": "hi"}], "system_prompt": "", "created": 1.0,
            "updated": 2.0, "revision": 1}
    bad = {"updated-text": {"updated": "yesterday"}, "no-role": {"messages": [{"content": "hi"}]},
           "content-five": {"messages": [{"role": "user", "content": 5}]}, "messages-text": {"messages": "hi"},
           "a-list": None, "revision-true": {"revision": True}, "bad-id": {"id": "../x"}, "name-five": {"name": 5},
           "not-json": "text"}
    for name, change in bad.items():
        text = "{oops" if change == "text" else json.dumps([1] if change is None else {**base, "id": name, **change})
        (store.folder / f"{name}.json").write_text(text)
    with caplog.at_level(logging.WARNING, logger="app.history"):
        assert [c.id for c in store.list()] == [good.id]
    for name in bad:
        assert not (store.folder / f"{name}.json").exists() and (store.folder / f"{name}.json.bad").exists(), name
    assert len([r for r in caplog.records if "set aside" in r.getMessage()]) == len(bad)
    assert len(store.notices()) == len(bad) and store.notices() == []  # said once on the page
    with pytest.raises(OSError):
        store.load("updated-text")  # gone from the list and from loading: no second line
    assert Path(store.folder / "updated-text.json.bad").exists()
