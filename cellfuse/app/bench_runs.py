"""The benchmark runs made since the window opened, and their numbers as table rows.

Plain data: a run holds a BenchResult or a SweepResult of cellfuse.gpu_runtime.bench; the panel
lists runs, shows one, or compares two. A run times the forward pass or training (forward + backward):
its label and its table's headers say which, and two runs are compared only when they time the same. A run
whose batch rows each ran to a length of their own (BenchConfig.lengths) says so, with the lengths drawn,
and is compared only with another such run. A run of both directions of the layer
(BenchConfig.bidirectional) says so in its label, which is all that tells it from a run of one direction
at the same sizes. A run in bf16 or fp16 (BenchConfig.precision) names its precision in its label; runs of
different precisions compare (that is what the precision is for), each then named with its own, fp32 too.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..codegen.precision import forward_tolerance, gradient_tolerance
from ..gpu_runtime.bench import BASELINES

COLUMNS = ["Implementation", "Kind", "Median ms", "Min ms", "Max ms", "Rel. error", "Compile s",
           "Launches/step", "Note"]
# The headers that change in training: the times are of forward + backward, the error is the gradients'.
TRAIN_COLUMNS = {"Median ms": "Median ms, fwd+bwd", "Rel. error": "Grad. rel. error"}
TableRow = tuple[list[str], bool | None]  # cells, and ok: True, False (wrong or failed), None (not run)
# A time whose repeats spread wider than this share of their median is noisy: a speedup or a ratio of it
# may be the noise (the numpy backend's repeats of one schedule ranged from 4 s to 13 s on a busy CPU).
NOISY_SPREAD = 0.5
NOISY = "noisy"
BOTH_DIRECTIONS = "both directions"


@dataclass
class BenchRun:
    number: int
    result: Any = None  # BenchResult
    sweep: Any = None  # SweepResult
    started: dt.datetime = field(default_factory=dt.datetime.now)
    unavailable: dict[str, str] = field(default_factory=dict)  # baseline ticked but not run -> why

    @property
    def results(self) -> list[Any]:
        return list(self.sweep.results) if self.sweep is not None else [self.result]

    @property
    def first(self) -> Any:
        return self.results[0] if self.results else None

    @property
    def train(self) -> bool:
        """Whether the run timed training (forward + backward) rather than the forward pass."""
        return bool(self.first is not None and self.first.train)

    @property
    def bidirectional(self) -> bool:
        """Whether the run timed both directions of the layer side by side."""
        return bool(self.first is not None and self.first.bidirectional)

    def directions_text(self) -> str:
        """'both directions of the layer side by side, each with weights of its own', or '' for one."""
        if not self.bidirectional:
            return ""
        return f"{BOTH_DIRECTIONS} of the layer side by side, each with weights of its own"

    @property
    def precision(self) -> str:
        """What the run's plans were made in and its baselines ran in: fp32, bf16 or fp16."""
        return str(getattr(self.first, "precision", "fp32") or "fp32")

    def precision_text(self) -> str:
        """'in bf16: stored in 16 bits, multiplied on tensor cores into float32, ...', or '' for fp32."""
        if self.precision == "fp32":
            return ""
        if self.train:
            return (f"in {self.precision}: stored in 16 bits and multiplied on tensor cores into float32, "
                    "the gradients float32; each result's gradients checked against the float64 reference "
                    f"within {gradient_tolerance(self.precision):.1e} of each one's largest value")
        return (f"in {self.precision}: stored in 16 bits and multiplied on tensor cores into float32; each "
                "result checked against the float64 reference within "
                f"{forward_tolerance(self.precision):.1e} of its largest value")

    def measures(self) -> str:
        return "forward + backward" if self.train else "forward"

    @property
    def lengths(self) -> list[int] | None:
        """The batch rows' own lengths, each run's of a sweep together; None where every row ran all T
        steps."""
        drawn = [n for r in self.results for n in (getattr(r, "lengths", None) or [])]
        return drawn or None

    def lengths_range(self) -> str:
        """'2–6' for a run with lengths, else ''."""
        drawn = self.lengths
        return f"{min(drawn)}–{max(drawn)}" if drawn else ""

    def lengths_text(self) -> str:
        """'each batch row ran to its own length: 2–6 steps, mean 4.3, of T=6', or '' where every row ran
        all T steps."""
        drawn = self.lengths
        if not drawn:
            return ""
        of = "" if self.sweep is not None else f", of T={self.first.sizes.seq}"
        return (f"each batch row ran to its own length: {self.lengths_range()} steps, "
                f"mean {sum(drawn) / len(drawn):.1f}{of}")

    def label(self, precision: bool = False) -> str:
        """'#2 LSTM · numpy · bf16 · T6 B3 in8 h8 L1 · 12:00:00': the precision where it is not fp32, or
        always with `precision` (beside a run of another precision)."""
        r = self.first
        if r is None:
            return f"#{self.number} (empty)"
        s = r.sizes
        what = (f"sweep {self.sweep.param} = {', '.join(map(str, self.sweep.values))}" if self.sweep
                else f"T{s.seq} B{s.batch} in{s.input} h{s.hidden} L{s.layers}")
        stop = " · cancelled" if any(x.cancelled for x in self.results) else ""
        mode = " · training" if self.train else ""
        mode += f" · {self.precision}" if precision or self.precision != "fp32" else ""
        directions = f" · {BOTH_DIRECTIONS}" if self.bidirectional else ""
        lengths = f" · lengths {self.lengths_range()}" if self.lengths else ""
        return (f"#{self.number} {r.cell} · {r.backend}{mode} · {what}{directions}{lengths} · "
                f"{self.started:%H:%M:%S}{stop}")

    def to_json(self) -> dict:
        return self.sweep.to_json() if self.sweep is not None else self.result.to_json()

    def to_csv(self) -> str:
        return self.sweep.to_csv() if self.sweep is not None else self.result.to_csv()


