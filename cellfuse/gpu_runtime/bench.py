"""The benchmark: every schedule of a cell and every available baseline, each checked against the
reference interpreter before it is timed. The command line and the editor both call `run_benchmark`.

With `BenchConfig.train`, each implementation runs forward + backward: the gradients of sum(dy * y), for a
fixed random dy, with respect to x, the initial states and every parameter, checked against the float64
reference's (`run_reference_backward`; where the reference passes within rounding of a kink, along its
other branch too: see `graph_model.kinks`) before they are timed. A schedule's forward Plan saves its
steps and its backward Plan runs after it (a persistent forward pass with the graph rung's backward
machinery); the baselines run with autograd."""

from __future__ import annotations

import csv
import gc
import io
import itertools
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property

import numpy as np

from .. import __version__
from ..codegen import SCHEDULES, Plan, make_plan
from ..codegen.plan import H100, Target
from ..codegen.precision import (
    PRECISIONS,
    Float32Only,
    check_precision,
    forward_tolerance,
    gradient_floor,
    gradient_tolerance,
)
from ..codegen.roofline import Peaks, roofline
from ..graph_model import (
    Cell,
    CellError,
    Forward,
    Gradients,
    Sizes,
    Tape,
    backward,
    check_sizes,
    init_params,
    record_forward,
    run_reference,
)
from ..graph_model.kinks import Kink, near_kinks, other_branch
from ..graph_model.lengths import STEPS_LEFT, masked
from .cudnn_persistent import ALGORITHM_NAMES, CudnnPersistentRNN, CudnnRefused, unavailable_reason
from .cudnn_persistent import ALGORITHMS as CUDNN_PERSISTENT
from .directions import Directions
from .torch_baselines import COMPILE_MODES, FLASHRNN, SRU_PACKAGE

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # relative error allowed in float32 (a forward pass's: precision.forward_tolerance)
MOST_KINKS = 3  # of the kinks the reference passes within rounding of, the nearest whose branches count
BASELINES = ("numpy reference", "pytorch eager", "pytorch graph", "torch.compile", "torch.compile default",
             "cudnn", *CUDNN_PERSISTENT, SRU_PACKAGE, FLASHRNN)
BASELINE_NOTES = {
    "pytorch eager": "the cell op by op in PyTorch, step by step",
    "pytorch graph": "the same, captured once into a CUDA graph and replayed",
    "torch.compile": "the whole forward (every step and layer; shared-operand matmuls stacked, input "
                     "projections before the loop) under torch.compile, mode 'reduce-overhead' (CUDA graphs)",
    "torch.compile default": "the same whole forward under torch.compile in its default mode",
    "cudnn": "torch.nn.LSTM / torch.nn.GRU with the same weights",
    **{name: f"cuDNN's {ALGORITHM_NAMES[algo]} with the same weights, through cuDNN's C API"
       for name, algo in CUDNN_PERSISTENT.items()},
    SRU_PACKAGE: "the sru package's SRU (its own fused CUDA kernel) with the same weights",
    FLASHRNN: "FlashRNN's LSTM (the flashrnn package's fused CUDA kernel) with the same weights, the input "
              "projection by torch's matmul",
}
# The baselines that run in training mode: the captured forward pass and cuDNN's persistent algorithms
# through its C API are forward only.
TRAIN_NOTES = {
    "numpy reference": "float64 on the CPU, forward + backward, one run",
    "pytorch eager": "the cell op by op in PyTorch, step by step, with autograd",
    "torch.compile": "the whole forward under torch.compile, mode 'reduce-overhead' (CUDA graphs), and "
                     "its backward by autograd",
    "torch.compile default": "the same whole forward under torch.compile in its default mode, with autograd",
    "cudnn": "torch.nn.LSTM / torch.nn.GRU with the same weights, with autograd",
    SRU_PACKAGE: "the sru package's SRU with the same weights, its own forward and backward CUDA kernels",
}
TRAIN_BASELINES = tuple(TRAIN_NOTES)  # the baselines that have a backward pass
# The baselines that run in a 16-bit precision, as PyTorch's mixed precision runs them (the note's {} is
# the torch type): cuDNN's RNN with its module and inputs in fp16 (in bf16 torch would copy its weights at
# every call), PyTorch's own programs under autocast. The others run in float32 only so far.
AUTOCAST = ("pytorch eager", "pytorch graph", *COMPILE_MODES)
SIXTEEN_BIT_NOTES = {"cudnn": "its module and inputs in {}", FLASHRNN: "its weights and inputs in {}",
                     **dict.fromkeys(CUDNN_PERSISTENT, "its weights and inputs in {}, on tensor cores "
                                                       "into float32"),
                     **dict.fromkeys(AUTOCAST, "under torch.autocast to {}, its weights float32")}
MEASURES = {False: "forward", True: "forward + backward (the gradients of x, the initial states and every "
                                    "parameter for a fixed random dy)"}
ROUNDS = 5  # timing rounds, each taking every implementation in turn

