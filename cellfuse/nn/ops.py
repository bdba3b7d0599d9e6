"""CellRNN's forward and backward passes as PyTorch custom operators, `cellfuse::rnn` and
`cellfuse::rnn_backward`, so that torch.compile and torch.export see them as single ops (with
fake-tensor implementations that give their outputs' shapes) and autograd joins them through
`register_autograd`.

An op names its cell by the cell's text (the .cell.json format, on one line), and its sizes, schedule and
the states a 16-bit plan keeps in float32 (float32_text) by value, so an exported program holds everything
it needs; the runner of each (cell, sizes, schedule, dtype, device, float32 states) is made at its first
call and kept (the last MAX_RUNNERS of them) for the process. Under `auto` the rung is the one measured
fastest as a module calls it (auto_choice): a call that saves its steps names it AUTO_TRAINING instead
(`run`), so that its plans are those measured fastest in training, and its backward call, its fake
implementations' and torch.export's programs find the same plans by the name they are given. Where
both names stand for one rung, one runner (kept under the rung's name too) makes the calls of both.

In eager mode `run` calls the same runner without the dispatcher (see _Eager), or, where nothing is saved
for a backward pass, with no autograd at all.

Calls from several threads are safe: a runner's memory is one run's at a time (its `lock`), a loaded
module's runs are put on the streams one at a time (StreamProgram.turn), and the caches here change under
one lock; a thread that wants a runner that another is making waits for it rather than making it again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from functools import lru_cache, partial

import torch
from torch.autograd.function import once_differentiable

from ..codegen import SCHEDULES
from ..gpu_runtime.auto_schedule import AUTO
from ..gpu_runtime.driver import use_primary_context
from ..graph_model import Cell, CellError, Sizes, cell_from_text, cell_to_text
from ..graph_model.lengths import STEPS_LEFT, masked
from .auto_choice import choose
from .kept_tensors import kept_tensors
from .runners import FORWARD, FORWARD_BESIDE, PRECISIONS, Plans, Runner, make_plans, precision_of
from .tracing import traced
from .weight_views import WeightViews

log = logging.getLogger(__name__)

MAX_RUNNERS = 16  # runners (sizes, dtypes, devices, rungs) whose plans and programs the process keeps

_plans: OrderedDict[tuple, Plans] = OrderedDict()
_runners: OrderedDict[tuple, Runner] = OrderedDict()
_caches = threading.Lock()  # the caches of this module
_making: dict[tuple, threading.Lock] = {}  # (a cache's id, a key) -> held while its value is made


def cell_text(cell: Cell) -> str:
    """How the ops name a cell: its file's text on one line (code that torch.compile generates around an
    op holds its string arguments, and a string of many lines broke inductor's)."""
    return json.dumps(json.loads(cell_to_text(cell)), separators=(",", ":"))


@torch.compiler.assume_constant_result  # (torch.compile calls it as it traces, as a constant)
def masked_text(cell: str) -> str:
    """The text of the cell that runs each batch row to its own length (graph_model.lengths)."""
    return _masked_text(cell)


@lru_cache(maxsize=MAX_RUNNERS)
def _masked_text(cell: str) -> str:
    return cell_text(masked(cell_from_text(cell)))


def masked_float32(float32: str) -> str:
    """The float32 states (float32_text) of the cell that runs each row to its own length: the count of
    steps left among them whatever else is (see stacks.steps_left)."""
    kept = float32_states(float32)
    return float32 if kept is None else float32_text([*kept, STEPS_LEFT])


def _found(cache: OrderedDict, key: tuple):
    """The cache's value of the key (made the most recently used), or None."""
    with _caches:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
        return value


def _remember(cache: OrderedDict, key: tuple, make):
    value = _found(cache, key)
    if value is not None:
        return value
    with _caches:
        making = _making.setdefault((id(cache), key), threading.Lock())
    # one thread makes it (compiling, maybe measuring, for seconds); another that wants it waits for it,
    # and those that want something else go on
    with making:
        value = _found(cache, key)
        if value is not None:
            return value
        try:
            value = make()
        except BaseException:
            with _caches:
                _making.pop((id(cache), key), None)
            raise
        with _caches:  # (kept and no longer being made at once: a thread between would make it again)
            cache[key] = value
            # (a runner may be kept under two keys: `auto`'s and its rung's)
            if len({id(v) for v in cache.values()}) > MAX_RUNNERS:
                _drop_oldest(cache)
            _making.pop((id(cache), key), None)
        return value


