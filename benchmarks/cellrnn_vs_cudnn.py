"""CellRNN against torch.nn.LSTM / torch.nn.GRU (cuDNN) with the same weights, called as a PyTorch user
calls them, beside `cellfuse bench`'s time of the rung CellRNN ran; one JSON record and Markdown tables.

    python benchmarks/cellrnn_vs_cudnn.py --out benchmarks/results/h100_DATE_cellrnn_vs_cudnn.json
    python benchmarks/cellrnn_vs_cudnn.py --cells lstm --batches 64 --seqs 100 --layers 1 --repeats 10 \\
        --out /tmp/cellrnn_vs_cudnn.json
    python benchmarks/cellrnn_vs_cudnn.py --device cpu --hidden 16 --input 16 --batches 2 --seqs 5 \\
        --layers 1 --repeats 2 --out /tmp/cellrnn_vs_cudnn_cpu.json

For each case (cell, T, B, layers), on one device in float32 (TF32 off for cuDNN and cuBLAS, so that both
sides compute in float32), or with --precision bf16 / fp16 in that dtype: x in it, torch.nn.LSTM / GRU
converted to it (cuDNN in 16 bits), CellRNN's parameters left float32 as under torch.autocast (packed
into 16-bit weights); the check then allows twice the precision's bound (codegen.precision) relative to
y's largest magnitude, the training step's twice the bound of 16-bit gradients (its floor
precision.gradient_floor), and the torch.compile part is left out. --cudnn-precision runs torch's module
in another dtype than CellRNN (x converted to it outside the clock; no training step then): fp16 against
CellRNN's bf16, cuDNN at its best, since torch does not flatten bf16 weights for cuDNN and so compacts
them at every call:

- the check, before anything is timed: CellRNN(x)'s y against torch.nn.LSTM / GRU(x)'s y, loaded with the
  CellRNN's weights by the benchmark's own mapping (torch_baselines.CudnnCell): a row whose largest
  absolute difference is above TOLERANCE is marked failed and not timed;
- the forward pass under torch.no_grad(), `rnn(x)` against `lstm(x)`: CUDA events around the call, and
  the host time (perf_counter until the call returns, without synchronising inside; the device is
  synchronised between runs), after warm-up, the median of --repeats runs taken in turns (each turn
  times two calls, the first right after the other library's call and the second after its own, as a
  loop calls it: the second is the time reported, the first is in the record and in the tables' "after
  cuDNN's call" columns);
- a training step (unless --no-train): forward, loss = y.pow(2).mean() (in fp16 times FP16_LOSS_SCALE,
  as torch.amp.GradScaler scales it), backward, the gradients zeroed
  (set to None) between steps and outside the clock, no optimizer (with --optimizer sgd, SGD's step at
  its end, which changes the weights as a training script's does); checked first by the parameters'
  gradients (each parameter's largest difference relative to its largest gradient, or to GRAD_FLOOR of
  the largest gradient of all where that is more: at most GRAD_TOLERANCE); and the same steps queued
  back to back (BACK_TO_BACK of them, the gradients zeroed before each, the device synchronised only
  before the first and after the last), as a training loop that reads nothing back runs them: the time
  per step;
- `cellfuse bench`'s time of the rung CellRNN ran at the same sizes (run_benchmark in this process, with
  the rung as its only schedule and cuDNN as its only baseline; forward, and with BenchConfig.train the
  equivalent of `cellfuse bench --train`). The bench checks against the float64 reference first, which
  at T=1000, B=256 takes the CPU tens of seconds (forward) to minutes (training): --bench narrows it.
  The bench's forward plan saves no steps: where CellRNN's forward pass saves them (for a backward
  pass), that is part of the CellRNN/bench ratio of the forward pass;
- with --graph, the forward pass captured with torch.cuda.graph (warm-up on a side stream, capture,
  replay), for both, checked after a replay, then the replays timed in turns.

Before the cases, for each cell, a small language model (embedding -> CellRNN -> linear) eager against
torch.compile(model, fullgraph=True), forward under no_grad; a compile that fails is recorded as text.

On the CPU (--device cpu) the times are perf_counter's, torch.nn's CPU kernels stand for cuDNN, and the
bench and the graph parts are skipped. The record is written again after every case, so that a run cut
short keeps what it measured; --budget-s stops starting cases, and the bench and graph parts of the
case under way, once that many seconds have passed (the torch.compile part runs first, then the cases,
cheapest first). Exit status 1 when a case failed its check or raised.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import platform
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from cellfuse import __version__
from cellfuse.codegen import SCHEDULES
from cellfuse.codegen.precision import forward_tolerance, gradient_floor, gradient_tolerance
from cellfuse.gpu_runtime.torch_baselines import CudnnCell
from cellfuse.graph_model import Sizes, atomic_write, load_template
from cellfuse.nn import CellRNN

TOLERANCE = 1e-3  # the largest absolute difference of y (float32 against float32) that passes
FP16_LOSS_SCALE = 2.0**16  # torch.amp.GradScaler's initial scale
GRAD_TOLERANCE = 1e-3  # of a parameter's gradient, relative to its largest (see GRAD_FLOOR)
BACK_TO_BACK = 10  # training steps queued without waiting, per timed run of them
GRAD_FLOOR = 1e-3  # a parameter's gradient counts relative to at least this fraction of the largest of all
CELLS = ("lstm", "gru")
BENCH_MODES = ("forward", "train")
ERROR_CHARS = 4000  # of an exception's text kept in the record

SKIPPED = {"ok": False, "ms": None, "note": "skipped: time budget"}

Run = Callable[[], object]


def out_of_time(args: argparse.Namespace) -> bool:
    """Whether --budget-s has run out (args.deadline, set when the run starts)."""
    return getattr(args, "deadline", None) is not None and time.perf_counter() > args.deadline


# -- timing --------------------------------------------------------------------------------------------
class Clock:
    """One run of a callable: (device ms, host ms). On CUDA the device time is between two events around
    the call and the host time is until the call returns; the device is synchronised before the run and
    after it, never inside. On the CPU both are perf_counter's."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def once(self, run: Run, before: Run | None = None) -> tuple[float, float]:
        if before is not None:
            before()
        self.sync()
        if self.cuda:
            self.start.record()
        t0 = time.perf_counter()
        run()
        host = (time.perf_counter() - t0) * 1e3
        if not self.cuda:
            return host, host
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end), host

    def per_step(self, run: Run, before: Run, steps: int) -> float:
        """The time of `steps` runs (each after `before`) queued back to back, divided by `steps`: the
        device is synchronised before the first and after the last, never between them."""
        self.sync()
        if self.cuda:
            self.start.record()
        t0 = time.perf_counter()
        for _ in range(steps):
            before()
            run()
        if not self.cuda:
            return (time.perf_counter() - t0) * 1e3 / steps
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / steps


