"""What `ppd calibrate`, `ppd train`, `ppd doctor` and the page's background calibration do to an engine, once each.

    profile = calibrate_engine(engine)            # measured, saved, and decoded with from now on
    profile = calibrate_with_curve(engine, FILE)  # another device's curve: neither saved nor decoded with
    record_acceptance(engine)                     # the guesses' acceptance, beside the prompt-token file

``engine`` is an ``Engine`` (its ``loaded`` model, ``prompt_tokens`` and ``plan``); nothing here holds on to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ppd_core.calibration.calibrate import acceptance_key, calibrate, calibrate_and_save, find_profile, measure_record
from ppd_core.calibration.curves import LatencyCurve, read_curve
from ppd_core.calibration.latency import measure_latency
from ppd_core.calibration.profiles import DeviceProfile
from ppd_core.calibration.records import beside, copy_records, save_record
from ppd_core.errors import PpdError
from ppd_core.progress import Progress
from ppd_core.static_trees import STATIC_TREES

if TYPE_CHECKING:
    from ppd_core.engine import Engine

log = logging.getLogger(__name__)


def saved_profile(engine: Engine) -> DeviceProfile | None:
    """The profile saved for this device, model and prompt tokens; a corrupt or stale one is ignored with a warning."""
    return find_profile(engine.loaded, engine.prompt_tokens)


def calibrate_engine(engine: Engine, progress: Progress | None = None, **options) -> DeviceProfile:
    """Measure this device, save the profile (at ``profiles.profile_path(profile.key)``), and decode with its trees."""
    profile = calibrate_and_save(engine.loaded, engine.prompt_tokens, progress, **options)
    engine.replan(profile, tree="auto")
    return profile


def calibrate_with_curve(engine: Engine, curve: LatencyCurve | str | Path, progress: Progress | None = None,
                         **options) -> DeviceProfile:
    """Choose the tree and chains for another device's step-latency curve (``read_curve``'s file) with this model's
    guess acceptance, timing nothing here. The profile describes that device: it is neither saved nor decoded with."""
    if not isinstance(curve, LatencyCurve):
        curve = read_curve(curve)
    return calibrate(engine.loaded, engine.prompt_tokens, progress, curve=curve, **options)


def record_acceptance(engine: Engine, progress: Progress | None = None, prompts: int = 12,
                      max_new_tokens: int = 96) -> Path:
    """Measure the guesses' acceptance with this engine's numerics and write the record beside the prompt-token file,
    where every later calibration with the same numerics finds it (``ppd train`` does this)."""
    tokens = engine.prompt_tokens
    if tokens.source is None:
        raise PpdError("these prompt tokens were not read from a file: nowhere to put their acceptance record")
    key = acceptance_key(engine.loaded, tokens, prompts, max_new_tokens)
    record = measure_record(engine.loaded, tokens, key, prompts, max_new_tokens,
                            progress or (lambda phase, done, total: None))
    return save_record(record, beside(tokens.source))


def export_acceptance(engine: Engine, path: Path, profile: DeviceProfile | None = None) -> Path:
    """Write the acceptance record the plan's calibration (or ``profile``'s) used to ``path``, e.g. beside a
    prompt-token file to ship (``NAME.acceptance.json``): calibrations elsewhere then measure only their curve."""
    profile = profile or engine.plan.profile
    if profile is None or not profile.acceptance_from:
        raise PpdError("no calibration has measured the guesses' acceptance yet")
    if not copy_records(Path(profile.acceptance_from), engine.prompt_tokens.fingerprint, path):
        raise PpdError(f"{profile.acceptance_from} holds no record for these prompt tokens")
    return path


def step_curve(engine: Engine, sizes: Sequence[int], context: int) -> dict[int, float]:
    """Milliseconds of one step of each size in ``sizes`` rows after ``context`` cached tokens, on this model."""
    return measure_latency(engine.loaded.backend, None, 0, 1, sizes, (context,), repeats=5)[context]


def latency_curve(engine: Engine, sizes: Sequence[int], contexts: Sequence[int] = (256,)) -> dict[int, dict[int, float]]:
    """Median ms of a PPD step over a tree of each of ``sizes`` tokens after each context length:
    ``{context: {tree tokens: ms}}``, measured as calibration does (`ppd doctor`)."""
    tokens = engine.prompt_tokens
    table = tokens.table() if tokens.num_prompt_tokens else None
    return measure_latency(engine.loaded.backend, table, tokens.num_prompt_tokens, tokens.ensemble_size, sizes, contexts)


def next_token_logits(engine: Engine, input_ids: Sequence[int]) -> np.ndarray:
    """Plain decoding's logits [vocab] float32 for the token after ``input_ids``, from a fresh cache (`ppd doctor`)."""
    backend = engine.loaded.backend
    cache = backend.new_cache()
    try:
        return backend.prefill(cache, list(input_ids)).rows(slice(0, 1))[0]
    finally:
        backend.truncate(cache, 0)
