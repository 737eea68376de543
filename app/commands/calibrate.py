"""`ppd calibrate`: measure this device and choose the guess tree (or choose it for a given latency curve)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.commands.loading import ProgressBars, load_engine
from app.commands.options import add_model_options, write_output


def register(commands) -> None:
    """Add `ppd calibrate`'s sub-parser to ``commands``."""
    calibrate = commands.add_parser("calibrate", help="measure this device and choose the guess tree")
    calibrate.add_argument("--json", type=Path, default=None, dest="json_path", help="also write the profile here")
    calibrate.add_argument("--acceptance-file", type=Path, default=None, metavar="FILE",
                           help="also write the guesses' acceptance record here (ship it beside the prompt-token file as "
                           "NAME.acceptance.json: calibrations elsewhere then measure only the latency curve)")
    calibrate.add_argument("--latency-curve", type=Path, default=None, metavar="FILE",
                           help="choose the tree for this step-latency curve (JSON: tree tokens -> ms, e.g. a GPU's) "
                           "instead of timing this device; the result is not saved as this device's profile")
    calibrate.add_argument("--no-type-curves", action="store_true",
                           help="for an F16/BF16/Q8_0 file, skip timing the flatter types Q4_0, IQ4_NL and Q4_K_M")
    add_model_options(calibrate)


def run(args: argparse.Namespace) -> int:
    from ppd_core.calibration.profiles import profile_path
    from ppd_core.engine_calibration import calibrate_engine, calibrate_with_curve, export_acceptance
    from ppd_core.drafters.lookup import chains_text

    curve = None
    if args.latency_curve is not None:
        from ppd_core.calibration.curves import read_curve

        curve = read_curve(args.latency_curve)  # a bad file fails before the model loads
    args.tree = "auto"  # with auto_calibrate off: no calibration at load (a static tree would need prompt tokens)
    engine = load_engine(args, auto_calibrate=False)
    profile = calibrate_engine(engine, ProgressBars()) if curve is None else calibrate_with_curve(engine, curve, ProgressBars())
    measured = set(next(iter(profile.latency_ms.values())))
    print(f"{'tokens':>6} {'step ms':>8} {'tokens/step':>11} {'tokens/s':>9}")
    for row in profile.budgets:
        if row["budget"] in measured or row["budget"] == profile.budget:
            mark = "  <- chosen" if row["budget"] == profile.budget else ""
            print(f"{row['budget']:>6} {row['ms_per_step']:>8.1f} {row['tokens_per_step']:>11.3f} {row['tokens_per_second']:>9.2f}{mark}")
    print(
        f"chosen: {profile.budget} tokens per step (trees of {', '.join(map(str, profile.tree_sizes))} tokens by guess depth), "
        f"expected {profile.expected_tokens_per_step:.2f} tokens/step, expected speedup {profile.expected_speedup:.2f}x; "
        f"calibrated in {profile.calibration_seconds:.0f} s"
    )
    print(
        f"lookup: {chains_text(profile.lookup_lengths)}; with them "
        f"expected {profile.expected_tokens_per_step_with_lookup:.2f} tokens/step, expected speedup "
        f"{profile.expected_speedup_with_lookup:.2f}x"
    )
    for name, part in profile.expected_with_lookup_by_turn.items():
        print(f"  {name} ({part['answers']} answers): {part['tokens_per_step']:.2f} tokens/step, {part['speedup']:.2f}x")
    print(f"steps: {profile.policy.line()}")
    if curve is None:
        print(f"profile saved to {profile_path(profile.key)}; guess acceptance from {profile.acceptance_from}")
    else:
        print(f"latency curve from {curve.path}: {curve.device} (source: {curve.source}); not saved as this device's "
              f"profile; guess acceptance from {profile.acceptance_from}")
    if args.json_path:
        write_output(args.json_path, json.dumps(profile.to_json(), indent=1) + "\n")
    if args.acceptance_file:
        print(f"acceptance record written to {export_acceptance(engine, args.acceptance_file, profile)}")
    if curve is None and engine.loaded.gguf_file is not None and not args.no_type_curves:
        report_type_curves(engine)
    return 0


def report_type_curves(engine) -> None:
    """For an F16/BF16/Q8_0 file: this device's step curve for it, and what flatter types would decode at."""
    from ppd_core.backends.llamacpp.quantize import read_source
    from ppd_core.calibration.type_curves import TYPE_CURVE_CONTEXT, TYPE_CURVE_SIZES, other_type_curves
    from ppd_core.engine_calibration import step_curve

    gguf, threads, layers = engine.loaded.gguf_file, engine.threads, engine.loaded.kernels.get("gpu_layers")
    own_type = read_source(gguf)[0]
    if own_type not in ("F32", "F16", "BF16", "Q8_0"):
        return
    print(f"step ms after {TYPE_CURVE_CONTEXT} cached tokens, {' / '.join(map(str, TYPE_CURVE_SIZES))} rows "
          "(other types made in a temporary folder and timed here; this takes a while):", flush=True)
    curves: dict[str, dict[int, float] | str] = {f"{own_type} (this file)": step_curve(engine, TYPE_CURVE_SIZES, TYPE_CURVE_CONTEXT)}
    engine.close()  # one model in memory at a time
    curves.update(other_type_curves(gguf, threads, layers))
    for name, curve in curves.items():
        if isinstance(curve, str):
            print(f"  {name}: not measured ({curve})")
            continue
        sizes = TYPE_CURVE_SIZES
        how = "" if "this file" in name else f"; `ppd quantize {gguf.name} --to {name}` makes it and reports its perplexity"
        print(f"  {name}: {' / '.join(f'{curve[s]:.1f}' for s in sizes)}; {sizes[-1]} rows cost "
              f"{curve[sizes[-1]] / curve[1]:.1f}x one; plain {1000 / curve[1]:.1f} tokens/s{how}")