def result_columns(train: bool) -> list[str]:
    """The results table's headers for a forward run or a training run."""
    return [TRAIN_COLUMNS.get(c, c) if train else c for c in COLUMNS]


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def noisy(row: Any) -> bool:
    """Whether a row's repeated times spread too far around their median to be read to two digits."""
    if row is None or not row.ok or not row.median_ms or row.min_ms is None or row.max_ms is None:
        return False
    return (row.max_ms - row.min_ms) / row.median_ms > NOISY_SPREAD


def noise_note(row: Any) -> str:
    """'noisy: 4120–13400 ms' for a noisy row, else ''."""
    return f"{NOISY}: {_ms(row.min_ms)}–{_ms(row.max_ms)} ms" if noisy(row) else ""


def result_rows(result: Any, unavailable: dict[str, str] | None = None) -> list[TableRow]:
    """(cells, ok) for each row of a BenchResult, in COLUMNS order, then the baselines not run; ok is None
    for a baseline that does not apply (cuDNN refusing a size, say). A noisy time says so in the note."""
    out: list[TableRow] = []
    for r in result.rows:
        err = "" if r.rel_error is None else ("inf" if r.rel_error == float("inf") else f"{r.rel_error:.1e}")
        note = "; ".join(n for n in (noise_note(r), r.note) if n)
        out.append(([r.name, r.kind, _ms(r.median_ms), _ms(r.min_ms), _ms(r.max_ms), err,
                     "" if r.compile_s is None else f"{r.compile_s:.2f}",
                     "" if getattr(r, "launches_per_step", None) is None else str(r.launches_per_step),
                     note], bool(r.ok) if getattr(r, "applicable", True) else None))
    for name, why in (unavailable or {}).items():  # a baseline not here, a schedule not in this precision
        kind = "baseline" if name in BASELINES else "schedule"
        out.append(([name, kind, "", "", "", "", "", "", why], None))
    return out


def implementations(a: BenchRun, b: BenchRun) -> list[str]:
    """The implementations of two single runs, in the order they first appear."""
    names: list[str] = []
    for r in (*a.first.rows, *b.first.rows):
        if r.name not in names:
            names.append(r.name)
    return names


def median_ms(run: BenchRun, name: str) -> float | None:
    """The median time of an implementation in a single run, None where it was not timed (or wrong)."""
    row = run.first.row(name)
    return row.median_ms if row is not None and row.ok and row.median_ms else None


def ratio_text(ratio: float) -> str:
    """A ratio of two times, to three digits at most past 10: 0.86×, 11.5×, 145×."""
    return f"{ratio:.0f}×" if ratio >= 100 else f"{ratio:.1f}×" if ratio >= 10 else f"{ratio:.2f}×"


def comparison_refusal(a: BenchRun, b: BenchRun) -> str | None:
    """Why two runs cannot be compared, or None: a forward time beside a forward + backward time would
    read as a slowdown that is only the backward pass; a sweep is a curve of times, not one time per
    implementation; a run whose rows stopped at their own lengths did less work, and work of another
    kind (the cell rewritten to stop them), than one whose rows all ran T steps."""
    if a.sweep is not None or b.sweep is not None:
        sweeps = [f"#{r.number}" for r in (a, b) if r.sweep is not None]
        return (f"Run {' and '.join(sweeps)} {'is a sweep' if len(sweeps) == 1 else 'are sweeps'}: a sweep's "
                "times are a curve, not one time per implementation. Select two runs without a sweep.")
    if a.train != b.train:
        return (f"Run #{a.number} times {a.measures()} and run #{b.number} {b.measures()}: their times do "
                "not compare. Select two forward runs or two training runs.")
    if bool(a.lengths) != bool(b.lengths):
        def runs(r: BenchRun) -> str:
            return (f"each batch row to its own length ({r.lengths_range()} steps)" if r.lengths
                    else "every batch row all T steps")

        return (f"Run #{a.number} runs {runs(a)} and run #{b.number} {runs(b)}: their times do not compare. "
                "Select two runs with sequence lengths or two runs without.")
    return None


def ratio_noisy(a: BenchRun, b: BenchRun, name: str) -> bool:
    """Whether the ratio of an implementation's times in two runs rests on a noisy time."""
    return noisy(a.first.row(name)) or noisy(b.first.row(name))


def precisions_differ(a: BenchRun, b: BenchRun) -> bool:
    """Whether two runs ran in different precisions: each is then named with its own, fp32 too."""
    return a.precision != b.precision


def comparison_rows(a: BenchRun, b: BenchRun) -> tuple[list[str], list[TableRow]]:
    """Columns and rows comparing the median times of two single runs, implementation by implementation;
    where they ran in different precisions, each run's column names its own."""
    if why := comparison_refusal(a, b):
        raise ValueError(why)
    ms = "ms, fwd+bwd" if a.train else "ms"

    def time_column(run: BenchRun) -> str:
        return f"#{run.number} {ms}, {run.precision}" if precisions_differ(a, b) else f"#{run.number} {ms}"

    columns = ["Implementation", time_column(a), time_column(b), f"#{b.number} / #{a.number}"]
    rows = []
    for name in implementations(a, b):
        tx, ty = median_ms(a, name), median_ms(b, name)
        ratio = ratio_text(ty / tx) if tx and ty else ""
        if ratio and ratio_noisy(a, b, name):
            ratio += f" ({NOISY})"
        rows.append(([name, _ms(tx), _ms(ty), ratio], tx is not None and ty is not None))
    return columns, rows
