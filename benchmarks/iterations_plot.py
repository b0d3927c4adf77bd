"""The figure of benchmarks/iterations.py, after seed 004's figs. 19-23: run time with
one kill at n/2 per recovery style (figs. 19, 20), how much faster than a restart each
recovered (figs. 21, 22), and the superstep-checkpoint overhead per variant (fig. 23,
Table 4). Bars are medians, whiskers the spread (min-max) over the rounds."""

from __future__ import annotations

import statistics
from typing import Any


def _bars(ax: Any, labels: list[str], series: dict[str, list[list[float]]], unit: str) -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(labels))]
        med = [statistics.median(v) for v in values]
        low = [m - min(v) for m, v in zip(med, values, strict=True)]
        high = [max(v) - m for m, v in zip(med, values, strict=True)]
        ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))], labels)
    ax.set_ylabel(unit)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.legend(fontsize=8)


def plot(path: str, studies: list[Any]) -> bool:
    """Write the PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, study in zip(axes[0], studies, strict=False):  # figs. 19, 20
        modes = ["failure-free", *study.recovery]
        values = [study.clean.seconds, *(c.seconds for c in study.recovery.values())]
        _bars(ax, modes, {study.name: values}, "total time (s)")
        ax.set_title(f"{study.name}: one kill at superstep {study.kill_at} of {study.n}")
    kill_modes = [m for m in studies[0].recovery if m != "none"] if studies else []
    _bars(  # figs. 21, 22
        axes[1][0],
        kill_modes,
        {s.name: [s.gain_pct(m) for m in kill_modes] for s in studies},
        "faster than a restart from the start (%)",
    )
    axes[1][0].set_title("recovery: gain over a restart")
    modes = list(studies[0].overhead) if studies else []
    _bars(  # fig. 23, Table 4
        axes[1][1],
        modes,
        {s.name: [s.overhead_pct(m) for m in modes] for s in studies},
        "overhead vs no fault tolerance (%)",
    )
    axes[1][1].set_title("superstep checkpoints every k = sqrt(n) supersteps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
