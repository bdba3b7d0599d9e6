"""Benchmark charts on a matplotlib Figure: one run (gpu_runtime's plot_result), a sweep
(plot_sweep), or two runs side by side; dark in the window, light in a saved file."""

from __future__ import annotations

from collections.abc import Callable

import matplotlib
from matplotlib.figure import Figure

from .bench_runs import BenchRun

RUN_COLORS = ("#3b7dd8", "#e08a2c")

# The window's colours (theme.py's palette), so that the chart reads as part of the editor.
DARK_STYLE = {
    "figure.facecolor": "#24262b", "axes.facecolor": "#24262b", "savefig.facecolor": "#24262b",
    "axes.edgecolor": "#8d919a", "axes.labelcolor": "#d8dae0", "text.color": "#d8dae0",
    "xtick.color": "#b8bcc6", "ytick.color": "#b8bcc6", "grid.color": "#3a3d45",
    "legend.facecolor": "#2a2c32", "legend.edgecolor": "#3a3d45",
}
# A saved chart goes into papers and slides: matplotlib's own light look.
LIGHT_STYLE = {"figure.facecolor": "white", "axes.facecolor": "white", "savefig.facecolor": "white"}
EXPORT_SIZE_INCHES = (10.0, 5.0)


def draw_run(run: BenchRun, fig: Figure) -> None:
    from ..gpu_runtime.plots import plot_result, plot_sweep

    if run.sweep is not None:
        plot_sweep(run.sweep, fig)
    else:
        plot_result(run.result, fig)


def draw_comparison(a: BenchRun, b: BenchRun, fig: Figure) -> None:
    """Median time of each implementation in run a and run b, as paired bars."""
    from ..gpu_runtime.plots import FOOTNOTE_COLOR, ms_text, needs_log_scale

    fig.clear()
    fig.set_layout_engine("constrained")
    ax = fig.subplots()
    ra, rb = a.first, b.first
    names: list[str] = []
    for r in (*ra.rows, *rb.rows):
        if r.name not in names:
            names.append(r.name)
    height = 0.38
    every: list[float] = []
    for k, (run, res) in enumerate(((a, ra), (b, rb))):
        ys, xs = [], []
        for i, name in enumerate(names):
            row = res.row(name)
            if row is not None and row.ok and row.median_ms:
                ys.append(i + (k - 0.5) * height)
                xs.append(row.median_ms)
        ax.barh(ys, xs, height=height, color=RUN_COLORS[k], label=run.label())
        every += xs
        for y, x in zip(ys, xs, strict=True):
            ax.text(x, y, f" {ms_text(x)}", va="center", fontsize=7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    label = "ms per forward pass (median)"
    if needs_log_scale(every):
        ax.set_xscale("log")
        ax.set_xlabel(f"{label} (log scale)")
    elif every:
        ax.set_xlim(0.0, max(every) * 1.22)
        ax.set_xlabel(label)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"Run #{a.number} against run #{b.number}", fontsize=9)
    if "numpy" in (ra.backend, rb.backend):
        fig.supxlabel("numpy backend runs are CPU times of the Plan's numpy executor, not GPU times",
                      fontsize=8, color=FOOTNOTE_COLOR)


def draw_themed(draw: Callable[[Figure], None], fig: Figure, dark: bool) -> None:
    """Runs `draw(fig)` with the dark or the light style; the figure's background follows."""
    style = DARK_STYLE if dark else LIGHT_STYLE
    with matplotlib.rc_context(style):
        fig.set_facecolor(style["figure.facecolor"])
        draw(fig)


def save_light(draw: Callable[[Figure], None], path: str) -> None:
    """Draws the chart again, light, on a figure of its own, and saves it (PNG or SVG by suffix)."""
    fig = Figure(figsize=EXPORT_SIZE_INCHES, dpi=100)
    draw_themed(draw, fig, dark=False)
    fig.savefig(path, dpi=150)