def stats(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "runs_ms": [round(t, 6) for t in times]}


def time_in_turns(impls: dict[str, tuple[Run, Run | None]], clock: Clock, repeats: int, warmup: int
                  ) -> dict[str, dict]:
    """Each implementation (run, before) warmed up, then timed in `repeats` rounds that take every
    implementation in turn. A turn times two runs one after the other: the first follows another
    implementation's run, the second its own, as the calls of a loop over batches do (the order is the
    same in every round, so that each first run follows another's). A call's host time depends on what
    ran on the host just before it (right after cuDNN's call the same Python and C++ take 2 to 9x as
    long: its code and data are out of the CPU's caches), so the second is the time reported, and the
    first is kept beside it.
    {name: {"device": stats, "host": stats, "device_after_other": stats, "host_after_other": stats}}"""
    for run, before in impls.values():
        for _ in range(warmup):
            if before is not None:
                before()
            run()
    clock.sync()
    first: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
    second: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
    names = list(impls)
    gc.collect()  # as timeit does: collect before, not during
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for name in names:
                first[name].append(clock.once(*impls[name]))
                second[name].append(clock.once(*impls[name]))
    finally:
        if was_enabled:
            gc.enable()
    return {name: {"device": stats([d for d, _ in second[name]]), "host": stats([h for _, h in second[name]]),
                   "device_after_other": stats([d for d, _ in first[name]]),
                   "host_after_other": stats([h for _, h in first[name]])}
            for name in impls}


def time_back_to_back(impls: dict[str, tuple[Run, Run]], clock: Clock, repeats: int) -> dict[str, dict]:
    """Each implementation's time per step where BACK_TO_BACK steps are queued without waiting for the
    device, as a training loop that reads no value back runs them (the host's work for a step overlaps the
    device's for the one before): `repeats` such runs, in turns. {name: stats}"""
    times: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(clock.per_step(*impls[name], BACK_TO_BACK))
    return {name: stats(ts) for name, ts in times.items()}


