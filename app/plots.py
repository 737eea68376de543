"""The calibrated latency curve as data for Gradio's native line plot (pandas, which gradio already imports: no
plotting library in the chat process)."""

from __future__ import annotations

import pandas as pd

from ppd_core.engine import DeviceProfile

COLUMNS = ["tree tokens", "step latency (ms)", "series"]


def latency_points(profile: DeviceProfile) -> pd.DataFrame:
    """Step latency against tree tokens per context length, plus the chosen tree size as a series of its own."""
    rows = [(size, curve[size], f"{context} cached tokens")
            for context, curve in sorted(profile.latency_ms.items()) for size in sorted(curve)]
    chosen = {row["budget"]: row["ms_per_step"] for row in profile.budgets}.get(profile.budget)
    if chosen is not None:
        chains = " + lookup chains" if any(profile.lookup_lengths) else ""
        speedup = profile.expected_speedup_with_lookup if chains else profile.expected_speedup
        rows.append((profile.budget, chosen, f"chosen: {profile.budget} tokens{chains}, {speedup:.2f}x expected"))
    return pd.DataFrame(rows, columns=COLUMNS)