Progress = Callable[[int, int, str], None]


class BenchCancelled(Exception):
    pass


@dataclass
class BenchConfig:
    sizes: Sizes
    backend: str = "auto"  # "numpy", "cuda", or "auto": cuda where it can run, else numpy
    schedules: list[str] = field(default_factory=lambda: list(SCHEDULES))
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    repeats: int = 20
    warmup: int = 3
    seed: int = 0
    train: bool = False  # forward + backward (a training record) instead of forward only
    # each batch row to a length of its own, drawn as "uniform:LOW-HIGH" says (see draw_lengths)
    lengths: str | None = None
    # both directions of the layer side by side, each with weights of its own (see directions.py)
    bidirectional: bool = False
    # what every plan is made in and every baseline runs in (codegen.precision.PRECISIONS)
    precision: str = "fp32"


def draw_lengths(spec: str, seq: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    """`batch` lengths drawn uniformly from LOW to HIGH (both included) as "uniform:LOW-HIGH" says, each
    from 1 to `seq`; a CellError naming the spec where it is not one."""
    kind, _, bounds = spec.partition(":")
    low, _, high = bounds.partition("-")
    if kind != "uniform" or not low.isdigit() or not high.isdigit():
        raise CellError(f"--lengths {spec}: expected uniform:LOW-HIGH, such as uniform:10-{seq}")
    low_n, high_n = int(low), int(high)
    if not 1 <= low_n <= high_n <= seq:
        raise CellError(f"--lengths {spec}: the lengths must go from at least 1 to at most the sequence's "
                        f"length {seq}, LOW no more than HIGH")
    return rng.integers(low_n, high_n + 1, size=batch)


@dataclass
class BenchRow:
    name: str
    kind: str  # "schedule" or "baseline"
    ok: bool
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    rel_error: float | None = None
    compile_s: float | None = None
    launches_per_step: int | None = None
    note: str = ""
    # False for a baseline that does not run here or at these sizes (said in the note): not a failure
    applicable: bool = True
    # of a schedule on a GPU: the times its arithmetic, bytes and synchronisation alone would take there,
    # and the least of their sum (roofline.Roofline.to_json), in ms
    roofline: dict[str, float] | None = None


@dataclass
class BenchResult:
    cell: str
    cell_hash: str
    sizes: Sizes
    backend: str
    device: str
    date: str
    versions: dict[str, str]
    rows: list[BenchRow] = field(default_factory=list)
    cancelled: bool = False
    timing: str = ""
    train: bool = False  # the times are of forward + backward
    # what was asked for that does not run: baselines not here, schedules not in this precision; why
    left_out: dict[str, str] = field(default_factory=dict)
    seed: int = 0  # of the weights and inputs (see BenchConfig)
    lengths: list[int] | None = None  # each batch row's, where they were drawn (BenchConfig.lengths)
    bidirectional: bool = False  # both directions of the layer, side by side (BenchConfig.bidirectional)
    precision: str = "fp32"  # of every schedule and baseline (BenchConfig.precision)

    def row(self, name: str) -> BenchRow | None:
        return next((r for r in self.rows if r.name == name), None)

    def best_schedule(self) -> BenchRow | None:
        """The fastest schedule that gave the right answer: the rung to use at these sizes."""
        timed = [r for r in self.rows if r.kind == "schedule" and r.ok and r.median_ms is not None]
        return min(timed, key=lambda r: r.median_ms, default=None)

    def to_json(self) -> dict:
        return {"cell": self.cell, "cell_hash": self.cell_hash, "sizes": asdict(self.sizes),
                "backend": self.backend, "device": self.device, "date": self.date, "versions": self.versions,
                "train": self.train, "measures": MEASURES[self.train], "timing": self.timing,
                "cancelled": self.cancelled, "results": [asdict(r) for r in self.rows],
                "left_out": self.left_out, "seed": self.seed, "lengths": self.lengths,
                "bidirectional": self.bidirectional, "precision": self.precision,
                "best_schedule": best.name if (best := self.best_schedule()) else None}

    def to_csv(self) -> str:
        """A row per implementation; the roofline's times in columns of their own (roofline_bound_ms, ...)."""
        buf = io.StringIO()
        names = [n for n in BenchRow("", "", False).__dict__ if n != "roofline"]
        parts = [f"roofline_{k}" for k in ("arithmetic_ms", "memory_ms", "sync_ms", "bound_ms")]
        writer = csv.DictWriter(buf, fieldnames=["cell", "device", "precision", *names, *parts])
        writer.writeheader()
        for r in self.rows:
            row = asdict(r)
            roof = row.pop("roofline") or {}
            writer.writerow({"cell": self.cell, "device": self.device, "precision": self.precision, **row,
                             **{f"roofline_{k}": v for k, v in roof.items()}})
        return buf.getvalue()


@dataclass
class SweepResult:
    param: str
    values: list[int]
    results: list[BenchResult]

    def to_json(self) -> dict:
        return {"param": self.param, "values": self.values, "results": [r.to_json() for r in self.results]}

    def to_csv(self) -> str:
        """Every result's rows in one table, the swept value in the first column."""
        lines: list[str] = []
        for value, res in zip(self.values, self.results, strict=False):
            header, *rows = res.to_csv().splitlines()
            lines += [] if lines else [f"{self.param},{header}"]
            lines += [f"{value},{row}" for row in rows]
        return "\n".join(lines) + "\n"


def available_backends() -> list[str]:
    """"numpy" always; "cuda" where PyCUDA, nvmath-python and a GPU are present."""
    from .cuda_executor import GpuUnavailable, gpu_modules

    try:
        gpu_modules()
    except GpuUnavailable:
        return ["numpy"]
    return ["numpy", "cuda"]


def _worst_relative(pairs, floor: float = 0.0) -> float:
    """The largest over (got, want) pairs of the largest absolute error relative to want's largest value,
    or to `floor` where that is more; infinite where got is missing, of another shape, or not finite."""
    worst = 0.0
    for got, want in pairs:
        if got is None or got.shape != want.shape or not np.all(np.isfinite(got)):
            return float("inf")
        scale = max(float(np.max(np.abs(want), initial=0.0)), floor, 1e-30)
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)) / scale)
    return worst