# -- the models ----------------------------------------------------------------------------------------
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_pair(kind: str, args: argparse.Namespace, layers: int, device: torch.device
              ) -> tuple[CellRNN, CudnnCell]:
    """The CellRNN and torch.nn.LSTM / GRU (in CudnnCell, the benchmark's mapping) with the same weights,
    torch's in the benchmark's dtype."""
    rnn = CellRNN(kind, args.input, args.hidden, layers, schedule=args.schedule, seed=args.seed).to(device)
    params = {key: rnn.param(key).detach().cpu().numpy() for key in rnn.keys}
    cudnn = CudnnCell(kind, params, layers, args.input, args.hidden, device=str(device),
                      dtype=DTYPES[args.cudnn_precision])
    cudnn.module.eval()
    return rnn, cudnn


def tolerance(args: argparse.Namespace, y_ref: torch.Tensor) -> float:
    """The largest absolute difference of y that passes: TOLERANCE in float32; in 16 bits twice the
    precision's bound (each side has its own rounding) of y's largest magnitude."""
    if args.precision == args.cudnn_precision == "fp32":
        return TOLERANCE
    bound = max(forward_tolerance(p) for p in (args.precision, args.cudnn_precision))
    return 2 * bound * float(y_ref.detach().float().abs().max())


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max().item())


def passes(diff: float | None, tolerance: float) -> bool:
    return diff is not None and math.isfinite(diff) and diff <= tolerance


def error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + " ..."


