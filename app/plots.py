"""The calibrated latency curve as data for Gradio's native line plot (pandas, which gradio already imports: no
plotting library in the chat process)."""

from __future__ import annotations

import pandas as pd

from ppd_core.calibration.profiles import DeviceProfile
from ppd_core.calibration.tree_search import step_seconds

COLUMNS = ["tree tokens", "step latency (ms)", "series"]


def latency_points(profile: DeviceProfile) -> pd.DataFrame:
    """Step latency against tree tokens per context length, and the point calibration chose marked on the plot: the
    curve at the chosen tree size, the corner of a line across from its latency and down to its size (a series of its
    own, named in the legend with no speedup figure: the page's one speedup figure is the readout's; calibration's
    forecasts are behind the summary's Details). Its label is short enough for the legend to show whole (Vega cuts
    labels at 160 px)."""
    rows = [(size, curve[size], f"{context} cached tokens")
            for context, curve in sorted(profile.latency_ms.items()) for size in sorted(curve)]
    if rows and any(row["budget"] == profile.budget for row in profile.budgets):
        ms = round(1000 * step_seconds(profile.latency_ms)(profile.budget), 3)  # the curve there (means of contexts)
        label = f"chosen: {profile.budget} {'token' if profile.budget == 1 else 'tokens'}, {ms:.0f} ms"
        # across from the latency axis to the point, then down to the size's axis: a corner at the point (Vega sorts a
        # line's points by x, stably: the two at the chosen size keep this order)
        rows += [(0, ms, label), (profile.budget, ms, label), (profile.budget, 0.0, label)]
    return pd.DataFrame(rows, columns=COLUMNS)
