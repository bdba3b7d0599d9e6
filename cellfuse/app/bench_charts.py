"""Benchmark charts on a matplotlib Figure: one run (gpu_runtime's plot_result), a sweep
(plot_sweep), or two runs side by side."""

from __future__ import annotations

from matplotlib.figure import Figure

from .bench_runs import BenchRun

RUN_COLORS = ("#3b7dd8", "#e08a2c")


def draw_run(run: BenchRun, fig: Figure) -> None:
    from ..gpu_runtime.plots import plot_result, plot_sweep

    if run.sweep is not None:
        plot_sweep(run.sweep, fig)
    else:
        plot_result(run.result, fig)


def draw_comparison(a: BenchRun, b: BenchRun, fig: Figure) -> None:
    """Median time of each implementation in run a and run b, as paired bars (log scale)."""
    fig.clear()
    ax = fig.subplots()
    ra, rb = a.first, b.first
    names: list[str] = []
    for r in (*ra.rows, *rb.rows):
        if r.name not in names:
            names.append(r.name)
    height = 0.38
    for k, (run, res) in enumerate(((a, ra), (b, rb))):
        ys, xs = [], []
        for i, name in enumerate(names):
            row = res.row(name)
            if row is not None and row.ok and row.median_ms:
                ys.append(i + (k - 0.5) * height)
                xs.append(row.median_ms)
        ax.barh(ys, xs, height=height, color=RUN_COLORS[k], label=run.label())
        for y, x in zip(ys, xs, strict=True):
            ax.text(x, y, f" {x:.3g}", va="center", fontsize=7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per forward pass (median)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"Run #{a.number} against run #{b.number}", fontsize=9)
    if "numpy" in (ra.backend, rb.backend):
        fig.text(0.5, 0.01, "numpy backend runs are CPU times of the Plan's numpy executor, not GPU times",
                 ha="center", fontsize=8, color="#b03030")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
