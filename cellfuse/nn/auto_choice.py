"""`auto` for cellfuse.nn's modules: the rungs timed as a module calls them.

The benchmark (auto_schedule.bench_times) checks every candidate rung against the reference and times it
replaying a CUDA graph. A module's call puts a rung's launches on torch's stream from the host instead,
and a rung of launches every step (`graph`, `wavefront`) is then bound by them: on an H200 the bf16 LSTM
at T=100, B=8, four layers replayed the `graph` rung in 1.0 ms and called it in 7.7 ms, where the
`persistent` rung took 1.6 ms called. So here the rungs the benchmark checked are timed again through
the runner a module's call uses (CudaRunner's forward run, on random inputs), and `auto` keeps the fastest
of those times, remembered apart from the benchmark's choice (auto_schedule's `runs_as`). (Since then a
module's inference call replays a rung of launches every step from a CUDA graph of its own, and the
times, as called, come closer to the benchmark's.)

A training call (one that saves its steps for a backward pass) is planned with the rung whose forward and
backward passes together were fastest, chosen apart from the inference calls' choice: the fastest
forward pass need not be the fastest step (on an H200 the fp16 LSTM at B=8 ran its forward call fastest on
the `persistent` rung, whose backward pass multiplies on the CUDA cores, and the training step fastest on
`tensor`: docs/results/2026-12-01-g-lanes-of-mixed-layers-and-operand-copies.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from functools import partial

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..codegen.precision import PRECISIONS
from ..gpu_runtime import driver
from ..gpu_runtime.auto_schedule import REPEATS, Choice, bench_times, choose_schedule
from ..gpu_runtime.event_timing import median_ms
from ..graph_model import Cell, CellError, Sizes
from .kept_tensors import kept_tensors
from .runners import FORWARD, FORWARD_BESIDE, REVERSE_BESIDE, TORCH_DTYPES, make_plans

log = logging.getLogger(__name__)

# How a module's call runs the rungs, named in the remembered choices: a choice made for an earlier way is
# measured again (version 2: a rung that launches at every step is replayed from a CUDA graph, and a
# wavefront's GEMMs are picked for each layer's share of the SMs).
RUNS_AS = "called from PyTorch, version 2"
TRAINING = ", training"  # and after it, for the choices of training calls
WARMUP = 3  # untimed calls of each rung first (the first makes its programs)


def choose(cell: Cell, sizes: Sizes, device: torch.device, bidirectional: bool = False,
           precision: str = "fp32", train: bool = False) -> Choice:
    """The rung `auto` stands for in a module's call on the device (with `bidirectional`, for a layer of
    both directions, and whether they run side by side): of an inference call, or where `train`, of a
    training call."""
    if device.type != "cuda":
        return choose_schedule(cell, sizes, "numpy", bidirectional=bidirectional, precision=precision)
    return choose_schedule(cell, sizes, "cuda", partial(called_times, device, train=train), bidirectional,
                           precision, runs_as=RUNS_AS + (TRAINING if train else ""))


def called_times(device: torch.device, cell: Cell, sizes: Sizes, bidirectional: bool = False,
                 precision: str = "fp32", train: bool = False) -> dict[str, float]:
    """Median ms of a module's forward call of each rung that the benchmark checked (both directions side
    by side, where `bidirectional`), or where `train`, of its forward call that saves the steps and its
    backward call (the benchmark checked the gradients too); a rung that cannot run that way is left out,
    and where none can, the benchmark's times stand."""
    with _measuring:
        checked = bench_times(cell, sizes, bidirectional, precision, train)
        times = {}
        # (torch.compile and torch.export ask for the plans from the op's fake implementation, under their
        # dispatch modes: the rungs still run on real tensors; a call under torch.inference_mode() asks
        # too, and the inputs made for the timing are normal tensors, as a module's parameters are)
        with _disable_current_modes(), kept_tensors():
            for rung in checked:
                try:
                    times[rung] = _called_ms(cell, sizes, rung, device, bidirectional, precision, train)
                except CellError as e:
                    log.info("auto: '%s' ran in the benchmark but not as a module calls it (%s)", rung, e)
    return times or checked


# one measurement at a time in the process: two threads' first calls at new sizes would time each other
_measuring = threading.Lock()


def _called_ms(cell: Cell, sizes: Sizes, rung: str, device: torch.device, bidirectional: bool,
               precision: str, train: bool) -> float:
    from .cuda_runner import CudaRunner

    lanes = (FORWARD_BESIDE, REVERSE_BESIDE) if bidirectional else (FORWARD,)
    plans = make_plans(cell, sizes, rung, device, len(lanes), precision)
    runners = [CudaRunner(plans, device, lane) for lane in lanes]
    s = sizes
    generator = torch.Generator(device).manual_seed(0)
    dtype = TORCH_DTYPES[PRECISIONS[precision].name]
    x = torch.randn(s.seq, s.batch, s.input, device=device, generator=generator).to(dtype)
    states = [torch.zeros(s.layers, s.batch, s.hidden, device=device, dtype=x.dtype)
              for _ in plans.forward.state_ids]
    # Parameters, so that each is packed once, as a module's are
    params = [torch.nn.Parameter(0.1 * torch.randn(shape, device=device, generator=generator))
              for shape in plans.forward.params.values()]
    dy = torch.randn(s.seq, s.batch, s.hidden, device=device, generator=generator).to(dtype) if train \
        else None
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)

    def run(runner) -> None:
        if not train:
            runner.forward(x, states, params, save=False, shared=True)
            return
        # (as a training step's: the backward pass on the forward pass's stream, no seeds of the finals,
        # x's gradient too, as a model whose input is an embedding's wants it)
        y, finals, reserve = runner.forward(x, states, params, save=True)
        runner.backward(dy, [None] * len(finals), x, states, params, y, reserve)

    def call() -> None:
        if len(runners) == 1:
            run(runners[0])
            return
        side.wait_stream(main)
        with torch.cuda.stream(side):
            run(runners[1])
        run(runners[0])
        main.wait_stream(side)

    with contextlib.ExitStack() as held:  # (their replays are the process's: see cuda_runner._live)
        for runner in runners:
            held.enter_context(runner.lock)
        for _ in range(WARMUP):
            call()
        return median_ms(driver, call, driver.as_stream(main.cuda_stream), REPEATS, idle=True)