def _rel_error(result: Forward, ref: Forward) -> float:
    """The largest absolute error over y and the final states, relative to the largest value."""
    return _worst_relative([(result.y, ref.y)] + [(result.final[s], v) for s, v in ref.final.items()
                                                  if s in result.final])


def largest_gradient(g: Gradients) -> float:
    """The largest magnitude over every gradient (of x, each initial state, each parameter)."""
    every = (g.dx, *g.dinitial.values(), *g.dparams.values())
    return max(float(np.max(np.abs(v), initial=0.0)) for v in every)


def _grad_error(got: Gradients, ref: Gradients, precision: str = "fp32") -> float:
    """The largest over every gradient (of x, each initial state, each parameter) of its largest absolute
    error relative to its own largest value (or precision.gradient_floor times the largest of all
    gradients); infinite for a gradient missing or not finite."""
    return _worst_relative([(got.dx, ref.dx), *((got.dinitial.get(s), v) for s, v in ref.dinitial.items()),
                            *((got.dparams.get(k), v) for k, v in ref.dparams.items())],
                           gradient_floor(precision) * largest_gradient(ref))


def _stats(times_ms: list[float]) -> dict:
    return {"median_ms": statistics.median(times_ms), "min_ms": min(times_ms), "max_ms": max(times_ms)}


def _versions() -> dict[str, str]:
    out = {"cellfuse": __version__, "python": platform.python_version(), "numpy": np.__version__}
    for mod, attr in (("torch", "__version__"), ("pycuda", "VERSION_TEXT"), ("nvmath", "__version__")):
        try:
            out[mod] = getattr(__import__(mod), attr)
        except (ImportError, AttributeError):
            pass
    return out


def baseline_reasons(cell: Cell, config: BenchConfig, backend: str) -> dict[str, str | None]:
    """Each baseline of `config` that its mode has, with None where it can run the cell on `backend` and
    otherwise why not: on numpy or without PyTorch's CUDA only the numpy reference runs; cuDNN's are for
    the cells cuDNN implements, the sru package's for SRU, FlashRNN's for the LSTM; in a 16-bit precision,
    those of SIXTEEN_BIT_NOTES."""
    from .torch_baselines import cudnn_kind, is_sru, torch_available

    out: dict[str, str | None] = {}
    for b in config.baselines:
        if b not in (TRAIN_BASELINES if config.train else BASELINES):
            continue
        if b == "numpy reference":
            out[b] = None
        elif backend == "numpy":
            out[b] = "not available: no GPU/PyTorch on the numpy backend"
        elif not torch_available():
            out[b] = "not available: PyTorch with CUDA is not installed"
        elif (b in ("cudnn", FLASHRNN) or b in CUDNN_PERSISTENT) and config.lengths:
            out[b] = (f"not with --lengths: {'FlashRNN' if b == FLASHRNN else 'cuDNN'}'s run of sequences of "
                      "their own lengths is not a baseline yet")
        elif b != "cudnn" and config.bidirectional:
            out[b] = "not with --bidirectional: of the baselines, only cuDNN's runs both directions"
        elif (b == "cudnn" or b in CUDNN_PERSISTENT) and cudnn_kind(cell) is None:
            out[b] = "not available: cuDNN implements only the LSTM and the GRU"
        elif b == SRU_PACKAGE and not is_sru(cell):
            out[b] = "not available: the sru package implements only the SRU"
        elif b == FLASHRNN and cudnn_kind(cell) != "lstm":
            out[b] = "not available: of FlashRNN's cells, the LSTM is the one measured here"
        elif config.precision != "fp32" and b not in SIXTEEN_BIT_NOTES:
            out[b] = "runs in float32 only so far"
        else:
            out[b] = None
    return out


