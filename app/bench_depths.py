"""`ppd bench`'s tokens per step by source and by depth: how many guesses a step accepted at depth 1, 2, ... of its
accepted path (the d-th guess a step accepts is at depth d), each counted for the source whose node it was. Summed
over the depths, a source's row is its ``accepted_per_step_by_source``; a step emits its accepted guesses and then
the model's own next token, so tokens per step = 1 + accepted guesses per step, less the answers' last steps whose own
token a limit (the token limit, an EOS among the guesses) cut off (``GenerationStats.add``, ``StepStats.clip``).

Sources are read by name from the counts (a drafter's ``name``): a new source shows up here with nothing added.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_COLUMNS = 5  # depth columns in the text table; the last one sums the deeper ones too ("5+")


def json_name(source: str) -> str:
    """A source's name as a JSON key: "prompt tokens" -> "prompt_tokens"."""
    return source.replace(" ", "_")


def add_counts(totals, stats) -> None:
    """Add one answer's guesses by source (``GenerationStats.accepted``, ``drafted``, ``accepted_by_depth``) to a
    ``bench.ModeTotals``."""
    for mine, theirs in ((totals.accepted, stats.accepted), (totals.drafted, stats.drafted),
                         (totals.accepted_by_depth, stats.accepted_by_depth)):
        for key, count in theirs.items():
            mine[key] = mine.get(key, 0) + count


def per_step_by_depth(by_depth: dict[tuple[str, int], int], names: Iterable[str], steps: int) -> dict[str, list[float]]:
    """{source's JSON name: [accepted guesses per step at depth 1, 2, ..., the deepest any source reached]} for every
    source of ``names`` (one that had none accepted: zeros); ``by_depth``: (source, depth) -> accepted guesses."""
    deepest = max((depth for _, depth in by_depth), default=0)
    return {json_name(name): [round(by_depth.get((name, depth), 0) / steps, 4) if steps else 0.0
                              for depth in range(1, deepest + 1)] for name in names}


def turn_label(group: str) -> str:
    """"turn 1" -> "first turns", "turn 2" -> "follow-ups (turn 2)"."""
    number = group.removeprefix("turn ")
    return "first turns" if number == "1" else f"follow-ups (turn {number})"


def columns(per_depth: list[float]) -> list[float]:
    """A row's depth columns: depths 1 to ``MAX_COLUMNS`` - 1, then the rest summed."""
    return per_depth[: MAX_COLUMNS - 1] + ([sum(per_depth[MAX_COLUMNS - 1:])] if len(per_depth) >= MAX_COLUMNS else [])


def group_table(label: str, ppd: dict) -> list[str]:
    """One part's lines (``ppd``: a ``ModeTotals.to_json(True)`` object): tokens per step, then one row per source
    of accepted guesses per step by depth, and their sum."""
    rows = ppd["accepted_per_step_by_depth"]
    guesses = sum(sum(row) for row in rows.values())
    lines = [f"{label}: {ppd['mean_accepted']:.3f} tokens per step over {ppd['steps']} steps, {guesses:.3f} of them "
             "accepted guesses"]
    if not rows or not guesses:
        return lines
    deepest = max(len(row) for row in rows.values())
    heads = [f"depth {depth}" for depth in range(1, min(deepest, MAX_COLUMNS) + 1)]
    if deepest > MAX_COLUMNS:
        heads[-1] += "+"
    width = max(len("all sources"), *map(len, rows))
    totals = [sum(row[depth] for row in rows.values() if depth < len(row)) for depth in range(deepest)]
    lines.append(f"  {'source':<{width}}" + "".join(f"  {head:>8}" for head in heads) + f"  {'all':>6}")
    for name, row in [*rows.items(), ("all sources", totals)]:
        cells = columns(row + [0.0] * (deepest - len(row)))
        lines.append(f"  {name:<{width}}" + "".join(f"  {cell:8.3f}" for cell in cells) + f"  {sum(row):6.3f}")
    return lines


def depth_table(result: dict) -> str:
    """The text table of a ``ppd bench`` result: first turns and follow-ups apart (its groups "turn N")."""
    lines = ["PPD tokens per step by source and depth (accepted guesses per step at each depth of the accepted path; "
             "a step also emits the model's own token):"]
    for group in sorted(name for name in result.get("groups", {}) if name.startswith("turn ")):
        lines += group_table(turn_label(group), result["groups"][group]["ppd"])
    return "\n".join(lines)
