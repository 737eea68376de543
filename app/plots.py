"""Figures for the UI and the benchmark: the calibrated latency curve."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ppd_core.engine import DeviceProfile  # noqa: E402


def latency_figure(profile: DeviceProfile):
    """Step latency against tree tokens per context length, with the chosen tree size marked."""
    figure, axis = plt.subplots(figsize=(6, 3.4))
    for context, curve in sorted(profile.latency_ms.items()):
        sizes = sorted(curve)
        axis.plot(sizes, [curve[s] for s in sizes], marker="o", markersize=3, label=f"{context} cached tokens")
    chosen = {row["budget"]: row["ms_per_step"] for row in profile.budgets}.get(profile.budget)
    chains = " + lookup chains" if any(profile.lookup_lengths) else ""
    speedup = profile.expected_speedup_with_lookup if chains else profile.expected_speedup
    if chosen is not None:
        axis.scatter([profile.budget], [chosen], s=120, facecolors="none", edgecolors="red", linewidths=2, zorder=5,
                     label=f"chosen: {profile.budget} tokens{chains}, {speedup:.2f}x expected")
    axis.set_xlabel("tokens in the tree (one forward pass)")
    axis.set_ylabel("step latency (ms)")
    axis.set_title(profile.key["device"]["name"][:60], fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