def _drop_oldest(cache: OrderedDict) -> None:
    """The least recently used value dropped, under every key it is kept by (a value's use is its last
    key's: `auto`'s runner is kept under its rung's key too), and a backward pass that still needs it
    makes it again; but not a runner whose packed weights a user's CUDA graph captured: its replays read
    and write them, and run its programs' kernels, without a call here to find it, for as long as the
    graph lives (the process, as far as the runner can tell)."""
    last = {id(value): (i, value) for i, value in enumerate(cache.values())}
    for _, value in sorted(last.values(), key=lambda t: t[0]):
        if not getattr(value, "captured", False):
            for key in [k for k, v in cache.items() if v is value]:
                del cache[key]
            return


def _share(direction: int) -> int:
    """How many runs share the GPU side by side with a call of this direction."""
    return 2 if direction >= FORWARD_BESIDE else 1


_ways: OrderedDict[tuple, bool] = OrderedDict()


def side_by_side(cell: str, x: torch.Tensor, hidden: int, schedule: str, save: bool = False) -> bool:
    """Whether a bidirectional layer of the cell over x (on a GPU) runs its two directions side by side:
    under `auto`, as measured for its sizes (auto_schedule's Choice.beside: the persistent rungs on half
    of the SMs may take longer side by side than one after the other), in training where the call
    `save`s its steps; with a rung named, always."""
    if schedule != AUTO:
        return True
    T, B, inputs = x.shape
    key = (cell, T, B, inputs, hidden, x.device.index, x.dtype, save)
    sizes = Sizes(seq=T, batch=B, input=inputs, hidden=hidden, layers=1)

    def measured() -> bool:
        with made_current(x):
            return choose(cell_from_text(cell), sizes, x.device, bidirectional=True,
                          precision=precision_of(x.dtype), train=save).beside
    return _remember(_ways, key, measured)


# How `run` names `auto` in a call that saves its steps for a backward pass (see the module's docstring)
AUTO_TRAINING = "auto, training"


def check_schedule(schedule: str) -> None:
    """A module's schedule: `auto` or a rung (not AUTO_TRAINING, the ops' own name); else CellError."""
    if schedule != AUTO and schedule not in SCHEDULES:
        raise CellError(f"unknown schedule {schedule!r} (schedules: {AUTO}, {', '.join(SCHEDULES)})")


def schedule_of(schedule: str, save: bool) -> str:
    """The schedule the ops are given for a module's `schedule` in a call that does or does not `save`."""
    return AUTO_TRAINING if save and schedule == AUTO else schedule


# How the ops name the states a 16-bit plan keeps in float32: DEFAULT_FLOAT32 for those that accumulate
# (codegen.precision), else FLOAT32_PREFIX and their ids, comma-separated (none: the prefix alone).
DEFAULT_FLOAT32, FLOAT32_PREFIX = "", "float32:"


def float32_text(states: Collection[str] | None) -> str:
    return DEFAULT_FLOAT32 if states is None else FLOAT32_PREFIX + ",".join(sorted(states))


def float32_states(text: str) -> list[str] | None:
    """The states of a float32_text (None: those that accumulate)."""
    if text == DEFAULT_FLOAT32:
        return None
    if not text.startswith(FLOAT32_PREFIX):
        raise CellError(f"{text!r} names no float32 states (expected {FLOAT32_PREFIX!r} and state ids)")
    return [s for s in text.removeprefix(FLOAT32_PREFIX).split(",") if s]


