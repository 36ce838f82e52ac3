"""Predicted against measured throughput as a PNG (matplotlib: the optional `plot` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optlayout.errors import InputError, UnsupportedError


def plot_compare(result: dict[str, Any], path: str | Path) -> None:
    """Scatter of predicted vs measured tokens/s/GPU, coloured by source, with the identity line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UnsupportedError("plot: matplotlib is not installed (pip install 'optlayout[plot]')") from None
    if Path(path).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise InputError(f"plot: {path} should end in .png, .svg or .pdf")
    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 6), dpi=120)
    sources = sorted({r["source"] for r in runs})
    for source in sources:
        xs = [r["measured_tokens_per_s_per_gpu"] for r in runs if r["source"] == source]
        ys = [r["predicted_tokens_per_s_per_gpu"] for r in runs if r["source"] == source]
        ax.scatter(xs, ys, s=14, alpha=0.75, label=f"{source[:45]} ({len(xs)})")
    values = [v for r in runs for v in (r["measured_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"])]
    lo, hi = min(values) * 0.8, max(values) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
    ax.set_xlabel("measured tokens/s/GPU")
    ax.set_ylabel("predicted tokens/s/GPU")
    s = result["summary"]
    ax.set_title(f"{s['n']} runs, MAPE {s['mape']:.1%}")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