def run_benchmark(cell: Cell, config: BenchConfig, progress: Progress | None = None,
                  cancelled: Callable[[], bool] | None = None) -> BenchResult:
    """Checks each schedule and baseline against the reference, then times those that were right.

    A wrong result is reported, never timed. Timing goes in rounds that visit every implementation in
    turn, so that a slow drift of the machine (clocks, other processes) weighs on all of them alike
    instead of on whichever happened to run last.
    """
    sizes = config.sizes
    check_sizes(sizes, cell)
    check_precision(config.precision)
    backend = config.backend
    if backend == "auto":
        backend = "cuda" if "cuda" in available_backends() else "numpy"
    device, target, peaks = "CPU (numpy backend, no GPU)", H100, None
    if backend == "cuda":
        from .cuda_executor import device_description, device_peaks, device_target

        device, target, peaks = device_description(), device_target(), device_peaks()
    count = 2 if config.bidirectional else 1
    if count == 2 and sizes.layers != 1:
        raise CellError(f"--bidirectional runs one layer, not {sizes.layers}: a stack of bidirectional "
                        "layers runs through cellfuse.nn (CellRNN(..., bidirectional=True) or its LSTM)")
    rng = np.random.default_rng(config.seed)
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden, config.seed, count == 2)
    x = rng.standard_normal((sizes.seq, sizes.batch, sizes.input)).astype(np.float32)
    state_rows = sizes.layers * count
    initial = {s: np.zeros((state_rows, sizes.batch, sizes.hidden), np.float32) for s in cell.updates}
    # in training, the seed of y's gradient: drawn after x, so that x is the forward benchmark's
    dy = (rng.standard_normal((sizes.seq, sizes.batch, count * sizes.hidden)).astype(np.float32)
          if config.train else None)
    lengths, given = None, cell
    if config.lengths:  # each row to its own length: the cell rewritten so (graph_model.lengths)
        lengths = draw_lengths(config.lengths, sizes.seq, sizes.batch, rng)
        cell = masked(cell)
        initial[STEPS_LEFT] = np.broadcast_to(lengths[None, :, None].astype(np.float32),
                                              (state_rows, sizes.batch, sizes.hidden)).copy()
    directions = Directions(count, sizes.hidden, lengths)
    if count == 2:  # the two directions' persistent kernels resident at once, on half of the SMs each
        target = replace(target, sm_count=target.sm_count // 2)
    # The numpy executor is slow: a few runs say enough.
    runs = config.repeats if backend == "cuda" else max(1, min(config.repeats, 3))
    rounds = max(1, min(ROUNDS, runs))
    clock = "CUDA events" if backend == "cuda" else "wall clock"
    result = BenchResult(cell.name, given.structure_hash(), sizes, backend, device,
                         datetime.now(UTC).isoformat(timespec="seconds"), _versions(),
                         timing=f"{clock}; median of {runs} runs after warm-up, timed in {rounds} rounds "
                                "that take every implementation in turn",
                         train=config.train, seed=config.seed,
                         lengths=None if lengths is None else [int(n) for n in lengths],
                         bidirectional=config.bidirectional, precision=config.precision)
    schedules = [s for s in config.schedules if s in SCHEDULES]
    reasons = baseline_reasons(cell, config, backend)
    baselines = [b for b, why in reasons.items() if why is None]
    result.left_out = {b: why for b, why in reasons.items() if why is not None}
    total = 1 + len(schedules) + len(baselines) + rounds
    done = 0

    def step(message: str) -> None:
        nonlocal done
        if cancelled and cancelled():
            raise BenchCancelled
        if progress:
            progress(done, total, message)
        done += 1

    problem = _Problem(cell, sizes, params, x, initial, config, runs, target=target, dy=dy,
                       directions=directions, peaks=peaks)
    ready: list[_Timed] = []
    try:
        t0 = time.perf_counter()
        if config.train:
            step("reference gradients (numpy, float64)")
            tapes = [record_forward(cell, ps, {"x": xs, **init}, sizes.layers)
                     for ps, xs, init in problem.each_direction]
            problem.ref_grads = directions.gradients(
                [backward(tape, seed) for tape, seed in zip(tapes, directions.seeds(dy), strict=True)])
            if count == 1:  # (the other branches of kinks are taken for one direction)
                problem.kinks = near_kinks(tapes[0], MOST_KINKS)
                problem.tape = tapes[0] if problem.kinks else None  # kept only to take their other branches
            del tapes
        else:
            step("reference interpreter (numpy, float64)")
            problem.ref = directions.forward([run_reference(cell, ps, {"x": xs, **init})
                                              for ps, xs, init in problem.each_direction])
        ref_ms = (time.perf_counter() - t0) * 1e3
        for name in schedules:
            step(f"checking schedule '{name}' on {backend}")
            try:
                row, timed = _prepare_schedule(problem, name, backend)
            except Float32Only as e:  # a rung not yet made for this precision: not a failure
                result.left_out[name] = str(e)
                continue
            result.rows.append(row)
            ready += [timed] if timed else []
        for name in baselines:
            # (torch.compile compiles every step of the sequence first: on an H200 from half a minute to
            # more than two at T=100, with nothing to show meanwhile)
            step(f"checking baseline {name}" + (f" (it compiles all {sizes.seq} steps first: minutes "
                                                "at T=100)" if name in COMPILE_MODES else ""))
            if name == "numpy reference":
                note = TRAIN_NOTES[name] if config.train else "float64 on the CPU, one run"
                result.rows.append(BenchRow(name, "baseline", True, ref_ms, ref_ms, ref_ms, 0.0, note=note))
                continue
            row, timed = _prepare_torch(problem, name)
            result.rows.append(row)
            ready += [timed] if timed else []
        _time_in_rounds(ready, rounds, step)
        if progress:
            progress(total, total, "done")
    except BenchCancelled:
        result.cancelled = True
    finally:
        for timed in ready:
            timed.finish()
    return result


@dataclass
class _Problem:
    """What every implementation of one benchmark runs on, and the answer it must give."""

    cell: Cell
    sizes: Sizes
    params: dict[str, np.ndarray]
    x: np.ndarray
    initial: dict[str, np.ndarray]
    config: BenchConfig
    runs: int  # timed runs of each implementation
    ref: Forward | None = None
    plans: dict[str, Plan] = field(default_factory=dict)
    target: Target = H100  # the GPU a persistent plan is made for
    dy: np.ndarray | None = None  # in training: the seed of y's gradient
    ref_grads: Gradients | None = None  # in training: the float64 reference's gradients for dy
    # in training: the kinks that the reference passes within rounding of, its tape while there are any,
    # and its gradients along their other branches, as they are taken
    kinks: list[Kink] = field(default_factory=list)
    tape: Tape | None = None
    branches: dict[tuple[int, ...], Gradients] = field(default_factory=dict)
    directions: Directions = field(default_factory=lambda: Directions(1, 0))
    peaks: Peaks | None = None  # the GPU's, for each schedule's roofline

    @property
    def tolerance(self) -> float:
        """The relative error a result may have, in the benchmark's precision: a forward pass's, or its
        gradients'."""
        precision = self.config.precision
        return gradient_tolerance(precision) if self.config.train else forward_tolerance(precision)

    @cached_property
    def each_direction(self) -> list[tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]]:
        """Each direction's parameters, x and initial states (the reverse one's x reversed once)."""
        d = self.directions
        inputs = d.inputs(self.x, self.initial)
        return [(ps, xs, init) for ps, (xs, init) in zip(d.params(self.params), inputs, strict=True)]

    def check_gradients(self, row: BenchRow, grads: Gradients) -> None:
        """The row's error against the reference's gradients; where that is too large and the reference
        passes within rounding of kinks, against its gradients with some of them on their other side
        (one, then two, ... of the nearest), which a float32 run may take as rightly: the error against
        the first of those that it matches, and the row's note says which kinks."""
        precision = self.config.precision
        row.rel_error = _grad_error(grads, self.ref_grads, precision)
        if row.rel_error < self.tolerance or self.tape is None:
            return
        for chosen in _subsets(len(self.kinks)):
            if chosen not in self.branches:
                flipped = other_branch(self.tape, [self.kinks[i] for i in chosen])
                self.branches[chosen] = backward(flipped, self.dy)
            error = _grad_error(grads, self.branches[chosen], precision)
            if error < self.tolerance:
                row.rel_error = error
                where = "; ".join(self.kinks[i].text() for i in chosen)
                _add_note(row, f"right along the other branch of {where}, within {precision}'s rounding of "
                               "the reference's")
                return

    def plan(self, schedule: str) -> Plan:
        """The schedule's Plan in the benchmark's precision, made once: a rung's plan is also compared with
        the next rung's. In training, it saves every step for its backward Plan."""
        if schedule not in self.plans:
            self.plans[schedule] = make_plan(self.cell, self.sizes, schedule, self.target,
                                             save_steps=self.config.train, precision=self.config.precision)
        return self.plans[schedule]


