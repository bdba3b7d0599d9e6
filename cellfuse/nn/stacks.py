"""Running a stack of layers through the ops: in one fused call, or a layer and a direction at a time
(two directions: the reverse one on each sequence reversed in time; dropout between layers while
training, torch's, from torch's generator, as torch.nn.LSTM's). CellRNN and the drop-ins for
torch.nn.LSTM and GRU share it.

With `lengths` (one per batch row, from 1 to T), each row stops at its own length in the kernels: the
ops run the cell of graph_model.lengths, whose extra last state starts at the rows' lengths; past its
length a row's output is zero and its states keep their values, so its final states are those of its
own last step. The reverse direction reverses each row within its own length (on a GPU by a kernel,
elsewhere a gather), so that it starts at the row's last step.

Inputs of bfloat16 or float16 run the plans of that precision, forward and backward (the states that
accumulate kept float32 inside; the backward pass's gradients float32, given back in the dtypes of what
they are the gradients of). Under torch.autocast, float32 inputs run in autocast's dtype, as torch's
RNN modules do (the parameters stay float32: the packed 16-bit weights are made from them when they
change).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch.autograd.function import once_differentiable

from ..gpu_runtime.driver import new_stream
from ..graph_model import CellError
from . import ops
from .row_kernels import rows_kernels
from .runners import DTYPES, FORWARD, PRECISIONS, direction_of
from .tracing import traced
from .zeros import made_here

if TYPE_CHECKING:
    from .quick_call import KeptLayers


def check_lengths(lengths: object, seq: int, batch: int) -> torch.Tensor:
    """The lengths as a 1-D int64 tensor of `batch` values from 1 to `seq` (on the CPU)."""
    if isinstance(lengths, torch.Tensor):
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise CellError(f"lengths must be integers, got a tensor of {lengths.dtype}")
        lengths = lengths.detach().to("cpu", torch.int64)
    else:
        try:
            lengths = torch.as_tensor(list(lengths), dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            raise CellError(f"lengths must be a sequence of integers, got {lengths!r}") from None
    if lengths.shape != (batch,):
        raise CellError(f"lengths has shape {list(lengths.shape)}, expected [{batch}] (one per batch row)")
    if traced():  # (their values are not known while the call is traced: the graph checks them as it runs)
        torch._assert_async(((lengths >= 1) & (lengths <= seq)).all(),
                            f"lengths must be from 1 to the sequence's length {seq}")
        return lengths
    if batch and (int(lengths.min()) < 1 or int(lengths.max()) > seq):
        raise CellError(f"lengths must be from 1 to the sequence's length {seq}, got "
                        f"{int(lengths.min())} to {int(lengths.max())}")
    return lengths


def read_lengths(lengths: object, seq: int, batch: int) -> torch.Tensor:
    """`lengths` read once, as a CPU int64 tensor: one given as such as it is (lengths_applied checks its
    values as it uses them), any other as check_lengths gives it (an iterator of them used up here, a GPU
    tensor of them copied to the host once)."""
    if type(lengths) is torch.Tensor and lengths.dtype == torch.int64 and lengths.is_cpu and not traced():
        return lengths
    return check_lengths(lengths, seq, batch)


def lengths_applied(x: torch.Tensor, lengths: torch.Tensor, layers: int, hidden: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, B, width] with each row's steps past its length zero (see padding_zeroed), the steps-left
    state of `layers` layers of `hidden` (steps_left) and the lengths, checked (`lengths`: as read_lengths
    gives them). On a GPU one launch of the zeroing kernel (codegen.packed_rows' cf_zero_rows, from C++:
    quick_lane's Rows.zeroed, the lengths in its arguments) checks the lengths and makes both, where
    torch's ops (the lengths copied to the GPU, a mask, a torch.where, the state made hidden wide) took a
    kept call's host 0.2 to 0.4 ms; where x needs a gradient, inside an autograd node whose backward
    zeroes the gradient's padding by the same kernel (_Zeroed). Elsewhere, torch's ops."""
    if x.is_cuda and not traced():
        kernels = rows_kernels(x, x.shape[1])
        if kernels is not None and kernels[1] is not None:
            stream = torch._C._cuda_getCurrentRawStream(x.get_device())
            # (where every row is T long, x as it is: its gradient flows to x as it is; lengths of another
            # shape go to the kernel's C++, which turns them down, and check_lengths says why)
            if (torch.is_grad_enabled() and x.requires_grad and lengths.shape == (x.shape[1],)
                    and int(lengths.min()) < x.shape[0]):
                zeroed, steps = _Zeroed.apply(x, lengths, kernels[1], layers, hidden, stream)
                return zeroed, steps, lengths
            done = kernels[1].zeroed(x, lengths, hidden, layers, stream)
            if done is not None:
                return done[0], done[1], lengths
    return _by_torch(x, lengths, layers, hidden)


