"""The table of every template against the baselines, and optionally its chart, from a committed result
file of bench_templates.py (docs/results/2026-11-23-templates-and-baselines.md shows one).

    python benchmarks/chart.py benchmarks/results/FILE.json [docs/benchmark.png]

The last two columns compare CellFuse's best schedule with the best of the GPU baselines (PyTorch eager
in a CUDA graph, torch.compile in either mode, cuDNN), whichever was fastest for that cell.
"""

from __future__ import annotations

import json
import sys

from matplotlib.figure import Figure

from cellfuse.codegen import SCHEDULES
from cellfuse.gpu_runtime.bench import BASELINES

GPU_BASELINES = [b for b in BASELINES if b != "numpy reference"]


def main(path: str, png: str | None) -> None:
    records = json.load(open(path))
    names = [*SCHEDULES, *GPU_BASELINES]
    print("| cell | " + " | ".join(names) + " | best vs naive | best baseline | best vs it |")
    print("|---" * (len(names) + 4) + "|")
    fig = Figure(figsize=(11, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(records)
    for i, rec in enumerate(records):
        ms = {r["name"]: r["median_ms"] for r in rec["results"] if r["ok"]}
        cells = [f"{ms[n]:.2f}" if n in ms else "-" for n in names]
        best = min(ms[n] for n in SCHEDULES if n in ms)
        rival = min((n for n in GPU_BASELINES if n in ms and n != "pytorch eager"), key=ms.get)
        print(f"| {rec['template']} | " + " | ".join(cells) + f" | {ms['naive'] / best:.1f}x | {rival} | "
              f"{ms[rival] / best:.2f}x |")
        xs = [j + i * width for j, n in enumerate(names) if n in ms]
        ax.bar(xs, [ms[n] for n in names if n in ms], width, label=rec["template"])
    labels = [n.replace(" ", "\n", 1) for n in names]  # "torch.compile\ndefault" fits under its bars
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per forward pass (median of 20, log scale)")
    s = records[0]["sizes"]
    ax.set_title(f"{records[0]['device']}, T={s['seq']} B={s['batch']} input={s['input']} "
                 f"hidden={s['hidden']}, float32", fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    if png:
        fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