@dataclass
class _Timed:
    """An implementation that gave the right answer: `once` runs it one time and returns the ms taken."""

    row: BenchRow
    once: Callable[[], float]
    runs: int
    close: Callable[[], None] = lambda: None
    times: list[float] = field(default_factory=list)

    def finish(self) -> None:
        if self.times:
            self.row.ok = True
            for k, v in _stats(self.times).items():
                setattr(self.row, k, v)
        else:
            _add_note(self.row, "cancelled before it was timed")
        self.close()


def _time_in_rounds(ready: list[_Timed], rounds: int, step: Callable[[str], None]) -> None:
    # A garbage collection in the middle of a host-bound launch loop would show as one slow run; as
    # timeit does, collect before and not during.
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            step(f"timing, round {r + 1} of {rounds}")
            for timed in ready:
                n = timed.runs * (r + 1) // rounds - timed.runs * r // rounds
                timed.times += [timed.once() for _ in range(n)]
    finally:
        if was_enabled:
            gc.enable()


def _wall_clock(run: Callable[[], object]) -> Callable[[], float]:
    def once() -> float:
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e3

    return once


def _cuda_clock(drv, stream, run: Callable[[], object], warmup: int) -> Callable[[], float]:
    """After `warmup` runs, a clock of one run of `run` on a PyCUDA stream, in ms, by CUDA events."""
    for _ in range(warmup):
        run()
    stream.synchronize()
    start, end = drv.Event(), drv.Event()

    def once() -> float:
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        return start.time_till(end)

    return once


