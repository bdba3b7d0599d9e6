"""Charts of benchmark results, drawn with matplotlib on a Figure the caller owns (a PNG from the
command line, a canvas in the editor)."""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from .bench import BenchResult, SweepResult

_SCHEDULE_COLOR = "#3b7dd8"
_BASELINE_COLOR = "#9a9a9a"


def _title(result: BenchResult) -> str:
    s = result.sizes
    return (f"{result.cell}: T={s.seq}, B={s.batch}, input={s.input}, hidden={s.hidden}, "
            f"layers={s.layers}\n{result.device}")


def plot_result(result: BenchResult, fig: Figure) -> None:
    """Time per implementation (log scale) and speedup over `naive`, for the rows that were timed."""
    fig.clear()
    rows = [r for r in result.rows if r.ok and r.median_ms is not None]
    ax_time, ax_speed = fig.subplots(1, 2)
    fig.suptitle(_title(result), fontsize=9)
    if not rows:
        ax_time.text(0.5, 0.5, "nothing was timed", ha="center", va="center", transform=ax_time.transAxes)
        return
    names = [r.name for r in rows]
    colors = [_SCHEDULE_COLOR if r.kind == "schedule" else _BASELINE_COLOR for r in rows]
    times = [r.median_ms for r in rows]
    ax_time.barh(names, times, color=colors)
    ax_time.set_xscale("log")
    ax_time.invert_yaxis()
    ax_time.set_xlabel("ms per forward pass (median)")
    for i, t in enumerate(times):
        ax_time.text(t, i, f" {t:.3g}", va="center", fontsize=7)
    naive = result.row("naive")
    if naive and naive.ok and naive.median_ms:
        speed = [naive.median_ms / t for t in times]
        ax_speed.barh(names, speed, color=colors)
        ax_speed.invert_yaxis()
        ax_speed.axvline(1.0, color="black", lw=0.8)
        ax_speed.set_xlabel("speedup over naive")
        for i, v in enumerate(speed):
            ax_speed.text(v, i, f" {v:.1f}x", va="center", fontsize=7)
        ax_speed.set_yticklabels([])
    else:
        ax_speed.text(0.5, 0.5, "naive was not timed", ha="center", va="center", transform=ax_speed.transAxes)
    if result.backend == "numpy":
        fig.text(0.5, 0.01, "numpy backend, no GPU: these are CPU times of the Plan's numpy executor, "
                 "not GPU times", ha="center", fontsize=8, color="#b03030")
    fig.tight_layout(rect=(0, 0.04, 1, 0.92))


def plot_sweep(sweep: SweepResult, fig: Figure) -> None:
    """One curve per implementation: time against the swept size, ticked at the swept values. Schedules
    are solid lines, baselines dashed, each implementation in a colour of its own."""
    fig.clear()
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
    ax.set_xscale("log", base=2)
    ax.set_xticks(sweep.values, [str(v) for v in sweep.values])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel(f"{sweep.param} (log scale)")
    ax.set_ylabel("ms per forward pass (median, log scale)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if sweep.results:
        ax.set_title(f"{sweep.results[0].cell}: scaling with {sweep.param}\n{sweep.results[0].device}",
                     fontsize=9)
    fig.tight_layout()
