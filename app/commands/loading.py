"""The engine the model options name, with tqdm bars for a calibration's phases."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from app.commands.options import model_threads

if TYPE_CHECKING:
    from ppd_core import Engine


class ProgressBars:
    """tqdm bars for a calibration's phases; ``also`` hears every report too (the chat page's startup line)."""

    def __init__(self, also=None):
        self.bars = {}
        self.also = also

    def __call__(self, phase: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.also is not None:
            self.also(phase, done, total)
        if phase == "downloading":  # the Hub's own bars show the download here
            return
        # a calibration's phases share one count (ppd_core.calibration.count): one bar, named by the phase running
        bar = self.bars.get("calibrating") or self.bars.setdefault("calibrating", tqdm(total=total, leave=False))
        bar.set_description(f"calibrating: {phase}", refresh=False)
        bar.total, bar.n = total, done
        bar.refresh()
        if done >= total:
            bar.close()
            self.bars.pop("calibrating")


def load_engine(args: argparse.Namespace, auto_calibrate: bool = True, progress=None) -> Engine:
    """The engine of the model options; ``progress(phase, done, total)`` hears the calibration's phases too."""
    from ppd_core import Engine, EngineConfig

    config = EngineConfig(
        model=args.model, prompt_tokens=args.prompt_tokens, quant=args.quant, device=args.device,
        dtype=args.dtype, forward=args.forward, tree=args.tree, auto_calibrate=auto_calibrate,
        threads=model_threads(args), lookup=args.lookup, backend=args.backend, gpu_layers=args.gpu_layers,
        drafters=args.drafters,
    )
    return Engine.load(config, ProgressBars(also=progress))