def plans(cell: str, seq: int, batch: int, input_size: int, hidden: int, layers: int, schedule: str,
          device: torch.device, direction: int = FORWARD, precision: str = "fp32",
          float32: str = DEFAULT_FLOAT32) -> Plans:
    """`float32`: the states a 16-bit plan keeps in float32 (float32_text; float32 plans ignore it)."""
    sizes = Sizes(seq=seq, batch=batch, input=input_size, hidden=hidden, layers=layers)
    share = _share(direction) if device.type == "cuda" else 1
    float32 = DEFAULT_FLOAT32 if precision == "fp32" else float32
    key = (cell, sizes, schedule, device.type, device.index, share, precision, float32)

    def make() -> Plans:
        parsed, rung = cell_from_text(cell), schedule
        if schedule in (AUTO, AUTO_TRAINING):  # (with share 2: for both directions side by side)
            choice = choose(parsed, sizes, device, bidirectional=share == 2, precision=precision,
                            train=schedule == AUTO_TRAINING)
            log.info("%s", choice.why)
            rung = choice.schedule
        return make_plans(parsed, sizes, rung, device, share, precision, float32_states(float32))
    return _remember(_plans, key, make)


def reserve_bytes(plans: Plans, device_type: str, dtype: torch.dtype) -> int:
    """The bytes of a forward run's reserve, known before it runs (for torch.compile's fake tensors)."""
    if device_type == "cpu":  # (the numpy executor's buffers: float64, or float32, 16-bit ones emulated)
        itemsize = 8 if dtype == torch.float64 else 4
        return itemsize * sum(plans.train.buffer_elements(name) for name in plans.train.buffers)
    from .cuda_runner import Memory

    return Memory(plans.train, plans.backward).reserve_bytes


def runner(cell: str, x: torch.Tensor, hidden: int, layers: int, schedule: str, direction: int = FORWARD,
           float32: str = DEFAULT_FLOAT32) -> Runner:
    """The runner of the op's arguments (made, and its plans with it, at the first call): one per
    direction of a layer (its own packed weights and programs), so that the two run side by side."""
    T, B, inputs = x.shape
    float32 = float32 if x.dtype in PRECISIONS else DEFAULT_FLOAT32  # (float32 plans keep every state so)
    key = (cell, T, B, inputs, hidden, layers, schedule, x.dtype, x.device, direction, float32)
    found = _found(_runners, key)  # (before `make` is built: the call of every forward pass)
    if found is not None:
        return found

    def make() -> Runner:
        p = plans(cell, T, B, inputs, hidden, layers, schedule, x.device, direction, precision_of(x.dtype),
                  float32)
        if p.schedule != schedule:  # (auto: one runner of the rung for both grad modes and a named one)
            named = (*key[:_SCHEDULE_AT], p.schedule, *key[_SCHEDULE_AT + 1:])
            return _remember(_runners, named, partial(_made, p, x, direction))
        return _made(p, x, direction)
    return _remember(_runners, key, make)


_SCHEDULE_AT = 6  # where a runner's key (see `runner`) holds the schedule


def _made(plans: Plans, x: torch.Tensor, direction: int) -> Runner:
    """A new runner of the plans for tensors like x (its buffers kept: see kept_tensors)."""
    with kept_tensors():
        if x.device.type == "cpu":
            from .runners import NumpyRunner

            return NumpyRunner(plans, x.dtype)
        from .cuda_runner import CudaRunner

        return CudaRunner(plans, x.device, direction)


def made_current(x: torch.Tensor):
    """The tensors' device made current, where it is not (the kernels load into its context); on a
    thread's first call, for the driver too (use_primary_context)."""
    if x.device.type != "cuda" or on_device(x.device.index):
        return _NOTHING
    if x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)  # (the runtime makes the context current as it sets the device)
    use_primary_context(x.device.index)
    _thread.has_context = True
    return _NOTHING


def on_device(index: int) -> bool:
    """Whether a call on CUDA device `index` needs nothing of made_current: the device current, for the
    driver too."""
    return index == torch.cuda.current_device() and getattr(_thread, "has_context", False)


_NOTHING = contextlib.nullcontext()
_thread = threading.local()


