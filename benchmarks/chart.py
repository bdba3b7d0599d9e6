"""The README's table, and optionally its chart, from a committed result file of bench_templates.py.

    python benchmarks/chart.py benchmarks/results/FILE.json [docs/benchmark.png]
"""

from __future__ import annotations

import json
import sys

from matplotlib.figure import Figure

from cellfuse.codegen import SCHEDULES


def main(path: str, png: str | None) -> None:
    records = json.load(open(path))
    names = [*SCHEDULES, "pytorch eager", "pytorch graph", "torch.compile", "cudnn"]
    print("| cell | " + " | ".join(names) + " | best vs naive |")
    print("|---" * (len(names) + 2) + "|")
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(records)
    for i, rec in enumerate(records):
        ms = {r["name"]: r["median_ms"] for r in rec["results"] if r["ok"]}
        cells = [f"{ms[n]:.2f}" if n in ms else "-" for n in names]
        best = min(ms[n] for n in SCHEDULES if n in ms)
        print(f"| {rec['template']} | " + " | ".join(cells) + f" | {ms['naive'] / best:.1f}x |")
        xs = [j + i * width for j, n in enumerate(names) if n in ms]
        ax.bar(xs, [ms[n] for n in names if n in ms], width, label=rec["template"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per forward pass (median of 20)")
    s = records[0]["sizes"]
    ax.set_title(f"{records[0]['device']}, T={s['seq']} B={s['batch']} input={s['input']} "
                 f"hidden={s['hidden']}, float32", fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    if png:
        fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
