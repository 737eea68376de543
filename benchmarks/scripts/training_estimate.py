"""The training offer's time estimate against a training run's measured time (issue 50, page item 6).

    .venv/bin/python benchmarks/scripts/training_estimate.py [--profile FILE] [--json FILE]

Prices docs/training.md's first run (`ppd train --samples 640 --max-new-tokens 128 --max-prompt-tokens 256
--generation-batch 32 --cuts 32 --epochs 1.5 --ensemble 2`) as the page's offer does (``ppd_core/training/cost.py``),
with a shipped calibration profile's latency curve (default: the 2-core EPYC's llama.cpp profile) and the default
model's shape, and prints the estimate beside that run's measured time (teacher answers about 10 min with the CPU to
itself, training 31.6 min, held-out evaluation 53 s: docs/training.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from measurement import ROOT, machine, now, report
from ppd_core import Engine, EngineConfig
from ppd_core.calibration.profiles import read_profile
from ppd_core.training.cost import TrainSize, calibrated_step, model_shape, training_cost

MEASURED_MINUTES = 10 + 31.6 + 53 / 60  # docs/training.md: answers, training, held-out evaluation
RUN = TrainSize(samples=640, epochs=1.5, cuts=32, ensemble=2, max_prompt_tokens=256, max_new_tokens=128,
                generation_batch=32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=ROOT / "profiles" / "llamacpp-amd-epyc-avx2build-2threads.json")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="small", auto_calibrate=False))
    cost = training_cost(RUN, model_shape(engine.loaded), calibrated_step(read_profile(args.profile), RUN))
    report({"machine": machine(), "when": now(), "command": "benchmarks/scripts/training_estimate.py",
            "profile": str(args.profile.relative_to(ROOT)), "estimated_minutes": round(cost.seconds / 60, 1),
            "measured_minutes": round(MEASURED_MINUTES, 1)}, args.json)


if __name__ == "__main__":
    main()
