"""Benchmark charts on a matplotlib Figure: one run (gpu_runtime's plot_result), a sweep
(plot_sweep), or two runs side by side; dark in the window, light in a saved file. A speedup or a ratio
that rests on a noisy time (bench_runs.noisy) says so beside it. Two runs of different precisions (an fp32
run beside a bf16 one) are each named with their precision in the legend."""

from __future__ import annotations

from collections.abc import Callable

import matplotlib
from matplotlib.figure import Figure

from .bench_runs import (
    NOISY,
    BenchRun,
    comparison_refusal,
    implementations,
    median_ms,
    noisy,
    precisions_differ,
    ratio_noisy,
    ratio_text,
)

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
NOISY_MARGIN = 1.6  # room right of the longest bar of a chart that writes "(noisy)" beside its values


def draw_run(run: BenchRun, fig: Figure) -> None:
    from ..gpu_runtime.plots import plot_result, plot_sweep

    if run.sweep is not None:
        plot_sweep(run.sweep, fig)
    else:
        plot_result(run.result, fig)
        _mark_noisy(run, fig)


def _mark_noisy(run: BenchRun, fig: Figure) -> None:
    """Writes "(noisy)" beside the speedup of each noisy row, or beside its time where there is no speedup:
    plot_result writes one value per timed row, in the rows' order, on each of its two axes."""
    from ..gpu_runtime.plots import FOOTNOTE_COLOR, VALUE_MARGIN

    rows = [r for r in run.result.rows if r.ok and r.median_ms is not None]
    if not any(noisy(r) for r in rows):
        return
    for ax in reversed(fig.axes):  # the speedups' axes, then the times'
        if len(ax.texts) == len(rows):
            for text, row in zip(ax.texts, rows, strict=True):
                if noisy(row):
                    text.set_text(f"{text.get_text()} ({NOISY})")
                    text.set_color(FOOTNOTE_COLOR)
            low, high = ax.get_xlim()
            if ax.get_xscale() == "linear":
                ax.set_xlim(low, high * NOISY_MARGIN / VALUE_MARGIN)
            return


def draw_comparison(a: BenchRun, b: BenchRun, fig: Figure) -> None:
    """Two single runs side by side: each implementation's median time in run a and in run b as paired
    bars on one time axis, and beside them the ratio b / a (above 1: b is slower). Both must time the
    same: the forward pass, or training. Runs of different precisions say each one's in the legend."""
    from ..gpu_runtime.plots import FOOTNOTE_COLOR, VALUE_MARGIN, log_x, ms_text, needs_log_scale, time_axis

    if why := comparison_refusal(a, b):
        raise ValueError(why)
    fig.clear()
    fig.set_layout_engine("constrained")
    ax_time, ax_ratio = fig.subplots(1, 2, width_ratios=(3, 2), sharey=True)
    names = implementations(a, b)
    precisions = precisions_differ(a, b)
    height = 0.38
    every: list[float] = []
    # Each value is written right of the longer bar of its pair: beside its own, it ran over the other.
    longer = {i: max(times) for i, name in enumerate(names)
              if (times := [t for r in (a, b) if (t := median_ms(r, name)) is not None])}
    size = min(7.0, _fitting_pt(fig, names))
    for k, run in enumerate((a, b)):
        bars = [(i, i + (k - 0.5) * height, t) for i, name in enumerate(names)
                if (t := median_ms(run, name)) is not None]
        ys, xs = [y for _, y, _ in bars], [t for _, _, t in bars]
        ax_time.barh(ys, xs, height=height, color=RUN_COLORS[k], label=run.label(precision=precisions))
        every += xs
        for i, y, x in bars:
            ax_time.text(longer[i], y, f" {ms_text(x)}", va="center", fontsize=size, color=RUN_COLORS[k])
    ax_time.set_yticks(range(len(names)), names)
    ax_time.invert_yaxis()
    time_axis(ax_time, every, f"ms per {a.measures()} pass (median)")

    ratios = {i: tb / ta for i, name in enumerate(names)
              if (ta := median_ms(a, name)) is not None and (tb := median_ms(b, name)) is not None}
    # Each ratio a bar from 1: left where run b is faster, right where it is slower.
    ax_ratio.barh(list(ratios), [r - 1.0 for r in ratios.values()], left=1.0, height=2 * height,
                  color=RUN_COLORS[1])
    ax_ratio.axvline(1.0, color=matplotlib.rcParams["axes.edgecolor"], lw=0.8)
    low, high = min([1.0, *ratios.values()]), max([1.0, *ratios.values()])
    if needs_log_scale([low, high]):
        log_x(ax_ratio, low / VALUE_MARGIN, high)
    else:
        ax_ratio.set_xlim(0.0, high * VALUE_MARGIN)
    ax_ratio.set_xlabel(f"time of #{b.number} / time of #{a.number}")
    ax_ratio.tick_params(labelleft=False)
    for i, name in enumerate(names):
        text = f" {ratio_text(ratios[i])}" if i in ratios else " not timed in both"
        rough = i in ratios and ratio_noisy(a, b, name)
        ax_ratio.text(max(ratios.get(i, 1.0), 1.0), i, f"{text} ({NOISY})" if rough else text, va="center",
                      fontsize=7, color=FOOTNOTE_COLOR if rough else None)
    # Above the axes, where it hides no bar, and titled: constrained layout would lay a title of the
    # figure's own over a legend outside the axes.
    in_a, in_b = (f" in {a.precision}", f" in {b.precision}") if precisions else ("", "")
    mode = ", forward + backward" if a.train else ""
    fig.legend(fontsize=7, loc="outside upper center", ncols=2, title_fontsize=9,
               title=f"Run #{a.number}{in_a} and run #{b.number}{in_b}{mode}: median time, and "
                     f"#{b.number} / #{a.number}")
    if "numpy" in (a.first.backend, b.first.backend):
        fig.supxlabel("numpy backend runs are CPU times of the Plan's numpy executor, not GPU times",
                      fontsize=8, color=FOOTNOTE_COLOR)


def _fitting_pt(fig: Figure, names: list[str]) -> float:
    """A font size in points whose two lines, one per run, fit in one implementation's row of the chart."""
    row_px = fig.get_figheight() * fig.dpi * 0.7 / max(len(names), 1)  # the axes take about 0.7 of it
    return max(5.0, row_px / 2 * 72.0 / fig.dpi * 0.8)


def draw_message(text: str, fig: Figure) -> None:
    """A chart's place given to a sentence: what there is to do, or why nothing is drawn."""
    fig.clear()
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=10, wrap=True, transform=ax.transAxes)


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