class Messages(logging.Handler):
    """The log records of cellfuse (such as what `auto` chose, and why) while a case runs."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# -- one case ------------------------------------------------------------------------------------------
def run_case(kind: str, seq: int, batch: int, layers: int, args: argparse.Namespace, device: torch.device,
             clock: Clock) -> dict:
    row: dict = {"cell": kind, "seq": seq, "batch": batch, "layers": layers, "input": args.input,
                 "hidden": args.hidden, "schedule": args.schedule, "rung": None, "train_rung": None,
                 "ok": False, "error": None, "max_abs_diff": None, "forward": None, "train": None,
                 "bench": {}, "graph": None}
    handler = Messages()
    logger = logging.getLogger("cellfuse")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    t0 = time.perf_counter()
    try:
        _case(row, kind, seq, batch, layers, args, device, clock)
    except Exception as e:
        row["ok"] = False
        row["error"] = error_text(e)
        row["traceback"] = traceback.format_exc()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        row["log"] = handler.lines
        row["wall_s"] = time.perf_counter() - t0
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _case(row: dict, kind: str, seq: int, batch: int, layers: int, args: argparse.Namespace,
          device: torch.device, clock: Clock) -> None:
    torch.manual_seed(args.seed)
    rnn, cudnn = make_pair(kind, args, layers, device)
    module = cudnn.module
    generator = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(seq, batch, args.input, generator=generator).to(device, DTYPES[args.precision])
    x_cudnn = x.to(DTYPES[args.cudnn_precision])  # (the same x, where cuDNN runs another dtype)

    # the check: nothing is timed before it passes
    with torch.no_grad():
        y = rnn(x)[0]
        row["rung"] = rnn.schedules_run[-1]
        y_ref = module(x_cudnn)[0]
        clock.sync()
    row["max_abs_diff"] = max_abs_diff(y, y_ref)
    row["tolerance"] = args.tolerance = tolerance(args, y_ref)
    if not passes(row["max_abs_diff"], args.tolerance):
        row["error"] = (f"y differs from torch.nn.{module.__class__.__name__}'s by {row['max_abs_diff']:.3e} "
                        f"(tolerance {args.tolerance:g}); not timed")
        return
    row["ok"] = True

    with torch.no_grad():
        forward = {"CellRNN": (lambda: rnn(x), None), "cuDNN": (lambda: module(x_cudnn), None)}
        row["forward"] = time_in_turns(forward, clock, args.repeats, args.warmup)
    if args.train:
        try:
            row["train"] = train_part(rnn, cudnn, x, clock, args)
            row["train_rung"] = rnn.schedules_run[-1]  # (auto chooses a training call's rung apart)
        except Exception as e:  # the rest of the case still runs
            row["train"] = {"ok": False, "error": error_text(e), "grad_rel_error": None,
                            "traceback": traceback.format_exc()}
        if not row["train"]["ok"]:
            row["ok"] = False
    if device.type == "cuda":
        for mode in args.bench:
            train = mode == "train"
            if train and not args.train:  # (no step ran: one call saving its steps says its rung)
                rnn(x)
                row["train_rung"] = rnn.schedules_run[-1]
            rung = row["train_rung"] if train else row["rung"]
            if rung is None:
                row["bench"][mode] = {"ok": False, "ms": None, "note": "skipped: the training step failed"}
            else:
                row["bench"][mode] = (bench_part(kind, seq, batch, layers, rung, train, args)
                                      if not out_of_time(args) else dict(SKIPPED))
        if args.graph:
            row["graph"] = (graph_part(rnn, module, x, x_cudnn, y_ref, clock, args) if not out_of_time(args)
                            else dict(SKIPPED))
    else:
        row["bench"] = {mode: {"ok": False, "ms": None, "note": "skipped: the bench needs a GPU"}
                        for mode in args.bench}
        if args.graph:
            row["graph"] = {"note": "skipped: CUDA graphs need a GPU"}


def train_part(rnn: CellRNN, cudnn: CudnnCell, x: torch.Tensor, clock: Clock, args: argparse.Namespace
               ) -> dict:
    """The training step of each, checked by its parameters' gradients, then timed in turns."""
    module = cudnn.module.train()  # cuDNN's backward pass refuses a module in eval mode (there is no dropout)
    # fp16 gradients this small (the mean over T*B*H outputs) underflow: scaled as GradScaler starts, on
    # both sides alike (each side's gradients, and so their relative difference, scale with it)
    scale = FP16_LOSS_SCALE if args.precision == "fp16" else 1.0
    out: dict = {"ok": False, "error": None, "grad_rel_error": None, "loss_diff": None,
                 "loss": "y.pow(2).mean()" + (f" * {scale:g}" if scale != 1 else ""),
                 "optimizer": args.optimizer}

    def step(model) -> Callable[[], torch.Tensor]:
        # (SGD's step changes the weights in place, as a training script's optimizer does: CellRNN packs
        # them again at its next forward, cuDNN reads them where they are; a tiny rate keeps the values)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-9) if args.optimizer == "sgd" else None

        def run() -> torch.Tensor:
            y = model(x)[0]
            loss = y.float().pow(2).mean() * scale
            loss.backward()
            if optimizer is not None:
                optimizer.step()
            return loss

        return run

    def zero(model) -> Callable[[], None]:
        return lambda: model.zero_grad(set_to_none=True)

    steps = {"CellRNN": (step(rnn), zero(rnn)), "cuDNN": (step(module), zero(module))}
    losses = {}
    for name, (run, before) in steps.items():
        before()
        losses[name] = float(run().item())
    ours = {key: rnn.param(key).grad for key in rnn.keys}
    theirs = cudnn.param_gradients([p.grad for p in cudnn.parameters()])
    out["loss_diff"] = abs(losses["CellRNN"] - losses["cuDNN"])
    missing = [key for key, g in ours.items() if g is None or key not in theirs]
    if missing:
        out["error"] = f"no gradient to compare for {', '.join(missing)}; not timed"
        return out
    # in 16 bits, twice the bound of 16-bit gradients (each side rounds), with that bound's floor
    sixteen = args.precision != "fp32"
    grad_tolerance = 2 * gradient_tolerance(args.precision) if sixteen else GRAD_TOLERANCE
    grad_floor = gradient_floor(args.precision) if sixteen else GRAD_FLOOR
    largest = max(float(np.max(np.abs(g))) for g in theirs.values())
    worst = 0.0
    for key, g in ours.items():
        want = theirs[key].astype(np.float64)
        scale = max(float(np.max(np.abs(want))), grad_floor * largest, 1e-30)
        got = g.detach().cpu().double().numpy()
        error = float(np.max(np.abs(got - want))) / scale if np.all(np.isfinite(got)) else math.inf
        worst = max(worst, error)
    out["grad_rel_error"] = worst
    if not passes(worst, grad_tolerance):
        out["error"] = (f"the parameters' gradients differ from torch.nn.{module.__class__.__name__}'s by "
                        f"{worst:.3e} relative (tolerance {grad_tolerance:g}); not timed")
        module.eval()
        return out
    out["ok"] = True
    out.update(time_in_turns(steps, clock, args.repeats, args.warmup))
    out["back_to_back"] = time_back_to_back(steps, clock, max(2, args.repeats // 4))
    rnn.zero_grad(set_to_none=True)
    module.zero_grad(set_to_none=True)
    module.eval()
    return out


def bench_part(kind: str, seq: int, batch: int, layers: int, rung: str, train: bool,
               args: argparse.Namespace) -> dict:
    """`cellfuse bench` (`--train` with `train`) of the one rung, with the cuDNN baseline, in this process."""
    from cellfuse.gpu_runtime.bench import BenchConfig, run_benchmark

    config = BenchConfig(Sizes(seq, batch, args.input, args.hidden, layers), backend="cuda", schedules=[rung],
                         baselines=["cudnn"], repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                         train=train, precision=args.precision)
    out: dict = {"ok": False, "ms": None, "cudnn_ms": None, "note": "", "record": None}
    t0 = time.perf_counter()
    try:
        result = run_benchmark(load_template(kind), config)
    except Exception as e:
        out["note"] = error_text(e)
        return out
    finally:
        out["wall_s"] = time.perf_counter() - t0
    out["record"] = result.to_json()
    row, base = result.row(rung), result.row("cudnn")
    if row is not None:
        out.update(ok=row.ok, ms=row.median_ms if row.ok else None, rel_error=row.rel_error, note=row.note)
    if base is not None and base.ok:
        out["cudnn_ms"] = base.median_ms
    return out


def capture(run: Callable[[], torch.Tensor], warmup: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A forward pass captured into a CUDA graph as torch's docs say: warm-up runs on a side stream, then
    the capture; returns the graph and its output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = run()
    return graph, y


def graph_part(rnn: CellRNN, module: torch.nn.Module, x: torch.Tensor, x_cudnn: torch.Tensor,
               y_ref: torch.Tensor, clock: Clock, args: argparse.Namespace) -> dict:
    """Each forward pass captured and replayed (cuDNN's first, so that a capture of CellRNN that fails
    cannot take it with it); each replay checked against y_ref, then those that passed timed in turns."""
    out: dict = {}
    graphs = {}
    with torch.no_grad():
        for name, run in (("cuDNN", lambda: module(x_cudnn)[0]), ("CellRNN", lambda: rnn(x)[0])):
            entry: dict = {"ok": False, "error": None, "max_abs_diff": None}
            out[name] = entry
            try:
                graph, y = capture(run, args.warmup)
                graph.replay()
                torch.cuda.synchronize()
            except Exception as e:
                entry["error"] = error_text(e)
                try:
                    torch.cuda.synchronize()
                except Exception as later:  # the failed capture left the device unusable
                    entry["error"] += f"; then {error_text(later)}"
                    break
                continue
            entry["max_abs_diff"] = max_abs_diff(y, y_ref)
            if not passes(entry["max_abs_diff"], args.tolerance):
                entry["error"] = f"the replay's y differs by {entry['max_abs_diff']:.3e}; not timed"
                continue
            entry["ok"] = True
            graphs[name] = graph
        if graphs:
            timed = time_in_turns({name: (g.replay, None) for name, g in graphs.items()}, clock, args.repeats,
                                  args.warmup)
            for name, t in timed.items():
                out[name].update(t)
    del graphs
    return out


# -- torch.compile of a small language model ----------------------------------------------------------
class LanguageModel(torch.nn.Module):
    """tokens [T, B] -> logits [T, B, vocab]: embedding, CellRNN, linear head."""

    def __init__(self, kind: str, vocab: int, args: argparse.Namespace, layers: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, args.input)
        self.rnn = CellRNN(kind, args.input, args.hidden, layers, schedule=args.schedule, seed=args.seed)
        self.head = torch.nn.Linear(args.hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.embed(tokens))
        return self.head(y)


def compile_part(kind: str, seq: int, batch: int, layers: int, args: argparse.Namespace, device: torch.device,
                 clock: Clock) -> dict:
    """The language model's forward (no_grad) eager, then under torch.compile(fullgraph=True): the
    compiled output checked against the eager one, then both timed in turns (the eager one alone where
    the compile failed)."""
    out: dict = {"cell": kind, "seq": seq, "batch": batch, "layers": layers, "vocab": args.vocab,
                 "model": "embedding -> CellRNN -> linear", "call": "torch.compile(model, fullgraph=True)",
                 "ok": False, "error": None, "rung": None, "compile_s": None, "max_abs_diff": None}
    t_start = time.perf_counter()
    try:
        torch.manual_seed(args.seed)
        model = LanguageModel(kind, args.vocab, args, layers).to(device).eval()
        generator = torch.Generator().manual_seed(args.seed + 2)
        tokens = torch.randint(args.vocab, (seq, batch), generator=generator).to(device)
        impls: dict[str, tuple[Run, Run | None]] = {"eager": (lambda: model(tokens), None)}
        with torch.no_grad():
            want = model(tokens)
            out["rung"] = model.rnn.schedules_run[-1]
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True)
            t0 = time.perf_counter()
            try:
                got = compiled(tokens)
                clock.sync()
            except Exception as e:
                out["error"] = error_text(e)
                got = None
            out["compile_s"] = time.perf_counter() - t0
            if got is not None:
                out["max_abs_diff"] = max_abs_diff(got, want)
                if passes(out["max_abs_diff"], TOLERANCE):
                    out["ok"] = True
                    impls["compiled"] = (lambda: compiled(tokens), None)
                else:
                    out["error"] = (f"the compiled model's logits differ by {out['max_abs_diff']:.3e} "
                                    "from the eager model's; not timed")
            out.update(time_in_turns(impls, clock, args.repeats, args.warmup))
    except Exception as e:
        out["error"] = out["error"] or error_text(e)
        out["traceback"] = traceback.format_exc()
    finally:
        torch._dynamo.reset()
        out["wall_s"] = time.perf_counter() - t_start
        gc.collect()
    return out


# -- the record and the tables -------------------------------------------------------------------------
def median(part: dict | None, name: str, clock: str = "device") -> float | None:
    if not part or name not in part or clock not in part[name]:
        return None
    return part[name][clock]["median_ms"]


def ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def ratio(a: float | None, b: float | None, suffix: str = "") -> str:
    return "" if a is None or b is None or b == 0 else f"{a / b:.2f}{suffix}"


def bench_ms(row: dict, mode: str) -> float | None:
    return (row["bench"].get(mode) or {}).get("ms")


def check_text(row: dict) -> str:
    diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.1e}"
    if row.get("skipped"):
        return row["skipped"]
    if row["forward"] is not None:
        return f"ok ({diff})"
    return f"FAILED ({diff})" if diff else "ERROR"


def tables(record: dict) -> str:
    rows = sorted(record["rows"], key=lambda r: (r["cell"], r["seq"], r["batch"], r["layers"]))
    settings = record["settings"]
    graph = settings["graph"]
    cudnn = settings.get("cudnn_precision", settings["precision"])  # (records before the option: the same)
    theirs = f" (torch's module in {DTYPES[cudnn]})" if cudnn != settings["precision"] else ""
    lines = [f"CellRNN against torch.nn.LSTM / GRU on {record['device']}, "
             f"torch {record['versions']['torch']}, input {settings['input']}, hidden {settings['hidden']}, "
             f"{DTYPES[settings['precision']]}{theirs}; medians of {settings['repeats']} runs, ms", "",
             "Forward (torch.no_grad()):", ""]
    head = ["cell", "T", "B", "layers", "rung", "bench ms", "CellRNN ms", "CellRNN host ms", "cuDNN ms",
            "CellRNN/bench", "speedup vs cuDNN", "CellRNN ms after cuDNN's call",
            "CellRNN host ms after cuDNN's call"]
    head += ["CellRNN graph ms", "cuDNN graph ms"] if graph else []
    head += ["check (max abs diff)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        f = r["forward"]
        ours, theirs = median(f, "CellRNN"), median(f, "cuDNN")
        cells = [r["cell"], r["seq"], r["batch"], r["layers"], r["rung"] or "", ms(bench_ms(r, "forward")),
                 ms(ours), ms(median(f, "CellRNN", "host")), ms(theirs), ratio(ours, bench_ms(r, "forward")),
                 ratio(theirs, ours, "x"), ms(median(f, "CellRNN", "device_after_other")),
                 ms(median(f, "CellRNN", "host_after_other"))]
        if graph:
            cells += [ms(median(r["graph"], "CellRNN")), ms(median(r["graph"], "cuDNN"))]
        cells.append(check_text(r))
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if record["settings"]["train"]:
        step = "backward, SGD's step" if settings.get("optimizer") == "sgd" else "backward"
        lines += ["", f"Training step (forward, loss = y.pow(2).mean(), {step}):", ""]
        head = ["cell", "T", "B", "layers", "rung", "bench --train ms", "CellRNN ms", "cuDNN ms",
                "CellRNN/bench", "speedup vs cuDNN", "CellRNN ms after cuDNN's step",
                "CellRNN back to back ms", "cuDNN back to back ms", "check (grad rel error)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            t = r["train"] or {}
            ours, theirs = median(t, "CellRNN"), median(t, "cuDNN")
            error = t.get("grad_rel_error")
            check = ("" if not t else ("ok" if t.get("ok") else "FAILED")
                     + ("" if error is None else f" ({error:.1e})"))
            together = t.get("back_to_back") or {}
            cells = [r["cell"], r["seq"], r["batch"], r["layers"], r.get("train_rung") or "",
                     ms(bench_ms(r, "train")),
                     ms(ours), ms(theirs), ratio(ours, bench_ms(r, "train")), ratio(theirs, ours, "x"),
                     ms(median(t, "CellRNN", "device_after_other")),
                     *(ms(together[name]["median_ms"] if name in together else None)
                       for name in ("CellRNN", "cuDNN")), check]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    if record["compile"]:
        lines += ["", "torch.compile(model, fullgraph=True) of embedding -> CellRNN -> linear, forward:", ""]
        head = ["cell", "T", "B", "layers", "rung", "eager ms", "compiled ms", "speedup", "compile s",
                "result"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in record["compile"]:
            eager, comp = median(c, "eager"), median(c, "compiled")
            failure = "failed: " + ((c["error"] or "").splitlines() or [""])[0][:160]
            result = "ok" if c["ok"] else c.get("skipped") or failure
            cells = [c["cell"], c["seq"], c["batch"], c["layers"], c.get("rung") or "", ms(eager), ms(comp),
                     ratio(eager, comp, "x"), "" if c["compile_s"] is None else f"{c['compile_s']:.1f}",
                     result.replace("|", "/")]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    problems = [r for r in rows if r["error"] or (r["train"] or {}).get("error")]
    notes = []
    for r in rows:
        for mode, b in r["bench"].items():
            if b and not b.get("ok") and b.get("note"):
                notes.append(f"- {r['cell']} T={r['seq']} B={r['batch']} layers={r['layers']}: bench {mode}: "
                             f"{b['note'].splitlines()[0][:300]}")
        for name, g in (r["graph"] or {}).items():
            if isinstance(g, dict) and g.get("error"):
                notes.append(f"- {r['cell']} T={r['seq']} B={r['batch']} layers={r['layers']}: graph {name}: "
                             f"{g['error'].splitlines()[0][:300]}")
    if problems:
        lines += ["", "Failures:"]
        for r in problems:
            text = r["error"] or r["train"]["error"]
            lines.append(f"- {r['cell']} T={r['seq']} B={r['batch']} layers={r['layers']}: "
                         f"{text.splitlines()[0][:300]}")
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU ({platform.processor() or platform.machine()}; CellRNN on the numpy executor)"


def _list(kind: Callable[[str], object], allowed: tuple | None = None):
    def parse(text: str) -> list:
        items = [kind(t.strip()) for t in text.split(",") if t.strip()]
        if allowed is not None:
            bad = [i for i in items if i not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {', '.join(map(str, bad))}; choose from "
                                                 f"{', '.join(allowed)}")
        return items

    return parse


def _positive_ints(text: str) -> list[int]:
    items = _list(int)(text)
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas")
    return items


def _bench_modes(text: str) -> list[str]:
    return [] if text.strip() in ("", "none") else _list(str, BENCH_MODES)(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--cells", type=_list(str, CELLS), default=list(CELLS), help="comma-separated: lstm,gru")
    p.add_argument("--batches", type=_positive_ints, default=[1, 8, 64, 256])
    p.add_argument("--seqs", type=_positive_ints, default=[100, 1000])
    p.add_argument("--layers", type=_positive_ints, default=[1, 4])
    p.add_argument("--input", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each implementation")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs of each before its timed ones")
    p.add_argument("--schedule", choices=["auto", *SCHEDULES], default="auto", help="CellRNN's schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bench", type=_bench_modes, default=list(BENCH_MODES),
                   help="which `cellfuse bench` runs to compare with: forward,train (default), forward, "
                        "train, or none")
    p.add_argument("--no-train", dest="train", action="store_false", help="leave out the training step")
    p.add_argument("--optimizer", choices=["none", "sgd"], default="none",
                   help="end each training step with this optimizer's step (sgd: torch.optim.SGD)")
    p.add_argument("--precision", choices=list(DTYPES), default="fp32",
                   help="x and torch's module in this dtype (16 bits: CellRNN's parameters float32 as under "
                        "torch.autocast; in fp16 the training step's loss scaled as GradScaler does)")
    p.add_argument("--cudnn-precision", choices=list(DTYPES),
                   help="torch's module in this dtype instead of --precision's (fp16 beside bf16: cuDNN at "
                        "its best)")
    p.add_argument("--graph", action="store_true", help="also time the replay of a CUDA graph capture")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="leave out torch.compile of the language model")
    p.add_argument("--compile-case", type=_positive_ints, metavar="T,B,LAYERS",
                   help="the language model's sizes (default: the shortest T, B=64 or else the largest B, "
                        "the fewest layers of the run)")
    p.add_argument("--vocab", type=int, default=1000, help="the language model's vocabulary")
    p.add_argument("--budget-s", type=float,
                   help="after this many seconds, start no case, nor the bench or graph part of one")
    p.add_argument("--out", type=Path, required=True, help="the JSON record")
    args = p.parse_args(argv)
    for name in ("input", "hidden", "repeats", "vocab"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    if not args.cells:
        p.error("--cells: name at least one of lstm, gru")
    if args.compile_case is None:
        batch = 64 if 64 in args.batches else max(args.batches)
        args.compile_case = [min(args.seqs), batch, min(args.layers)]
    if len(args.compile_case) != 3:
        p.error("--compile-case: expected T,B,LAYERS")
    args.cudnn_precision = args.cudnn_precision or args.precision
    if args.cudnn_precision != args.precision:  # the training steps compare one dtype's gradients
        args.train = False
    if args.precision != "fp32":  # (the language model is compiled in float32 only)
        args.compile = False
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("cellrnn_vs_cudnn: --device cuda, and torch sees no CUDA device", file=sys.stderr)
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
    # Float32 against float32: torch would otherwise let cuDNN and cuBLAS round inputs to TF32.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    clock = Clock(device)
    versions = {"cellfuse": __version__, "torch": torch.__version__, "python": platform.python_version(),
                "numpy": np.__version__}
    if device.type == "cuda":
        versions.update(cuda=torch.version.cuda, cudnn=str(torch.backends.cudnn.version()))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    record = {
        "script": "benchmarks/cellrnn_vs_cudnn.py",
        "command": shlex.join(["python", "benchmarks/cellrnn_vs_cudnn.py", *argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_description(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "versions": versions,
        "settings": settings,
        "timing": ("CUDA events around each call (device ms) and perf_counter until the call returns (host "
                   "ms), the device synchronised between runs" if device.type == "cuda" else
                   "perf_counter around each call") + f"; median of {args.repeats} runs after {args.warmup} "
                  "warm-up runs, taken in turns of two calls each: reported, the second (after its own "
                  "call); kept as *_after_other, the first (after the other library's call)",
        "check": {"y_max_abs_diff": TOLERANCE, "grad_rel_error": GRAD_TOLERANCE, "grad_floor": GRAD_FLOOR},
        "rows": [], "compile": [], "elapsed_s": 0.0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        record["elapsed_s"] = time.perf_counter() - t0
        atomic_write(args.out, (json.dumps(record, indent=1) + "\n").encode())

    cases = sorted(((kind, seq, batch, layers) for kind in args.cells for layers in args.layers
                    for seq in args.seqs for batch in args.batches),
                   key=lambda c: (c[1] * c[2] * c[3], c[3], CELLS.index(c[0])))
    t0 = time.perf_counter()
    args.deadline = None if args.budget_s is None else t0 + args.budget_s
    if args.compile:  # first, so that the budget never leaves it out
        seq, batch, layers = args.compile_case
        for kind in args.cells:
            print(f"torch.compile: {kind} language model T={seq} B={batch} layers={layers}", file=sys.stderr,
                  flush=True)
            record["compile"].append(compile_part(kind, seq, batch, layers, args, device, clock))
            write()
    for i, (kind, seq, batch, layers) in enumerate(cases):
        name = f"{kind} T={seq} B={batch} layers={layers}"
        elapsed = time.perf_counter() - t0
        if out_of_time(args):
            record["rows"].append({"cell": kind, "seq": seq, "batch": batch, "layers": layers, "rung": None,
                                   "ok": False, "error": None, "skipped": "skipped: time budget",
                                   "max_abs_diff": None, "forward": None, "train": None, "bench": {},
                                   "graph": None})
            continue
        print(f"[{i + 1}/{len(cases)}] {name} ({elapsed:.0f} s)", file=sys.stderr, flush=True)
        row = run_case(kind, seq, batch, layers, args, device, clock)
        record["rows"].append(row)
        forward = row["forward"]
        summary = (f"rung {row['rung']}, CellRNN {ms(median(forward, 'CellRNN'))} ms, cuDNN "
                   f"{ms(median(forward, 'cuDNN'))} ms" if forward else f"FAILED: {row['error']}")
        print(f"    {summary} ({row['wall_s']:.1f} s)", file=sys.stderr, flush=True)
        write()
    write()
    print(tables(record))
    print(f"\nwrote {args.out} ({record['elapsed_s']:.0f} s)")
    failed = [r for r in record["rows"] if not r["ok"] and not r.get("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
