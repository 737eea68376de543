"""What fixed row budgets would give on another device's step curve: measured tokens per step over the row cost.

    python benchmarks/scripts/forecast_budgets.py --curve FILE [--curve FILE ...] --measured JSON [--measured JSON ...]
        [--target CURVE_FILE=SPEEDUP ...] [--json OUT]

``--measured``: ``merged_tree.py --json`` files (tokens per step by drafter set, row budget and turn kind, measured
on the default GGUF). For each curve and each measured (drafters, budget B): the speedup over plain steps if every
step cost a B-row step, ``tokens_per_step(B) * t(1) / t(B)``, on the curve's ``latency_ms`` (its smallest context)
and on its ``fixed_ms`` where it has one. On ``fixed_ms`` that is what padded steps cost (every step B rows); on
``latency_ms`` it prices a step that drafted fewer rows at B rows too, so a step sized by the curve
(``merged_tree.py --curve``) does better. No host time (proposing, merging, learning) is counted. ``needed``: the
tokens per step the target asks at B.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def interpolate(curve: dict[int, float], rows: int) -> float | None:
    """ms of a ``rows``-row step, linear between the curve's sizes; None beyond its largest."""
    sizes = sorted(curve)
    if rows in curve:
        return curve[rows]
    if rows > sizes[-1]:
        return None
    above = next(s for s in sizes if s > rows)
    below = max(s for s in sizes if s < rows)
    return curve[below] + (curve[above] - curve[below]) * (rows - below) / (above - below)


def read_curves(path: str) -> dict[str, dict[int, float]]:
    """The file's curves by name ("latency", "fixed"): rows -> ms."""
    data = json.loads(Path(path).read_text())
    table = data["latency_ms"]
    if all(isinstance(v, dict) for v in table.values()):
        table = table[min(table, key=int)]
    curves = {"latency": {int(k): float(v) for k, v in table.items()}}
    if data.get("fixed_ms"):
        curves["fixed"] = {int(k): float(v) for k, v in data["fixed_ms"].items()}
    return curves


def read_measured(paths: list[str]) -> list[tuple[str, int, str, dict[str, float]]]:
    """(drafters, budget, prompt tokens on/off, tokens per step by turn kind) of each run in the files."""
    runs = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        tokens = "none" if "--prompt-tokens none" in data.get("command", "") else "shipped"
        for name, kinds in data["runs"].items():
            drafters, budget = re.fullmatch(r"(.+) @ (\d+) rows", name).groups()
            runs.append((drafters, int(budget), tokens, {k: v["tokens_per_step"] for k, v in kinds.items()}))
    return sorted(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", action="append", required=True)
    parser.add_argument("--measured", action="append", required=True)
    parser.add_argument("--target", action="append", default=[], help="CURVE_FILE=SPEEDUP for first turns")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args(argv)
    targets = {Path(t.split("=")[0]).name: float(t.split("=")[1]) for t in args.target}
    runs, out = read_measured(args.measured), []
    for path in args.curve:
        target = targets.get(Path(path).name)
        print(f"\n{path}" + (f"  (target on first turns: {target:.2f}x)" if target else ""))
        for kind, curve in read_curves(path).items():
            best: dict[str, tuple[float, str]] = {}
            for drafters, budget, tokens, per_step in runs:
                ms = interpolate(curve, budget)
                if ms is None:
                    continue
                cost = ms / curve[1]
                row = {"curve": path, "pricing": kind, "drafters": drafters, "prompt_tokens": tokens, "rows": budget,
                       "row_cost": round(cost, 3)}
                for turn, value in per_step.items():
                    row[turn] = round(value / cost, 3)
                    label = f"{drafters} @ {budget} rows, prompt tokens {tokens}"
                    if row[turn] > best.get(turn, (0.0, ""))[0]:
                        best[turn] = (row[turn], label)
                if target:
                    row["needed_first_turns"] = round(target * cost, 3)
                out.append(row)
                needed = f", needs {row['needed_first_turns']:.2f} tokens/step" if target else ""
                print(f"  {kind:8s} {budget:3d} rows (x{cost:.2f}) {tokens:8s} {drafters:35s} first "
                      f"{per_step['first turns']:.3f} -> {row['first turns']:.3f}x, follow-ups "
                      f"{per_step['follow-ups']:.3f} -> {row['follow-ups']:.3f}x{needed}")
            for turn, (value, label) in best.items():
                print(f"  best {kind} on {turn}: {value:.3f}x ({label})")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
