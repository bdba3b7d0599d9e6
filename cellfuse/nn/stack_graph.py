"""A module's inference call of its layers one at a time (stacks.layer_by_layer: two directions, say)
captured whole into one CUDA graph, and replayed for the calls like it.

Why: such a call makes a kept call per layer and direction, and the host's Python before and between
them is time the GPU waits, from a synchronised device (about 0.2 ms before a bidirectional layer's first
launch on an H200, and 0.1 between its directions, so that the second direction's input GEMM ran beside
the first's persistent kernel, at half speed, and delayed its own). Replayed, the call's host time is
one replay's, and the graph makes each layer's persistent kernels start together, after both directions'
input GEMMs (driver.start_together: a graph's branches otherwise run as the GPU takes their work, and did
as the eager calls did) (docs/results/2026-12-02-k-packing-by-tiles-and-a-whole-call-graph-tried.md).
That pays where the host's time is the call's, at small sizes: on an H200 a bidirectional layer at
hidden 128, B=16 took 0.27 ms replayed against 0.34 to 0.38 eagerly, and at hidden 512, B=64 the two were
within the machine's noise (docs/results/2026-12-02-l-a-small-models-call-in-one-graph.md). A graph
holds its call's intermediates for as long as it is kept, so a call whose graph would hold more than
MAX_GRAPH_BYTES is not kept: the memory stays the caller's, as an eager call's.

A call is like the one captured where it is an inference call (no grad mode) on a GPU, not traced nor
under a capture of the caller's, on the same stream, of x of the same shape, strides, dtype and device,
under torch.autocast as then, the same module settings (`what`), the same parameters (the same objects
at the same versions: PackedFor), the initial states the module's zeros again or given again of the same
shapes and dtypes, and the same lengths (a graph keeps the lengths its launches were given) or none. The
call like the one before it that the whole path made is captured (so that the first call at a size
compiles, measures and makes its kept calls eagerly, before any capture), and replayed from then on: x,
the initial states given and the steps-left state are copied into the graph's own tensors, y and the
final states are cloned out of them (a later replay must not change what a caller holds), the whole on
the caller's stream. The runs read the weights packed where the eager calls left them (their packing is
held by the graph), and each replay follows the runs of the same kernels on other streams, as theirs do.
A call unlike it takes the whole path, and a call whose capture failed too (a warning says why, once).
A module's call whose arguments are like those of the last call replayed (`front_key`: a plain tensor,
every initial state given or none) is replayed straight from them, before the module's checks and
lookups (`KeptStack.front`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

import torch

from ..gpu_runtime.driver import new_stream, start_together
from .cuda_runner import params_checked_capture
from .kept_tensors import kept_tensors
from .packed_for import PackedFor
from .tracing import traced
from .zeros import made_here

log = logging.getLogger(__name__)

# The most memory a captured call's graph may hold (its pool of the call's intermediates, which an eager
# call's allocations leave in torch's cache as well): a bidirectional LSTM layer at T=100 holds a few MiB
# at B=16, hidden 128, and more than a hundred at B=64, hidden 512, where a replay gains nothing
MAX_GRAPH_BYTES = 64 << 20

# run(x, initial states, steps-left state or None, kept) -> (y, final states): the call through the whole
# path, `kept` whether it may make its layers' kept calls (not under a capture)
Run = Callable[[torch.Tensor, Sequence[torch.Tensor], torch.Tensor | None, bool],
               tuple[torch.Tensor, list[torch.Tensor]]]


class KeptStack:
    """One module's captured call of its layers (see the module's docstring); `captures` and `replays`
    count what it did."""

    def __init__(self):
        self._graph: _Graph | None = None
        # the key of the last call the whole path made, and its parameters, as it packed them
        self._last: tuple[tuple, PackedFor] | None = None
        self._refused: set[tuple] = set()  # keys whose capture failed or held too much
        self._replayed = False  # whether the last call was replayed (or captured and replayed)
        # the module's own key of the last call replayed, its parameters as it holds them, and the graph
        self._front: tuple[tuple, PackedFor, _Graph] | None = None
        self.captures = self.replays = 0

    def __call__(self, what: tuple, x: torch.Tensor, initial: Sequence[torch.Tensor],
                 lengths: torch.Tensor | None, steps: torch.Tensor | None, params: Sequence[torch.Tensor],
                 run: Run) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """y and the final states of a call of `run` (`what`: the module's settings the call depends on;
        `params`: every layer's and direction's parameters), replayed, captured, or made by `run`."""
        self._replayed = False
        if not _keepable(x, lengths):
            return run(x, initial, steps, True)
        key = _key(what, x, initial, lengths, steps)
        graph = self._graph
        if graph is not None and graph.key == key and graph.params.matches(params):
            self.replays += 1
            self._replayed = True
            return graph.replay(x, initial, steps)
        last = self._last
        if last is not None and last[0] == key and key not in self._refused and last[1].matches(params):
            self._graph = self._front = None  # (its memory back before another is captured)
            graph = self._capture(key, x, initial, steps, last[1], run)
            if graph is not None:
                self._graph = graph
                self.captures += 1
                self._replayed = True
                return graph.replay(x, initial, steps)
            self._refused.add(key)
        # (the whole path packs the parameters where they changed: a call like it after it is captured)
        done = run(x, initial, steps, True)
        seen = PackedFor()
        seen.remember(params)
        self._last = key, seen
        return done

    def took(self, key: tuple | None, params: Sequence[torch.Tensor]) -> None:
        """A module's call just made through it: where it was replayed, the module's own key of the call's
        arguments (`key`: everything of them that decides the call's path, the module's settings
        included; None where it keeps none) and its parameters as it holds them (`params`), for `front`."""
        replayed, self._replayed = self._replayed, False
        if not replayed or key is None:
            self._front = None
        elif self._front is None or self._front[0] != key or self._front[2] is not self._graph:
            seen = PackedFor()
            seen.remember(params)
            self._front = key, seen, self._graph

    def front(self, key: tuple, params: Sequence[torch.Tensor], x: torch.Tensor,
              states: Sequence[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """y and the final states of a module's call replayed straight from its arguments, before its
        checks and lookups, where they are like those of the last call replayed (`key` and `params` as
        `took` was given them); x as the layers take it, `states` every initial state given, or None
        (zeros). None where not like it."""
        front = self._front
        if (front is None or front[0] != key or front[2] is not self._graph or torch.is_grad_enabled()
                or torch.cuda.is_current_stream_capturing() or not front[1].matches(params)):
            return None
        self.replays += 1
        return front[2].replay(x, () if states is None else states, None)

    @staticmethod
    def _capture(key: tuple, x: torch.Tensor, initial: Sequence[torch.Tensor], steps: torch.Tensor | None,
                 params: PackedFor, run: Run) -> _Graph | None:
        """The call captured over tensors of its own on a stream of the thread's own (None where it
        cannot be: a warning says why, or where its graph would hold more than MAX_GRAPH_BYTES), for as
        long as `params` match the call's."""
        with kept_tensors():
            inputs = [torch.empty_like(x), *(s if made_here(s) else torch.empty_like(s) for s in initial),
                      *(() if steps is None else (torch.empty_like(steps),))]
            before = torch.cuda.memory_reserved(x.device)  # (a capture's allocations are its pool's own)
            side, current = _capture_stream(x), torch.cuda.current_stream(x.device)
            side.wait_stream(current)
            # (kept until instantiated: its persistent kernels are made to start together first)
            graph, failed = torch.cuda.CUDAGraph(keep_graph=True), None
            try:
                with torch.cuda.stream(side), params_checked_capture() as checked:
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        states = inputs[1:1 + len(initial)]
                        y, finals = run(inputs[0], states, None if steps is None else inputs[-1], False)
                    except Exception as e:  # (any: the whole path then makes the call, as it did)
                        failed = e
                    finally:
                        graph.capture_end()
            except Exception as e:
                failed = failed or e
            finally:
                current.wait_stream(side)
        together = 0
        if failed is None:
            try:
                together = start_together(graph.raw_cuda_graph())
                graph.instantiate()
            except Exception as e:
                failed = e
        if failed is not None:
            log.warning("a call of the layers one at a time could not be captured into a CUDA graph "
                        "(%s: %s); calls like it run layer by layer", type(failed).__name__, failed)
            return None
        held = torch.cuda.memory_reserved(x.device) - before
        if held > MAX_GRAPH_BYTES:
            log.debug("a call of the layers one at a time not kept as a CUDA graph: it holds %d MiB",
                      held >> 20)
            return None
        return _Graph(key, graph, params, inputs, [not made_here(s) for s in initial], y, finals,
                      checked.packings, checked.programs, together)


