"""The README's table of the persistent, wavefront and tensor rungs, and its chart, from the record of
run_persistent.sh.

    python benchmarks/persistent_table.py benchmarks/results/FILE.json [docs/persistent.png]

Each row is one case of the record: the cuDNN baseline through PyTorch (or torch.compile, where the
cell has no cuDNN kernel), cuDNN's own persistent algorithms called directly (the faster of static and
dynamic, where cuDNN runs the size), the `graph`, `persistent`, `wavefront` and `tensor` rungs (a record
made before `tensor` existed has none), and the goal set for that case; "met" compares the best rung
with it.
"""

from __future__ import annotations

import json
import sys

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


def main(path: str, png: str | None) -> None:
    record = json.load(open(path))
    print("| case | baseline | cuDNN persistent | " + " | ".join(RUNGS) + " | goal | met |")
    print("|---|---|---|" + "---|" * len(RUNGS) + "---|---|")
    rows = []
    for case, (label, goal, baseline) in CASES.items():
        if case not in record["cases"]:
            continue
        ms = {r["name"]: r["median_ms"] for r in record["cases"][case]["results"] if r["ok"]}
        base = f"{baseline} {ms[baseline]:.3f}" if baseline in ms else "-"
        direct = min((ms[n] for n in CUDNN_PERSISTENT if n in ms), default=None)
        if direct is not None:
            ms["cudnn persistent"] = direct
        best = min(ms[r] for r in RUNGS if r in ms)
        met = "-" if goal is None else ("yes" if best <= goal else f"no, {best / goal:.2f}x the goal")
        print(f"| {label} | {base} | {_ms(direct)} | " + " | ".join(_ms(ms.get(r)) for r in RUNGS)
              + f" | {'-' if goal is None else f'{goal:g}'} | {met} |")
        rows.append((label, ms))
    if png:
        fig = Figure(figsize=(10, 5))
        ax = fig.subplots()
        names = ["cudnn", "torch.compile", "cudnn persistent", *RUNGS]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ys = [(j, ms[name]) for j, (_, ms) in enumerate(rows) if name in ms]
            ax.barh([j + i * width for j, _ in ys], [y for _, y in ys], width, label=name)
        ax.set_yticks([j + (len(names) - 1) / 2 * width for j in range(len(rows))],
                      [label for label, _ in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("ms per forward pass (median, log scale)")
        first = next(iter(record["cases"].values()))
        ax.set_title(f"{first['device']}, float32, T=100 and input=hidden=512 unless the row says",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