def rnn_impl(x: torch.Tensor, states: list[torch.Tensor], params: list[torch.Tensor], cell: str, hidden: int,
             layers: int, schedule: str, save: bool, direction: int, float32: str) -> list[torch.Tensor]:
    """[y, *final states, reserve]: the forward pass of `layers` of the cell over x [T, B, input] from the
    initial states (each [layers, B, hidden], in the cell's order of states), the parameters in the
    order of the .npz keys; the reserve holds the steps for `rnn_backward` where `save`, else is empty.
    `direction`: which direction of a layer the call runs, alone or beside the other (FORWARD, ...);
    `float32`: the states a 16-bit plan keeps in float32 (float32_text)."""
    return _forward(x, states, params, cell, hidden, layers, schedule, save, direction, float32, shared=False)


def _forward(x, states, params, cell, hidden, layers, schedule, save, direction, float32, shared: bool
             ) -> list[torch.Tensor]:
    """rnn's outputs; where `shared` (not through the op, which wants outputs of their own, and without
    saved steps), y and the final states may be views of one piece of memory."""
    with made_current(x):
        r = runner(cell, x, hidden, layers, schedule, direction, float32)
        with r.lock:
            y, finals, reserve = r.forward(x, states, params, save, shared)
    return [y, *finals, reserve]


rnn = torch.library.custom_op("cellfuse::rnn", rnn_impl, mutates_args=())


@rnn.register_fake
def _rnn_fake(x, states, params, cell, hidden, layers, schedule, save, direction, float32):
    T, B, inputs = (int(n) for n in x.shape)  # a plan is made for sizes, not for symbols
    p = plans(cell, T, B, inputs, hidden, layers, schedule, x.device, direction, precision_of(x.dtype),
              float32)
    nbytes = reserve_bytes(p, x.device.type, x.dtype) if save else 0
    return [x.new_empty((T, B, hidden)), *(s.new_empty(s.shape) for s in states),
            x.new_empty((nbytes,), dtype=torch.uint8)]


def rnn_backward_impl(dy: torch.Tensor, dfinals: list[torch.Tensor], x: torch.Tensor,
                      states: list[torch.Tensor], params: list[torch.Tensor], y: torch.Tensor,
                      reserve: torch.Tensor, cell: str, hidden: int, layers: int,
                      schedule: str, direction: int, input_grad: bool = True,
                      float32: str = DEFAULT_FLOAT32) -> list[torch.Tensor]:
    """[dx, *d initial states, *the parameters' gradients grouped (TensorLayout.gradients)] of the forward
    pass that returned y and the reserve, for the seeds dy and dfinals; without `input_grad` (x needs no
    gradient) dx is not computed, and is an empty tensor here. (True by default: graphs compiled before
    the op took it, kept in torch.compile's caches on disk, call it without; so `float32`, the forward's.)
    A 16-bit pass's gradients are float32: dx and the initial states' are given back in their dtypes, the
    parameters' float32 (`param_grad_dtype`)."""
    dx, dstates, dparams, _ = _runner_backward(dy, dfinals, x, states, params, y, reserve, cell, hidden,
                                               layers, schedule, direction, input_grad, float32)
    return [x.new_empty(0) if dx is None else dx, *dstates, *dparams]


# `into` of _runner_backward for parameters that are tensors of their own (TensorLayout.own_places): on a
# GPU the gathering kernel writes each one's gradient, without the grouped tensors and the views of them
# that TensorLayout.param_gradients makes
OWN_TENSORS = "own tensors"


def _runner_backward(dy, dfinals, x, states, params, y, reserve, cell, hidden, layers, schedule, direction,
                     input_grad, float32, into=None) -> tuple:
    """The runner's backward pass: dx (None without `input_grad`) and the initial states' gradients in
    their dtypes, the parameters' grouped, and False; or, with `into` (weight_views.Places of the tensors
    the parameters are views of, or OWN_TENSORS) where the runner writes those itself, the gradients of
    those tensors, and True."""
    with made_current(x):
        r = runner(cell, x, hidden, layers, schedule, direction, float32)
        with r.lock:
            places = getattr(r, "places_gradients", None)  # (a CUDA runner's)
            if into is OWN_TENSORS and places is not None:
                into = r.layout.own_places
            placed = into is not None and places is not None and places(input_grad, into)
            dx, dstates, dparams = r.backward(dy, dfinals, x, list(states), list(params), y, reserve,
                                              input_grad, *([into] if placed else []))
    return (None if dx is None else dx.to(x.dtype),
            [d.to(s.dtype) for d, s in zip(dstates, states, strict=True)], dparams, placed)