class _Graph:
    """A captured call: its graph, the tensors it reads and writes, and what each replay holds."""

    def __init__(self, key: tuple, graph: torch.cuda.CUDAGraph, params: PackedFor,
                 inputs: list[torch.Tensor], given: list[bool], y: torch.Tensor, finals: list[torch.Tensor],
                 packings: list[torch.Tensor], programs: list, together: int):
        self.key, self.graph, self.params = key, graph, params
        self.together = together  # the dependencies that make its persistent kernels start together
        self._inputs, self._given, self._y, self._finals = inputs, given, y, finals
        self._packings = packings  # (read by the graph where they are: held)
        self._programs = programs
        # (each program's turn taken in one order, so that two replays never wait for each other's)
        self._turns = sorted({id(p.turn): p.turn for p in programs}.items())

    def replay(self, x: torch.Tensor, initial: Sequence[torch.Tensor], steps: torch.Tensor | None
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        stream = torch._C._cuda_getCurrentRawStream(x.get_device())
        with contextlib.ExitStack() as held:
            for _, turn in self._turns:
                held.enter_context(turn)
            for program in self._programs:  # (their module's exchanges are theirs: StreamProgram.order)
                program.order(stream)
            self._inputs[0].copy_(x)
            for given, into, s in zip(self._given, self._inputs[1:], initial, strict=False):
                if given:
                    into.copy_(s)
            if steps is not None:
                self._inputs[-1].copy_(steps)
            self.graph.replay()
            return self._y.clone(), [f.clone() for f in self._finals]


def front_key(layout: tuple, x: object, states: Sequence[object] | None) -> tuple | None:
    """What of a module's inference call decides its path, for a call of its layers one at a time
    replayed straight from its arguments (KeptStack's `front`): `layout`, the module's settings that
    decide it; x's shape, strides, dtype and device, the current device and stream, and the initial
    states' own (`states`: every one given, or None). None for a call it does not take: not a GPU tensor
    [T, B, I] (or [B, T, I]), under autocast (which casts x first), with a gradient to follow, or states
    of anything but tensors."""
    if (type(x) is not torch.Tensor or x.dim() != 3 or not x.is_cuda or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cuda")):
        return None
    given = () if states is None else tuple(states)
    if not all(type(s) is torch.Tensor for s in given):
        return None
    index = x.get_device()
    return (layout, x.shape, x.stride(), x.dtype, index, torch.cuda.current_device(),
            torch._C._cuda_getCurrentRawStream(index), states is None,
            tuple((s.shape, s.stride(), s.dtype, s.get_device()) for s in given))


def _keepable(x: torch.Tensor, lengths: torch.Tensor | None) -> bool:
    """Whether a call of x may be kept: an inference call on the current GPU, not traced nor captured,
    its lengths (if any) on the host."""
    return (x.is_cuda and not torch.is_grad_enabled() and not traced()
            and (lengths is None or lengths.device.type == "cpu")
            and x.get_device() == torch.cuda.current_device()
            and not torch.cuda.is_current_stream_capturing())


def _key(what: tuple, x: torch.Tensor, initial: Sequence[torch.Tensor], lengths: torch.Tensor | None,
         steps: torch.Tensor | None) -> tuple:
    """What a call like another has the same of (see the module's docstring)."""
    autocast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    return (what, x.shape, x.stride(), x.dtype, x.get_device(), autocast,
            torch._C._cuda_getCurrentRawStream(x.get_device()),
            tuple((made_here(s), s.shape, s.stride(), s.dtype) for s in initial),
            None if steps is None else (steps.shape, steps.dtype),
            None if lengths is None else tuple(lengths.tolist()))


_capture_streams = threading.local()  # `by_device`: device index -> the thread's stream for captures


def _capture_stream(x: torch.Tensor) -> torch.cuda.Stream:
    """The calling thread's stream for captures on x's device (a capture needs a stream other than the
    default one), made at its first use; one, so that stacks' side stream made for it is one too."""
    mine = getattr(_capture_streams, "by_device", None)
    if mine is None:
        mine = _capture_streams.by_device = {}
    stream = mine.get(x.get_device())
    if stream is None:
        stream = mine[x.get_device()] = torch.cuda.ExternalStream(int(new_stream()), device=x.device)
    return stream