def _subsets(count: int) -> list[tuple[int, ...]]:
    """The non-empty subsets of range(count), smallest first."""
    return [c for size in range(1, count + 1) for c in itertools.combinations(range(count), size)]


def _wrong(row: BenchRow, tolerance: float) -> bool:
    if row.rel_error < tolerance:
        return False
    _add_note(row, f"wrong result: relative error {row.rel_error:.2e}; not timed")
    return True


def _add_note(row: BenchRow, text: str) -> None:
    row.note = "; ".join(filter(None, [row.note, text]))


def _launched_work(plan: Plan) -> list:
    return [plan.cuda_graph, plan.chunk_steps, plan.layer_streams, *((lp.prologue, lp.step, lp.persistent)
                                                                    for lp in plan.layers)]


def _same_as_rung_below(p: _Problem, plan: Plan) -> str:
    """A note when the rung below this one launches exactly the same work (nothing left to combine, say),
    so that a difference between their times reads as the noise it is."""
    rung = SCHEDULES.index(plan.schedule)
    if rung == 0:
        return ""
    try:
        below = p.plan(SCHEDULES[rung - 1])
    except Float32Only:  # (the persistent rung below the tensor one, in 16 bits)
        return ""
    return f"the same launches as '{below.schedule}'" if _launched_work(below) == _launched_work(plan) else ""


def _prepare_schedule(p: _Problem, name: str, backend: str) -> tuple[BenchRow, _Timed | None]:
    row = BenchRow(name, "schedule", False)
    try:
        plan = p.plan(name)
        row.launches_per_step = plan.launches_per_step
        row.note = _same_as_rung_below(p, plan)
        if p.peaks is not None and not p.config.train:  # (the backward plans' counts are not modelled)
            row.roofline = roofline(plan, p.peaks, p.directions.count).to_json()
        if p.config.train:
            return (_train_numpy if backend == "numpy" else _train_cuda)(p, row, plan)
        if backend == "numpy":
            from .numpy_executor import NumpyExecutor

            t0 = time.perf_counter()
            runs = [(NumpyExecutor(plan, ps), xs, init) for ps, xs, init in p.each_direction]

            def forward() -> Forward:
                return p.directions.forward([ex.run(xs, init) for ex, xs, init in runs])

            out = forward()
            row.compile_s = 0.0
            _add_note(row, f"first run {(time.perf_counter() - t0) * 1e3:.1f} ms")
            row.rel_error = _rel_error(out, p.ref)
            if _wrong(row, p.tolerance):
                return row, None
            return row, _Timed(row, _wall_clock(forward), p.runs)
        from .cuda_executor import CudaExecutor

        executors = []
        try:
            for ps, _, _ in p.each_direction:
                executors.append(CudaExecutor(plan, ps))
            t0 = time.perf_counter()
            out = p.directions.forward([ex.run(xs, init) for ex, (_, xs, init)
                                        in zip(executors, p.each_direction, strict=True)])
        except BaseException:
            for ex in executors:
                ex.close()
            raise
        row.compile_s = sum(ex.compile_s for ex in executors)
        _add_note(row, f"first run {(time.perf_counter() - t0) * 1e3:.1f} ms"
                       + (", with the graph's capture" if plan.cuda_graph else ""))
        row.rel_error = _rel_error(out, p.ref)
        if _wrong(row, p.tolerance):
            for ex in executors:
                ex.close()
            return row, None
    except Float32Only:  # left out by the caller: not a failure of this row
        raise
    except CellError as e:
        row.note = str(e)
        return row, None
    first = executors[0]
    side_by_side = _side_by_side(first.drv, [ex.stream for ex in executors], [ex.forward for ex in executors])
    return row, _Timed(row, _cuda_clock(first.drv, first.stream, side_by_side, p.config.warmup), p.runs,
                       lambda: [ex.close() for ex in executors])


def _side_by_side(drv, streams: list, runs: list[Callable[[], object]]) -> Callable[[], None]:
    """One call of each of `runs`, each on its stream (the first's the stream a clock times): the others
    forked from the first stream and joined back to it by events."""
    if len(runs) == 1:
        return runs[0]
    forked, joined = drv.Event(), [drv.Event() for _ in streams[1:]]

    def run() -> None:
        forked.record(streams[0])
        for stream in streams[1:]:
            stream.wait_for_event(forked)
        for r in runs:
            r()
        for event, stream in zip(joined, streams[1:], strict=True):
            event.record(stream)
            streams[0].wait_for_event(event)

    return run


