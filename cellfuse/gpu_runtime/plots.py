"""Charts of benchmark results, drawn with matplotlib on a Figure the caller owns (a PNG from the
command line, a canvas in the editor).

The charts take their text, edge and background colours from matplotlib's rcParams, so that a
caller can draw them light (a PNG) or dark (the editor) with `matplotlib.rc_context`. Layout is
matplotlib's constrained layout: it keeps the titles, tick labels and the footnote inside the figure
at any size the figure is given, where tight_layout gives up with a warning.
"""

from __future__ import annotations

import math

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from .bench import BenchResult, SweepResult

_SCHEDULE_COLOR = "#3b7dd8"
_BASELINE_COLOR = "#9a9a9a"
FOOTNOTE_COLOR = "#d0503c"  # readable on a light and on a dark background
LOG_RANGE = 100.0  # a time axis goes logarithmic only when its bars differ by more than this factor
VALUE_MARGIN = 1.22  # room right of the longest bar for its value label


def _title(result: BenchResult) -> str:
    s = result.sizes
    return (f"{result.cell}: T={s.seq}, B={s.batch}, input={s.input}, hidden={s.hidden}, "
            f"layers={s.layers}" + _mode(result) + f"\n{result.device}")


def _mode(result: BenchResult) -> str:
    """What a title says of how the implementations ran: in training, in a 16-bit precision."""
    return (", forward + backward" if result.train else "") + (
        f", in {result.precision}" if result.precision != "fp32" else "")


def _pass(train: bool) -> str:
    return "forward + backward pass" if train else "forward pass"


def ms_text(ms: float) -> str:
    """A time in ms as people write it: 1970 -> '1970', 12.34 -> '12.3', 0.01234 -> '0.0123'."""
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.3g}"


def needs_log_scale(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_RANGE


def log_x(ax, low: float, high: float, margin: float = VALUE_MARGIN) -> None:
    """A logarithmic x axis from `low` past `high`, leaving right of `high` the share of the width that
    `high * margin` leaves on a linear axis from zero: room for the value written there."""
    ax.set_xscale("log")
    ax.set_xlim(low, high * (high / low) ** (margin - 1.0))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def time_axis(ax, times: list[float], label: str) -> None:
    """A linear axis from zero, or a logarithmic one when the range demands it; the label says which."""
    if not times:
        return
    if needs_log_scale(times):
        # From a power of ten at least half the shortest time below it, so that no bar is empty.
        log_x(ax, 10.0 ** math.floor(math.log10(min(times) / 2.0)), max(times))
        ax.set_xlabel(f"{label} (log scale)")
    else:
        ax.set_xlim(0.0, max(times) * VALUE_MARGIN)
        ax.set_xlabel(label)


def _footnote(fig: Figure, text: str) -> None:
    # The figure's x label is the one place below the axes that constrained layout keeps room for.
    fig.supxlabel(text, fontsize=8, color=FOOTNOTE_COLOR)


def plot_result(result: BenchResult, fig: Figure) -> None:
    """Time per implementation and speedup over `naive`, for the rows that were timed."""
    fig.clear()
    fig.set_layout_engine("constrained")
    rows = [r for r in result.rows if r.ok and r.median_ms is not None]
    ax_time, ax_speed = fig.subplots(1, 2, width_ratios=(3, 2))
    fig.suptitle(_title(result), fontsize=9)
    if result.backend == "numpy":
        _footnote(fig, "numpy backend, no GPU: CPU times of the Plan's numpy executor, not GPU times")
    if not rows:
        ax_time.text(0.5, 0.5, "nothing was timed", ha="center", va="center", transform=ax_time.transAxes)
        ax_speed.axis("off")
        return
    names = [r.name for r in rows]
    colors = [_SCHEDULE_COLOR if r.kind == "schedule" else _BASELINE_COLOR for r in rows]
    times = [r.median_ms for r in rows]
    ax_time.barh(names, times, color=colors)
    ax_time.invert_yaxis()
    time_axis(ax_time, times, f"ms per {_pass(result.train)} (median)")
    for i, t in enumerate(times):
        ax_time.text(t, i, f" {ms_text(t)}", va="center", fontsize=7)
    naive = result.row("naive")
    if naive and naive.ok and naive.median_ms:
        speed = [naive.median_ms / t for t in times]
        ax_speed.barh(names, speed, color=colors)
        ax_speed.invert_yaxis()
        ax_speed.axvline(1.0, color=matplotlib.rcParams["axes.edgecolor"], lw=0.8)
        ax_speed.set_xlim(0.0, max(speed) * VALUE_MARGIN)
        ax_speed.set_xlabel("speedup over naive")
        for i, v in enumerate(speed):
            ax_speed.text(v, i, f" {v:.1f}x", va="center", fontsize=7)
        ax_speed.set_yticklabels([])
    else:
        ax_speed.axis("off")
        ax_speed.text(0.5, 0.5, "naive was not timed", ha="center", va="center", transform=ax_speed.transAxes)


def plot_sweep(sweep: SweepResult, fig: Figure) -> None:
    """One curve per implementation: time against the swept size, ticked at the swept values. Schedules
    are solid lines, baselines dashed, each implementation in a colour of its own."""
    fig.clear()
    fig.set_layout_engine("constrained")
    ax = fig.subplots()
    names: list[str] = []
    kinds: dict[str, str] = {}
    for res in sweep.results:
        for r in res.rows:
            if r.name not in names:
                names.append(r.name)
                kinds[r.name] = r.kind
    palette = matplotlib.colormaps["tab20"]
    for i, name in enumerate(names):
        xs, ys = [], []
        for v, res in zip(sweep.values, sweep.results, strict=False):
            row = res.row(name)
            if row and row.ok and row.median_ms:
                xs.append(v)
                ys.append(row.median_ms)
        if xs:
            ax.plot(xs, ys, marker="o", label=name, color=palette(i % 20),
                    linestyle="-" if kinds[name] == "schedule" else "--")
    values = [v for v in sweep.values if v > 0]
    log = bool(values) and max(values) >= 4 * min(values)  # sizes doubling; a narrow range reads linearly
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sweep.values, [str(v) for v in sweep.values])
    if len(sweep.values) > 4 or max((len(str(v)) for v in sweep.values), default=0) > 4:
        # many or long labels run together side by side ("8000100001200014000016000"): slanted, they do not
        ax.tick_params(axis="x", labelrotation=40)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"{sweep.param} (log scale)" if log else sweep.param)
    train = any(r.train for r in sweep.results)
    ax.set_ylabel(f"ms per {_pass(train)}\n(median, log scale)")  # two lines: a short chart cuts one
    if ax.lines:
        fig.legend(fontsize=7, loc="outside right upper")
    if sweep.results:
        first = sweep.results[0]
        fig.suptitle(f"{first.cell}: scaling with {sweep.param}{_mode(first)}\n{first.device}", fontsize=9)
