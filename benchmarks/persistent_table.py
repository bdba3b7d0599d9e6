"""The README's table of the persistent, wavefront and tensor rungs, and its chart, from records of
run_persistent.sh (or of some of its cases).

    python benchmarks/persistent_table.py RECORD.json [RECORD.json ...] [--png docs/persistent.png]

Each row is one case, from the last record given that has it (its commit, from the record's file name,
in the "run" column): the cuDNN baseline through PyTorch (or torch.compile, where the
cell has no cuDNN kernel), cuDNN's own persistent algorithms called directly (the faster of static and
dynamic, where cuDNN runs the size), the `graph`, `persistent`, `wavefront` and `tensor` rungs (a record
made before `tensor` existed has none), and the goal set for that case; "met" compares the best rung
with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure

# case -> (what the row says, the goal in ms, the baseline it is compared with)
CASES = {
    "lstm_B1": ("LSTM B=1", 0.13, "cudnn"),
    "lstm_B8": ("LSTM B=8", 0.30, "cudnn"),
    "lstm_B64": ("LSTM B=64", 1.0, "cudnn"),
    "lstm_B256": ("LSTM B=256", None, "cudnn"),
    "lstm_T1000_B8": ("LSTM T=1000 B=8", 3.0, "cudnn"),
    "lstm_B64_L4": ("LSTM B=64, 4 layers", 3.0, "cudnn"),
    "lstm_B8_L4": ("LSTM B=8, 4 layers", None, "cudnn"),
    "lstm_H1024_B8": ("LSTM H=1024 B=8", None, "cudnn"),
    "lstm_H1024_B64": ("LSTM H=1024 B=64", None, "cudnn"),
    "gru_B1": ("GRU B=1", 0.13, "cudnn"),
    "gru_B64": ("GRU B=64", 1.0, "cudnn"),
    "mgu_B64": ("MGU B=64", 1.3, None),
    "gru_cho_B64": ("Cho GRU B=64", 1.3, None),
    "gru_cho_B64_L3": ("Cho GRU B=64, 3 layers", None, None),
    "indrnn_B64": ("IndRNN B=64", 0.05, None),
    "peephole_lstm_B64": ("peephole LSTM B=64", 0.9, "torch.compile"),
}
RUNGS = ("graph", "persistent", "wavefront", "tensor")
CUDNN_PERSISTENT = ("cudnn persistent static", "cudnn persistent dynamic")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(paths: list[str], png: str | None) -> None:
    cases, run = {}, {}
    for path in paths:
        record = json.load(open(path))
        cases.update(record["cases"])
        run.update(dict.fromkeys(record["cases"], Path(path).stem.rsplit("_", 1)[-1]))
    print("| case | run | baseline | cuDNN persistent | " + " | ".join(RUNGS) + " | goal | met |")
    print("|---|---|---|---|" + "---|" * len(RUNGS) + "---|---|")
    rows = []
    for case, (label, goal, baseline) in CASES.items():
        if case not in cases:
            continue
        ms = {r["name"]: r["median_ms"] for r in cases[case]["results"] if r["ok"]}
        base = f"{baseline} {ms[baseline]:.3f}" if baseline in ms else "-"
        direct = min((ms[n] for n in CUDNN_PERSISTENT if n in ms), default=None)
        if direct is not None:
            ms["cudnn persistent"] = direct
        best = min(ms[r] for r in RUNGS if r in ms)
        met = "-" if goal is None else ("yes" if best <= goal else f"no, {best / goal:.2f}x the goal")
        rungs = " | ".join(_ms(ms.get(r)) for r in RUNGS)
        print(f"| {label} | {run[case]} | {base} | {_ms(direct)} | {rungs} | "
              f"{'-' if goal is None else f'{goal:g}'} | {met} |")
        rows.append((label, ms))
    if png:
        fig = Figure(figsize=(10, 5))
        ax = fig.subplots()
        names = ["cudnn", "torch.compile", "cudnn persistent", *RUNGS]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ys = [(j, ms[name]) for j, (_, ms) in enumerate(rows) if name in ms]
            if ys:  # each its own color, and no legend entry for a rung none of the cases ran
                ax.barh([j + i * width for j, _ in ys], [y for _, y in ys], width, label=name, color=f"C{i}")
        ax.set_yticks([j + (len(names) - 1) / 2 * width for j in range(len(rows))],
                      [label for label, _ in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("ms per forward pass (median, log scale)")
        first = next(iter(cases.values()))
        ax.set_title(f"{first['device']}, float32, T=100 and input=hidden=512 unless the row says",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(png, dpi=110)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+")
    parser.add_argument("--png")
    args = parser.parse_args()
    main(args.records, args.png)