def param_grad_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of a backward pass's parameter gradients: float32 for a 16-bit x's (float32 parameters, as
    under torch.autocast), else x's."""
    return torch.float32 if x.dtype in PRECISIONS else x.dtype


rnn_backward = torch.library.custom_op("cellfuse::rnn_backward", rnn_backward_impl, mutates_args=())


@rnn_backward.register_fake
def _rnn_backward_fake(dy, dfinals, x, states, params, y, reserve, cell, hidden, layers, schedule,
                       direction, input_grad=True, float32=DEFAULT_FLOAT32):
    T, B, inputs = (int(n) for n in x.shape)
    layout = plans(cell, T, B, inputs, hidden, layers, schedule, x.device, direction, precision_of(x.dtype),
                   float32).layout
    dtype = param_grad_dtype(x)
    return [x.new_empty(x.shape if input_grad else (0,)), *(s.new_empty(s.shape) for s in states),
            *(x.new_empty(shape, dtype=dtype) for shape in layout.grouped_shapes())]


def _setup_context(ctx, inputs, output) -> None:
    x, states, params, cell, hidden, layers, schedule, save, direction, float32 = inputs
    ctx.meta = (len(states), len(params), cell, hidden, layers, schedule, save, direction, float32)
    ctx.save_for_backward(x, *states, *params, output[0], output[-1])


def _gradients(ctx, grads: Sequence[torch.Tensor | None], none_seeds: bool, into=None) -> tuple:
    """dx (None where x needs no gradient: the backward pass then leaves it out), the initial states' and
    the parameters' gradients given the seeds, through the op where `into` is None (a graph of
    torch.compile's calls it), else from the runner itself (`_runner_backward`: into the tensors of
    `into` where it can, which a fourth value says); a final state's None seed stays None where
    `none_seeds` (no seed added), else is zeros, as y's always is."""
    n_states, n_params, cell, hidden, layers, schedule, save, direction, float32 = ctx.meta
    if not save:
        raise CellError("this forward pass ran without saving its steps (no gradient was needed when it "
                        "ran, or torch.jit.trace traced it: its traces run inference only), so it has no "
                        "backward pass")
    x, *rest = ctx.saved_tensors
    states, params = rest[:n_states], rest[n_states:n_states + n_params]
    y, reserve = rest[-2], rest[-1]
    dy = grads[0] if grads[0] is not None else torch.zeros_like(y)
    dfinals = [g if g is not None or none_seeds else torch.zeros_like(s)
               for g, s in zip(grads[1:1 + n_states], states, strict=True)]
    input_grad = ctx.needs_input_grad[0]
    if into is None:
        out = torch.ops.cellfuse.rnn_backward(dy, dfinals, x, list(states), list(params), y, reserve, cell,
                                              hidden, layers, schedule, direction, input_grad, float32)
        dx = out[0] if input_grad else None
        dstates, dparams, placed = list(out[1:1 + n_states]), out[1 + n_states:], False
    else:
        dx, dstates, dparams, placed = _runner_backward(dy, dfinals, x, states, params, y, reserve, cell,
                                                        hidden, layers, schedule, direction, input_grad,
                                                        float32, into)
    if placed:
        return dx, dstates, dparams, True
    T, B, inputs = x.shape
    layout = plans(cell, T, B, inputs, hidden, layers, schedule, x.device, direction, precision_of(x.dtype),
                   float32).layout
    return dx, dstates, layout.param_gradients(dparams, x), False


def _op_backward(ctx, grads):
    dx, dstates, dparams, _ = _gradients(ctx, grads, none_seeds=False)
    return dx, dstates, dparams, None, None, None, None, None, None, None


rnn.register_autograd(_op_backward, setup_context=_setup_context)


_LEADING = 11  # _Eager.forward's arguments before its tensors (x, cell, ..., views, ends)


