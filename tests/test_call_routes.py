"""Issue 44's routes, traced while they run (``call_routes``): a GGUF path's route from the command line to a loaded
model passes through no module twice (and resolves ``--model`` once), and following ``generate``'s calls bounces
back between modules at most twice."""

from __future__ import annotations

import pytest

from app import cli
from call_routes import bounces, modules_on, project_module, traced_routes
from ppd_core import Engine, EngineConfig, json_grammar
from ppd_core import hub, loading
from ppd_core.loading import default_model_file
from ppd_core.sampling.params import SamplingParams

MAX_GENERATE_BOUNCES = 2


def test_bounces_are_revisits_on_one_stack():
    assert bounces(["a", "b", "c"]) == []
    assert bounces(["a", "b", "a", "c"]) == [("a", "b", "a")]


def test_a_gguf_reaches_its_loaded_model_through_each_module_once(monkeypatch, capsys):
    calls = {"resolve_source": 0, "hub.parse": 0}
    for module, name, key in ((loading, "resolve_source", "resolve_source"), (hub, "parse", "hub.parse")):
        real = getattr(module, name)

        def counted(*args, real=real, key=key, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    path = str(default_model_file())
    found = traced_routes(
        lambda: cli.main(["generate", "--model", path, "--max-new-tokens", "2", "--threads", "1", "--tree", "auto",
                          "Hi"]),
        within=lambda route: "ppd_core.engine_load" in route,  # the load sequence and the command above it
    )
    assert "[ppd]" in capsys.readouterr().err  # it loaded and answered
    assert found == set(), "the route from `ppd generate` to a loaded model passes a module twice: " + str(found)
    assert calls["resolve_source"] == 1 and calls["hub.parse"] <= 1, calls


@pytest.fixture(scope="module")
def engine():
    loaded = Engine.load(EngineConfig(model="default", threads=1, auto_calibrate=False, tree="medium", lookup=4))
    yield loaded
    loaded.close()


def test_following_generate_bounces_between_modules_at_most_twice(engine):
    """Every way a step runs: prompt-token trees with copied chains, greedy and sampled with penalties, under a JSON
    grammar (its drafter too) and without, PPD and plain."""
    import sys

    seen: set[tuple] = set()

    def profile(frame, event, arg):
        if event == "call" and project_module(frame):
            route = modules_on(frame)
            if "ppd_core.decoding" in route:
                seen.update(bounces(route[route.index("ppd_core.decoding"):]))

    ids = engine.chat_ids([{"role": "user", "content": "Repeat: one two three one two three one two three"}])
    sys.setprofile(profile)
    try:
        for grammar in (None, json_grammar()):
            for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=1, repeat_penalty=1.1)):
                for mode in ("ppd", "plain"):
                    list(engine.stream(ids, mode, max_new_tokens=16, sampling=sampling, grammar=grammar, logprobs=2))
    finally:
        sys.setprofile(None)
    assert len(seen) <= MAX_GENERATE_BOUNCES, "generate's calls bounce back: " + "; ".join(" -> ".join(b) for b in seen)
