"""Issue 50, page items 3 and 7: a calibration's progress is one count over all its phases (it jumped from "timing trees
12/19" to "13/13", stuck there 46 s while the fixed shapes were timed unsaid, then "choosing the tree 0/1" for 16 s),
with the time left; and the calibration has a pause point in every phase (where a first launch's calibration lends the
model to an answer), the tree search included (it had none: an answer waited behind it)."""

import pytest

from app.calibration_progress import CalibrationProgress
from ppd_core import Engine, EngineConfig
from ppd_core.calibration.count import TREE_SEARCH_ITEMS, CalibrationCount, Pace, plan
from ppd_core.engine_calibration import calibrate_engine


def test_one_count_moves_forward_through_the_phases_even_where_a_phase_skips_the_rest():
    told = []
    count = CalibrationCount(lambda phase, done, total: told.append((phase, done, total)), plan(4, False, 19, 8))
    for done in range(5):
        count("lookup", done, 4)
    for done in range(1, 13):
        count("latency", done, 19)
    count("latency", 13, 13)  # the larger trees cannot win: not timed
    for done in (1, 2, 3):
        count("fixed", done, 8)
    count("fixed", 8, 8)  # the larger shapes cannot win either
    pace = Pace("tree search", count)
    for part in (pace.part(0, 0.6), pace.part(0.6, 1)):
        for done in range(100):
            part.tick(done, 100)
    count("tree search", 1, 1)
    totals = {total for _, _, total in told}
    assert totals == {4 + 19 + 8 + TREE_SEARCH_ITEMS}  # one count, planned before the first item
    done = [done for _, done, _ in told]
    assert done == sorted(done) and done[-1] == told[-1][2]  # never back, and to the end
    assert [phase for phase, _, _ in told if phase == "fixed"]  # the fixed shapes are counted (they were unsaid)
    search = [done for phase, done, _ in told if phase == "tree search"]
    assert len(set(search)) > 2  # the tree search moves the count (it sat at 0/1)


def test_the_line_tells_the_count_and_the_time_left(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("app.calibration_progress.time.monotonic", lambda: clock[0])
    progress = CalibrationProgress()
    progress("lookup", 0, 50)
    assert progress.line() == "Calibrating: answering the calibration prompts 0/50…"
    clock[0] += 30
    progress("latency", 20, 50)
    assert progress.line() == "Calibrating: timing trees 20/50, about 45 s left…"  # 1.5 s an item, 30 to go
    clock[0] += 60
    progress("tree search", 45, 50)
    assert progress.count_line() == "choosing the tree 45/50, about 10 s left"


@pytest.fixture(scope="module")
def calibration_seen(tiny_model_dir, tmp_path_factory):
    """The tiny model calibrated with a recorder of its progress and of the phase each pause point came in."""
    folders = pytest.MonkeyPatch()
    folders.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path_factory.mktemp("profiles"))
    folders.setattr("ppd_core.calibration.records.user_records_dir", lambda: tmp_path_factory.mktemp("records"))
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="auto", auto_calibrate=False))
    told, paused = [], []

    def between() -> bool:
        paused.append(told[-1][0] if told else "")
        return False

    calibrate_engine(engine, lambda *report: told.append(report), between=between, prompts=2, max_new_tokens=17,
                     contexts=(64,), repeats=1)
    folders.undo()  # (17 tokens: an acceptance record of its own, never one another test left beside the tokens)
    return told, paused


def test_a_real_calibration_counts_once_over_its_phases(calibration_seen):
    told, _ = calibration_seen
    assert len({total for _, _, total in told}) == 1, told
    done = [done for _, done, _ in told]
    assert done == sorted(done) and done[-1] == told[-1][2], told
    phases = list(dict.fromkeys(phase for phase, _, _ in told))
    assert phases == ["lookup", "acceptance", "latency", "tree search"], phases  # in order, each once


def test_a_real_calibration_pauses_in_every_phase(calibration_seen):
    """Between the steps of its prompts' answers, before each acceptance answer, each timed step and each item of the
    tree search: where a first launch lends the model to a waiting answer."""
    told, paused = calibration_seen
    assert {"lookup", "acceptance", "latency", "tree search"} <= set(paused), set(paused)
    answered = sum(1 for phase, _, _ in told if phase == "lookup")
    assert paused.count("lookup") > answered  # within answers, not only between them


def test_the_probes_context_is_decoded_in_chunks_with_a_pause_point_before_each(monkeypatch):
    """The latency probes' 640-token context was decoded in one call, before the first probe and again after every
    answer the calibration paused for: an answer asked for meanwhile waited behind it (13-19 s on the busy 2-core CPU
    here, queued behind a first launch's calibration). Now a pause point comes before every ``CHUNK`` tokens, and a
    context the model was lent away from is decoded again from its start."""
    from conftest import tiny_llama
    from ppd_core.backends.torch.decoder import TorchDecoder
    from ppd_core.backends.torch.lean.model import LeanDecoder
    from ppd_core.calibration.latency import CHUNK, ProbeContext

    decoder = TorchDecoder(LeanDecoder(tiny_llama(seed=1)))
    decoded, real_prefill = [], decoder.prefill
    monkeypatch.setattr(decoder, "prefill", lambda cache, ids: decoded.append(len(ids)) or real_prefill(cache, ids))
    lent = iter([False, False, True])  # the third pause point lends the model to an answer
    pauses = []
    probe = ProbeContext(decoder, [index % 50 for index in range(5 * CHUNK - 7)], lambda: pauses.append(1) or next(lent, False))
    cache = probe.ready()
    assert decoded == [CHUNK, CHUNK] + [CHUNK] * 4 + [CHUNK - 7]  # two chunks, lent, then the whole context anew
    assert len(pauses) == 3 + 5 and decoder.cache_length(cache) == 5 * CHUNK - 7