class _Eager(torch.autograd.Function):
    """The same forward and backward passes as the ops, called without the dispatcher: in eager mode the
    op's dispatch and checks cost more host time than the kernels of a small forward pass take on the
    GPU (on an H200, about 90 microseconds a call: docs/results/2026-11-28-cellrnn-in-torch.md)."""

    @staticmethod
    def forward(ctx, x, cell, hidden, layers, schedule, save, direction, float32, n_states, views, ends,
                *tensors):
        """`tensors`: the initial states, then the parameters, or where `views` (a WeightViews) holds
        the weights, their sources (the views go by, out of autograd's sight). `ends` (a PackedSequence's
        packed_sequences.Ends): x is its data, padded here, and y is given back packed, the final states
        in the batch's order of rows (the states too are given in it)."""
        # (ctx in forward: a separate setup_context makes autograd bind the arguments by inspect, slowly)
        # Outputs that nothing used get None, not zeros, in backward: a final state no loss reads adds no
        # seed, where zeros would cost an allocation, a fill and an addition each
        ctx.set_materialize_grads(False)
        states = list(tensors[:n_states])
        params = list(tensors[n_states:]) if views is None else list(views)
        ctx.views, ctx.ends = views, ends
        if ends is not None:
            x, left = ends.padded(x)
            states = [*ends.sorted(states), left]
        output = rnn_impl(x, states, params, cell, hidden, layers, schedule, save, direction, float32)
        _setup_context(ctx, (x, states, params, cell, hidden, layers, schedule, save, direction, float32),
                       output)
        if ends is not None:  # (the steps-left state's final left out)
            output = [ends.packed(output[0]), *ends.unsorted(output[1:n_states + 1]), output[-1]]
        ctx.mark_non_differentiable(output[-1])
        return tuple(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        ends = ctx.ends
        if ends is not None:
            dy = None if grads[0] is None else ends.gradient_padded(grads[0])
            grads = (dy, *ends.sorted(grads[1:-1]), None)
        # (the gradients of a WeightViews' sources where its places are known, else each parameter's)
        views = ctx.views
        places = None if views is None else views.places()
        into = OWN_TENSORS if places is None else places
        dx, dstates, dparams, placed = _gradients(ctx, grads, none_seeds=True, into=into)
        if ends is not None:
            dx = None if dx is None else ends.packed(dx)
            given = dstates[:-1]  # (the steps-left state was made here: no gradient goes back)
            needed = ctx.needs_input_grad[_LEADING:_LEADING + len(given)]
            dstates = ends.unsorted([d if need else None for d, need in zip(given, needed, strict=True)])
        if views is not None:
            needed = ctx.needs_input_grad[_LEADING + len(dstates):]
            dparams = ([d if need else None for d, need in zip(dparams, needed, strict=True)]
                       if placed and places is not None else views.gradients(dparams, needed))
        return dx, *(None,) * (_LEADING - 1), *dstates, *dparams


def run(x: torch.Tensor, states: list[torch.Tensor], params: Sequence[torch.Tensor], cell: str, hidden: int,
        layers: int, schedule: str, save: bool, direction: int = FORWARD, float32: str = DEFAULT_FLOAT32,
        ends=None) -> Sequence[torch.Tensor]:
    """[y, *final states, reserve] of `rnn`: through the op where torch.compile or torch.export traces
    (fake or functional tensors), else straight to the runner (`float32`: the states a 16-bit plan keeps
    in float32, float32_text). Where `params` is a WeightViews, autograd sees its sources instead (see
    weight_views). `ends`: a training call's PackedSequence, x its data (see _Eager.forward). `auto` in a
    call that saves is AUTO_TRAINING."""
    schedule = schedule_of(schedule, save)
    if traced() or type(x) is not torch.Tensor:
        return torch.ops.cellfuse.rnn(x, states, list(params), cell, hidden, layers, schedule, save,
                                      direction, float32)
    if not save:  # no backward pass to follow: nothing for autograd to record
        return _forward(x, states, params, cell, hidden, layers, schedule, save, direction, float32,
                        shared=True)
    views = params if isinstance(params, WeightViews) else None
    return _Eager.apply(x, cell, hidden, layers, schedule, save, direction, float32, len(states), views, ends,
                        *states, *(params if views is None else views.sources))