def _by_torch(x: torch.Tensor, lengths: torch.Tensor, layers: int, hidden: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lengths_applied by torch's ops (which check the lengths, and say what is wrong with them)."""
    lengths = check_lengths(lengths, x.shape[0], x.shape[1])
    steps = steps_left(lengths, layers, x, hidden)
    return padding_zeroed(x, lengths, steps), steps, lengths


class _Zeroed(torch.autograd.Function):
    """lengths_applied's zeroed x and steps-left state by the kernel (`rows`: quick_lane's Rows), for an x
    that needs a gradient: x's gradient is the zeroed x's with its padding zeroed, by the same kernel
    (where the kernel turns either down, torch's ops do it)."""

    @staticmethod
    def forward(ctx, x, lengths, rows, layers: int, hidden: int, stream: int):
        done = rows.zeroed(x, lengths, hidden, layers, stream)
        if done is None:  # (lengths it turns down, say: torch's ops check them)
            done = _by_torch(x, lengths, layers, hidden)[:2]
        # (a copy: the caller's lengths may change in place before the backward pass)
        ctx.rows, ctx.lengths = rows, lengths.clone()
        ctx.mark_non_differentiable(done[1])
        ctx.set_materialize_grads(False)  # (the steps-left state's gradient: none, not zeros made)
        return done

    @staticmethod
    @once_differentiable
    def backward(ctx, dx, _dsteps):
        if dx is None:
            return None, None, None, None, None, None
        stream = torch._C._cuda_getCurrentRawStream(dx.get_device())
        done = ctx.rows.zeroed(dx, ctx.lengths, 1, 0, stream)
        if done is None:  # (a gradient of other strides, say)
            done = _by_torch(dx, ctx.lengths, 1, 1)
        return done[0], None, None, None, None, None


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype float32 inputs like x run in under torch.autocast on x's device (None: as they are)."""
    device = x.device.type
    if x.dtype != torch.float32 or device not in DTYPES or not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    return dtype if dtype in PRECISIONS else None


def padding_zeroed(x: torch.Tensor, lengths: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """x [T, B, width] with each row's steps past its length set to zero (`lengths` on the CPU, `steps`
    their steps-left state on x's device: the mask is made there, from it). The padding a caller gives may
    hold anything, and the cell that runs each row to its own length keeps a state as m * new + (1 - m) *
    old, which would carry a NaN or an infinity of the padding into it (0 * NaN is NaN). (A
    PackedSequence's padding is made of zeros already.)"""
    T = x.shape[0]
    if not traced() and int(lengths.min()) == T:
        return x
    ended = torch.arange(T, device=x.device).view(T, 1, 1) >= steps[0, :, :1].view(1, -1, 1)
    # (one kernel: masked_fill out of place is a copy of x, then the fill over it)
    return torch.where(ended, 0.0, x)


def steps_left(lengths: torch.Tensor, layers: int, x: torch.Tensor, hidden: int) -> torch.Tensor:
    """The initial value of the lengths' state: each row's length in each of its elements, per layer (in
    float32 where x is 16-bit: bf16 holds whole numbers exactly only up to 256)."""
    B = lengths.shape[0]
    dtype = torch.float32 if x.dtype in PRECISIONS else x.dtype
    return to_device(lengths.to(dtype), x).view(1, B, 1).expand(layers, B, hidden).contiguous()


def to_device(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A CPU tensor on like's device; to a GPU from pinned memory, so that the copy does not wait for the
    work already on the stream (a copy from pageable memory would); in a traced call, the graph's copy."""
    if t.device == like.device:
        return t
    if like.device.type == "cuda" and not traced():
        return t.pin_memory().to(like.device, non_blocking=True)
    return t.to(like.device)


def saves(x: torch.Tensor, states: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> bool:
    """Whether a call saves its steps: only where a backward pass may follow, and not in a trace of
    torch.jit.trace, which records inference alone (its check runs the call again without grad mode, and
    the two graphs must be the same)."""
    return (torch.is_grad_enabled() and not torch.jit.is_tracing()
            and any(t.requires_grad for t in (x, *states, *params)))


def run(x: torch.Tensor, states: Sequence[torch.Tensor], params: Sequence[torch.Tensor], cell: str,
        hidden: int, layers: int, schedule: str, lengths: torch.Tensor | None = None,
        direction: int = FORWARD, float32: str = ops.DEFAULT_FLOAT32, steps: torch.Tensor | None = None
        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """y and the final states of `layers` layers of the cell in one call of the ops (each row to its own
    length where `lengths` are given: see the module's docstring; `steps`: their steps-left state
    [layers, B, hidden] where it was made already, as a PackedSequence's padding makes it; `direction`
    and `float32`, the states a 16-bit plan keeps in float32, as the ops take them)."""
    states = list(states)
    save = saves(x, states, params)
    if lengths is not None:
        cell = ops.masked_text(cell)
        states.append(steps if steps is not None else steps_left(lengths, layers, x, hidden))
        float32 = ops.masked_float32(float32)
    out = ops.run(x, states, params, cell, hidden, layers, schedule, save, direction, float32)
    finals = list(out[1:1 + len(states)])
    return out[0], finals[:-1] if lengths is not None else finals


def _reversal(lengths: torch.Tensor | None, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reversal in time of [T, B, width] tensors like x: of the whole sequence, or of each row's
    first `lengths` steps (the steps after stay in place). With lengths on a GPU, one launch of
    codegen.packed_rows' cf_reverse_rows from C++ (quick_lane's Rows.reversed, the lengths in its
    arguments), where a gather by an index made on the host and copied from pinned memory took 0.15 ms
    of a bidirectional call's host time before its directions' launches on an H200; elsewhere (or for a
    tensor the kernel does not take), that gather."""
    if lengths is None:
        return lambda t: t.flip(0)
    kernels = rows_kernels(x, x.shape[1]) if x.is_cuda and not traced() else None
    if kernels is not None and kernels[1] is not None:
        return partial(_reversed, rows=kernels[1], lengths=lengths)
    return _gathered(lengths, x)


def _gathered(lengths: torch.Tensor, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """_reversal's gather, its index made for tensors like x."""
    T, B = x.shape[0], x.shape[1]
    steps = torch.arange(T).view(T, 1)
    ends = lengths.view(1, B)
    index = to_device(torch.where(steps < ends, ends - 1 - steps, steps), x)
    return lambda t: t.gather(0, index.view(T, B, 1).expand(T, B, t.shape[2]))


def _reversed(t: torch.Tensor, rows, lengths: torch.Tensor) -> torch.Tensor:
    """t reversed within each row's length by the kernel (`rows`: quick_lane's Rows), in an autograd node
    where t needs a gradient (_Reversed); by the gather where the kernel turns t down (another device
    current, say). The kernel reads rows whose elements are contiguous: others (the gradient of a sum
    comes as an expanded scalar, each element at stride 0) are made contiguous first, one copy, where
    the gather would make its index on the host and copy it to the GPU."""
    if torch.is_grad_enabled() and t.requires_grad:
        return _Reversed.apply(t, rows, lengths)
    if t.dim() == 3 and t.stride(2) != 1 and t.shape[2] != 1:
        t = t.contiguous()
    done = rows.reversed(t, lengths, torch._C._cuda_getCurrentRawStream(t.get_device()))
    return done if done is not None else _gathered(lengths, t)(t)


class _Reversed(torch.autograd.Function):
    """_reversed for a t that needs a gradient: the reversal is its own inverse and a permutation of the
    steps, so that t's gradient is the output's reversed the same way, by the same kernel."""

    @staticmethod
    def forward(ctx, t, rows, lengths):
        # (a copy: the caller's lengths may change in place before the backward pass)
        ctx.rows, ctx.lengths = rows, lengths.clone()
        return _reversed(t.detach(), rows, lengths)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _reversed(dy, ctx.rows, ctx.lengths), None, None


def layer_by_layer(x: torch.Tensor, initial: Sequence[torch.Tensor],
                   params_of: Callable[[int, bool], list[torch.Tensor]], layers: int, bidirectional: bool,
                   dropout: float, training: bool, cell: str, hidden: int, schedule: str,
                   lengths: torch.Tensor | None = None, float32: str = ops.DEFAULT_FLOAT32,
                   steps: torch.Tensor | None = None, kept: KeptLayers | None = None
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """y and the final states of the stack, each layer and direction a call of its own (`params_of(layer,
    reverse)` gives a one-layer call's parameters); both directions' outputs side by side, the final
    states in torch's order (layer by layer, forward before reverse), `initial` in the same order. On a
    GPU the two directions of a layer run side by side, the reverse one on a stream of its own, each
    planned for half of the SMs (FORWARD_BESIDE), so that both persistent kernels run at once; under
    `auto`, only where that was measured faster than one after the other in the call's grad mode
    (ops.side_by_side), and else the reverse one after the forward one (in inference on that stream
    still: see _two_streams). `steps`: the lengths' steps-left state of one layer, where it was made
    already (see run; made here from the lengths otherwise); `kept`: the module's kept calls of its
    layers and directions (quick_call.KeptLayers), which make a call like the one before of each and keep
    the others, for all sequences of the full length, and apart for rows of their own lengths given their
    steps-left state (one for all layers and directions)."""
    directions = (False, True) if bidirectional else (False,)
    reverse_time = _reversal(lengths, x) if bidirectional else None
    can_run_beside = bidirectional and _beside(x)
    if lengths is not None and steps is None:  # (one for every layer and direction, kept calls' too)
        steps = steps_left(lengths, 1, x, hidden)
    # (the module's zeros, or every state given: the kept calls run over zeros of their own for the former)
    zeros = kept is not None and all(made_here(s) for s in initial)
    finals: list[list[torch.Tensor]] = [[] for _ in initial]
    for layer in range(layers):
        beside = can_run_beside and ops.side_by_side(
            cell if lengths is None else ops.masked_text(cell), x, hidden, schedule,
            torch.is_grad_enabled() and saves(x, initial, params_of(layer, False)))
        # x reversed in the reverse direction's call, on its stream (where its memory's addresses repeat
        # call after call, as a kept call's lane wants them), but here, before the fork, where x is a leaf
        # that requires a gradient: its AccumulateGrad node takes the stream of x's first use, and torch's
        # engine wants both of its gradients from that stream
        early = bidirectional and x.requires_grad and x.is_leaf and torch.is_grad_enabled()
        # (a tuple indexed by an int: Dynamo of torch 2.11 refuses a bool index while tracing)
        xs = (x, reverse_time(x)) if early else (x, x)
        calls = [partial(_direction, xs[int(reverse)], [s[i:i + 1] for s in initial], params_of, reverse,
                         reverse_time if reverse else None, early, cell, hidden, schedule, lengths,
                         direction_of(reverse, beside), float32, steps, kept, layer, zeros)
                 for i, reverse in enumerate(directions, start=layer * len(directions))]
        # (one after the other, a training call's directions stay on the current stream: each direction's
        # backward pass runs on its forward pass's stream, and the two, each planned for all of the SMs,
        # would then run at once)
        two = can_run_beside and (beside or not torch.is_grad_enabled())
        done = _two_streams(*calls, x, beside) if two else [call() for call in calls]
        outputs, lasts = [y for y, _ in done], [last for _, last in done]
        for last in lasts:
            for i, value in enumerate(last):
                finals[i].append(value)
        x = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
        if dropout and training and layer < layers - 1:
            x = torch.nn.functional.dropout(x, dropout, training=True)
    return x, [torch.cat(f) for f in finals]


def _direction(x, initial, params_of, reverse, reverse_time, reversed_x, cell, hidden, schedule, lengths,
               direction, float32, steps, kept: KeptLayers | None, layer: int, zeros: bool):
    """One direction of one layer: y and the final states (reverse_time: of the reverse direction, which
    reverses x, unless `reversed_x`, and its y); its parameters from params_of(layer, reverse), asked for
    on the stream the call runs on (see torch_rnn's _layer_params); `kept`: the module's kept calls,
    `layer` the layer's index, `zeros` whether the initial states are the module's zeros (see
    layer_by_layer)."""
    # (`is not None`: Dynamo of torch 2.11 refuses to branch on a function's truth while tracing)
    x = reverse_time(x) if reverse_time is not None and not reversed_x else x
    params = params_of(layer, reverse)
    done = None if kept is None else kept(layer, direction, x, params, None if zeros else initial, schedule,
                                          steps)
    if done is None:
        done = run(x, initial, params, cell, hidden, 1, schedule, lengths, direction, float32, steps)
        if kept is not None:
            kept.keep(layer, direction, x, params, len(initial), cell, hidden, schedule, float32, steps)
    y, last = done
    return (reverse_time(y) if reverse_time is not None else y), last


def _beside(x: torch.Tensor) -> bool:
    """Whether a layer's two directions run side by side: on a GPU (in a CUDA graph capture too, where the
    side stream is a branch of the graph), but not in a trace (its graph holds the ops one after the
    other)."""
    return x.device.type == "cuda" and not traced()


# per thread: (device, main stream) -> its side stream (see _side_stream)
_side_streams = threading.local()
MAX_SIDE_STREAMS = 64  # per thread and device: main streams beyond as many run a layer's directions in turn


def _side_stream(x: torch.Tensor, main: torch.cuda.Stream) -> torch.cuda.Stream | None:
    """The side stream of the calling thread's layers run on `main`, made at its first use; None where
    the thread has run them on MAX_SIDE_STREAMS others of x's device already.

    Why one per main stream, made by the driver and no one else's (not from torch's pool, whose streams
    other code is given too): the memory of the side stream's outputs goes back to its pool without
    record_stream, as soon as the host drops it. That is safe only where every later use of the side
    stream waits for the main stream that read those outputs, which a side stream that serves one main
    stream alone does (_two_streams). And it must be so: memory held back by record_stream until the
    GPU passes an event comes back at addresses that depend on how far the GPU lags, and a kept call
    replays its captured run only over addresses it has seen (quick_call), so that the calls of a
    bidirectional layer would take the whole path, and capture new runs, without end."""
    mine = getattr(_side_streams, "by_main", None)
    if mine is None:
        mine = _side_streams.by_main = {}
    key = (x.device, main.cuda_stream)
    side = mine.get(key)
    if side is None:
        if sum(device == x.device for device, _ in mine) >= MAX_SIDE_STREAMS:
            return None
        with ops.made_current(x):
            side = mine[key] = torch.cuda.ExternalStream(int(new_stream()), device=x.device)
    return side


def _two_streams(first: Callable, second: Callable, x: torch.Tensor, at_once: bool):
    """first() on the current stream and second() on its side stream, forked from it and joined back:
    side by side where `at_once`, else second() after first() (where the stream has no side stream,
    one after the other on it). Not at once (inference calls only), second() runs on the side stream
    all the same, so that each stream allocates alike whichever way each layer runs: on the current
    stream, a reverse direction run one after the other in one layer, beside another layer's run side
    by side, found its memory at addresses its kept call's lane had seen only now and then."""
    main = torch.cuda.current_stream(x.device)
    side = _side_stream(x, main)
    if side is None:
        return [first(), second()]
    out = None if at_once else first()
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            done = second()
        if at_once:
            out = first()
    finally:  # (even where one failed: the next use of the side stream must follow this one)
        main.wait_stream(side)
    return [out, done]