def _train_numpy(p: _Problem, row: BenchRow, plan: Plan) -> tuple[BenchRow, _Timed | None]:
    """A schedule's forward run and its backward Plan's run on the numpy executor, float32."""
    from .numpy_backward import NumpyBackward
    from .numpy_executor import NumpyExecutor

    t0 = time.perf_counter()
    runs = []
    for ps, xs, init in p.each_direction:
        ex = NumpyExecutor(plan, ps)
        runs.append((ex, NumpyBackward(ex), xs, init))
    row.launches_per_step = plan.launches_per_step + runs[0][1].plan.launches_per_step
    seeds = p.directions.seeds(p.dy)

    def train_step() -> Gradients:
        grads = []
        for (ex, back, xs, init), seed in zip(runs, seeds, strict=True):
            ex.run(xs, init)
            grads.append(back.run(seed))
        return p.directions.gradients(grads)

    grads = train_step()
    row.compile_s = 0.0
    _add_note(row, f"first run {(time.perf_counter() - t0) * 1e3:.1f} ms")
    p.check_gradients(row, grads)
    if _wrong(row, p.tolerance):
        return row, None
    return row, _Timed(row, _wall_clock(train_step), p.runs)


def _train_cuda(p: _Problem, row: BenchRow, plan: Plan) -> tuple[BenchRow, _Timed | None]:
    """A schedule's forward pass and its backward Plan's launches on the GPU (each direction's on its own
    executor's stream, side by side). A timed run restores the gradient buffers that the backward launches
    add into to their seeded state with one copy on the device (those overwritten whole need none), runs
    the forward pass (replaying its graph, if it has one) and the backward launches."""
    from .cuda_backward import CudaBackward
    from .cuda_executor import CudaExecutor

    releases = []  # what was allocated, released in reverse when the row is done with

    def close() -> None:
        for release in reversed(releases):
            release()

    steps = []
    try:
        pairs = []
        row.compile_s = 0.0
        for ps, _, _ in p.each_direction:
            ex = CudaExecutor(plan, ps)
            releases.append(ex.close)
            t0 = time.perf_counter()
            backward = CudaBackward(ex)
            releases.append(backward.close)
            row.compile_s += ex.compile_s + time.perf_counter() - t0  # the backward kernels compile in there
            pairs.append((ex, backward))
        row.launches_per_step = plan.launches_per_step + pairs[0][1].plan.launches_per_step
        t0 = time.perf_counter()
        grads = []
        seeds = p.directions.seeds(p.dy)
        for (ex, backward), (_, xs, init), seed in zip(pairs, p.each_direction, seeds, strict=True):
            ex.run(xs, init)
            grads.append(backward.run(seed))
        _add_note(row, f"first run {(time.perf_counter() - t0) * 1e3:.1f} ms"
                       + (", with the graph's capture" if plan.cuda_graph else ""))
        p.check_gradients(row, p.directions.gradients(grads))
        if _wrong(row, p.tolerance):
            close()
            return row, None
        for (ex, backward), seed in zip(pairs, seeds, strict=True):
            backward.seed(seed)
            seeded = ex.drv.mem_alloc(backward.restart_nbytes)
            releases.append(seeded.free)
            ex.drv.memcpy_dtod(seeded, backward.memory, backward.restart_nbytes)

            def train_step(ex=ex, backward=backward, seeded=seeded) -> None:
                ex.drv.memcpy_dtod_async(backward.memory, seeded, backward.restart_nbytes, ex.stream)
                ex.forward()
                backward.enqueue()

            steps.append(train_step)
    except BaseException:
        close()
        raise
    first = pairs[0][0]
    side_by_side = _side_by_side(first.drv, [ex.stream for ex, _ in pairs], steps)
    return row, _Timed(row, _cuda_clock(first.drv, first.stream, side_by_side, p.config.warmup), p.runs,
                       close)


