"""The calibrated latency curve as data for Gradio's native line plot (pandas, which gradio already imports: no
plotting library in the chat process)."""

from __future__ import annotations

import pandas as pd

from ppd_core import DeviceProfile

COLUMNS = ["tree tokens", "step latency (ms)", "series"]


def latency_points(profile: DeviceProfile) -> pd.DataFrame:
    """Step latency against tree tokens per context length, plus the tree size calibration chose as a series of its
    own: a vertical line at that size across the curves (a one-point line would not be drawn), its label short enough
    for the legend to show whole (Vega cuts labels at 160 px)."""
    rows = [(size, curve[size], f"{context} cached tokens")
            for context, curve in sorted(profile.latency_ms.items()) for size in sorted(curve)]
    if rows and any(row["budget"] == profile.budget for row in profile.budgets):
        speedup = profile.expected_speedup_with_lookup if any(profile.lookup_lengths) else profile.expected_speedup
        label = f"chosen: {profile.budget} {'token' if profile.budget == 1 else 'tokens'}, {speedup:.2f}x"
        latencies = [latency for _, latency, _ in rows]
        rows += [(profile.budget, min(latencies), label), (profile.budget, max(latencies), label)]
    return pd.DataFrame(rows, columns=COLUMNS)