def _prepare_torch(p: _Problem, name: str) -> tuple[BenchRow, _Timed | None]:
    train = p.config.train
    row = BenchRow(name, "baseline", False, note=(TRAIN_NOTES if train else BASELINE_NOTES)[name])
    from .torch_baselines import (
        Autocast,
        CompiledCell,
        CudnnCell,
        FlashRnnCell,
        GraphedCell,
        SruPackageCell,
        TorchCell,
        Training,
        cudnn_kind,
        flashrnn_unavailable,
        sru_unavailable,
    )

    reason = (unavailable_reason() if name in CUDNN_PERSISTENT
              else sru_unavailable() if name == SRU_PACKAGE
              else flashrnn_unavailable() if name == FLASHRNN else None)
    if reason:
        row.note, row.applicable = f"not available: {reason}; {row.note}", False
        return row, None
    import torch

    # Float32 against float32: PyTorch would otherwise let cuDNN and cuBLAS round inputs to TF32. A 16-bit
    # matmul accumulates in float32, as the schedules' GEMMs do: PyTorch would otherwise let cuBLAS's
    # split-K sum its parts in the 16-bit type.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    sizes, precision = p.sizes, p.config.precision
    dtype = getattr(torch, PRECISIONS[precision].name)
    # cuDNN's 16-bit RNN at its best: torch flattens no bfloat16 weights for cuDNN, so that its module in
    # bf16 copies them into one piece at every call; its persistent algorithms are measured in fp16 alike
    fp16_beside_bf16 = (name == "cudnn" or name in CUDNN_PERSISTENT) and precision == "bf16"
    if fp16_beside_bf16:
        dtype = torch.float16
    if precision != "fp32":
        _add_note(row, SIXTEEN_BIT_NOTES[name].format(dtype))
    elif name in CUDNN_PERSISTENT:
        _add_note(row, "in float32 (no TF32)")
    if fp16_beside_bf16:
        why = ("torch flattens no bfloat16 weights for cuDNN" if name == "cudnn"
               else "cuDNN's 16-bit RNN as PyTorch runs it")
        _add_note(row, f"fp16 beside bf16: {why}")
    xt = torch.from_numpy(p.x).cuda()
    init = [torch.from_numpy(p.initial[s]).cuda() for s in p.cell.updates]
    if name in ("cudnn", FLASHRNN, *CUDNN_PERSISTENT):  # in the 16-bit type in a 16-bit precision
        xt, init = xt.to(dtype), [s.to(dtype) for s in init]
    t0 = time.perf_counter()
    try:
        if name == "cudnn":
            model = CudnnCell(cudnn_kind(p.cell), p.params, sizes.layers, sizes.input, sizes.hidden,
                              train=train, bidirectional=p.config.bidirectional, dtype=dtype)
        elif name in CUDNN_PERSISTENT:
            model = CudnnPersistentRNN(cudnn_kind(p.cell), p.params, sizes.layers, sizes.input, sizes.hidden,
                                       sizes.batch, sizes.seq, CUDNN_PERSISTENT[name],
                                       half=dtype == torch.float16)
            _add_note(row, f"cuDNN {model.cudnn.version}")
        elif name == SRU_PACKAGE:
            model = SruPackageCell(p.params, sizes.layers, sizes.input, sizes.hidden, train=train)
        elif name == FLASHRNN:
            model = FlashRnnCell(p.params, sizes.layers, sizes.hidden, dtype)
        elif name in COMPILE_MODES:
            model = CompiledCell(p.cell, p.params, sizes.layers, COMPILE_MODES[name], train=train)
        else:
            model = TorchCell(p.cell, p.params, sizes.layers, train=train)
        if name in AUTOCAST and precision != "fp32":
            model = Autocast(model, dtype)
        if name == "pytorch graph":  # captured as it runs: under autocast in a 16-bit precision
            model = GraphedCell(model, xt, init)
        # Copied at once: in mode "reduce-overhead" the next call overwrites the results of this one.
        if train:
            run = Training(model, list(p.cell.updates), xt, init, torch.from_numpy(p.dy).cuda())
            grads = run.gradients(run())
        else:
            def run():
                return model(xt, init)

            y = run().clone()
        torch.cuda.synchronize()
    except CudnnRefused as e:  # cuDNN does not run this algorithm at these sizes: a fact, not a failure
        row.note, row.applicable = f"not applicable: {e}; {row.note}", False
        return row, None
    except Exception as e:  # FlashRNN builds its kernels at its first call, where the machine may lack a tool
        if name != FLASHRNN:
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        row.note = f"not available: FlashRNN failed ({type(e).__name__}: {first}); {row.note}"
        row.applicable = False
        return row, None
    row.compile_s = time.perf_counter() - t0  # setup and first call: torch.compile compiles in the call
    if train:
        p.check_gradients(row, grads)
    else:
        row.rel_error = _rel_error(Forward(y.float().cpu().numpy(), {}), Forward(p.ref.y, {}))
    if _wrong(row, p.tolerance):
        return row, None
    for _ in range(p.config.warmup):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once() -> float:
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return row, _Timed(row, once, p.runs)


def run_sweep(cell: Cell, config: BenchConfig, param: str, values: list[int],
              progress: Progress | None = None, cancelled: Callable[[], bool] | None = None) -> SweepResult:
    """The benchmark at each value of one size (seq, batch, input, hidden or layers)."""
    if param not in ("seq", "batch", "input", "hidden", "layers"):
        raise CellError(f"cannot sweep '{param}': choose seq, batch, input, hidden or layers")
    sweep = SweepResult(param, list(values), [])
    for i, v in enumerate(values):
        def sub_progress(done: int, total: int, message: str, i: int = i, v: int = v) -> None:
            if progress:
                progress(i * total + done, len(values) * total, f"{param}={v}: {message}")

        res = run_benchmark(cell, replace(config, sizes=replace(config.sizes, **{param: v})), sub_progress,
                            cancelled)
        sweep.results.append(res)
        if res.cancelled:
            break
    return sweep
