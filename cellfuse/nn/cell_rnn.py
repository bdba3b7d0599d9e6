"""CellRNN: a drawn cell, stacked and run over a sequence, as a torch.nn.Module that trains."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence

from ..codegen import make_plan
from ..codegen.backward_plan import backward_plan
from ..gpu_runtime.auto_schedule import AUTO
from ..graph_model import (
    Cell,
    CellError,
    NpzArrays,
    Sizes,
    check_params,
    check_sizes,
    init_params,
    load_cell,
    load_npz,
    load_template,
    param_key_check,
    param_layers,
    require_valid,
    save_npz,
    template_names,
)
from ..graph_model.limits import MAX_LAYERS, MAX_WIDTH
from ..graph_model.params import REVERSE, check_names, check_widths
from ..graph_model.validate import check_count
from . import ops, stacks
from .held_weights import held
from .packed_sequences import Unpacked
from .quick_call import KeptLayers, QuickCall, kept_call, kept_lengths_call, kept_packed_call
from .recent_calls import RecentCalls
from .runners import DTYPES, dtype_names, param_dtypes
from .tracing import refuse_script, traced_call
from .zeros import Zeros


def resolve_cell(cell: Cell | str | os.PathLike[str]) -> Cell:
    """A Cell as it is; a path to a cell file; else the name of a built-in template."""
    if isinstance(cell, Cell):
        return cell
    if not isinstance(cell, (str, os.PathLike)):
        raise TypeError(f"cell must be a Cell, a path to a .cell.json file or a template name, got a "
                        f"{type(cell).__name__}")
    if Path(cell).exists():
        return load_cell(cell)
    if isinstance(cell, str) and cell in template_names():
        return load_template(cell)
    raise CellError(f"{cell}: no such cell file, and no template of that name "
                    f"(templates: {', '.join(template_names())})")


def _size(cell: Cell, given: int | None, dim: str, argument: str) -> int:
    """The size given, else the cell file's."""
    if given is None:
        if dim not in cell.sizes:
            raise CellError(f"{argument} is not given, and cell '{cell.name}' has no '{dim}' size to take it "
                            "from")
        given = cell.sizes[dim]
    return check_count(argument, given, MAX_WIDTH)


def _param_name(key: str) -> str:
    """The name torch registers a parameter key under ('l0.W_i' -> 'l0_W_i'): torch refuses dots, and
    a weight id never starts with a digit, so no two keys meet."""
    return key.replace(".", "_", 1)


class CellRNN(torch.nn.Module):
    """A recurrent cell drawn in CellFuse, `num_layers` of it stacked, as a PyTorch module.

    `cell` is a Cell, a path to a .cell.json file, or the name of a built-in template ("lstm", "gru",
    ...). `input_size` and `hidden_size` default to the sizes in the cell file (the editor saves them;
    a template's are 512). The parameters are the cell's weights for every layer, one
    torch.nn.Parameter per .npz key (`param("l0.W_i")`; registered as `l0_W_i`), initialised as
    `cellfuse init-params` does: uniform in +-1/sqrt(hidden). With `seed` they are exactly those of
    `cellfuse init-params --seed SEED`; without, the seed is drawn from torch's generator, so
    torch.manual_seed makes them repeatable.

    `forward(x, states)` runs the forward Plan of `schedule` over the whole sequence; its gradients
    come from the backward Plan (codegen.backward_plan). `auto` is, on the CPU, the rung that
    auto_schedule picks without a GPU; on a GPU, the rung measured fastest for the sizes as the module
    calls it (auto_choice): for an inference call by forward calls, for a training call by forward and
    backward calls together, each chosen and remembered apart. A rung that cannot keep the steps a
    backward pass reads trains on `graph`.

    On CPU tensors the numpy executor runs the plans, in float32 or float64 (so that
    torch.autograd.gradcheck runs on it); on a CUDA device the kernels compute in float32 in torch's
    tensors on torch's current stream (see cuda_runner). Under torch.no_grad(), or where nothing needs a
    gradient, no steps are saved. The plans and programs of each (cell, sizes, dtype, device) are made
    once for the process (see ops).

    x of bfloat16 or float16 (or float32 x under torch.autocast) runs the plans of that precision
    (codegen.precision; on the CPU emulated): y and the final states come back in x's dtype, the
    parameters may stay float32 (packed into 16-bit weights when they change). Every rung runs it
    (`auto` measures them in it), forward and backward: the gradients are float32 inside, x's and the
    initial states' given back in their dtypes, the parameters' float32. Those plans keep in float32
    the states that accumulate (the LSTM's c, the GRU's h: a state the step adds something to), or the
    states `float32_states` names (none, with an empty one).

    A cell whose backward pass the backward Plan cannot plan (an op with no derivative in the op table)
    is refused here, with the node that stops it.
    """

    def __init__(self, cell: Cell | str | os.PathLike[str], input_size: int | None = None,
                 hidden_size: int | None = None, num_layers: int = 1, schedule: str = AUTO,
                 seed: int | None = None, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, float32_states: Collection[str] | None = None):
        super().__init__()
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise CellError(f"dropout must be a number from 0 to 1, got {dropout!r}")
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self.bidirectional = bool(bidirectional)
        self.cell = resolve_cell(cell)
        require_valid(self.cell)
        self.input_size = _size(self.cell, input_size, "input", "input_size")
        self.hidden_size = _size(self.cell, hidden_size, "hidden", "hidden_size")
        self.num_layers = check_count("num_layers", num_layers, MAX_LAYERS)
        ops.check_schedule(schedule)
        self.schedule = schedule
        self.state_ids = tuple(self.cell.updates)
        if float32_states is not None:
            if isinstance(float32_states, str):
                raise TypeError(f"float32_states must be a collection of state ids, got the string "
                                f"{float32_states!r} (write [{float32_states!r}] for one)")
            unknown = sorted(set(float32_states) - set(self.state_ids))
            if unknown:
                raise CellError(f"float32_states: {', '.join(map(repr, unknown))} not a state of cell "
                                f"'{self.cell.name}' (states: {', '.join(self.state_ids)})")
            float32_states = tuple(sorted(set(float32_states)))
        self.float32_states = float32_states
        self._float32 = ops.float32_text(float32_states)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        params = init_params(self.cell, self.num_layers, self.input_size, self.hidden_size, seed,
                             self.bidirectional)
        sizes = Sizes(seq=1, batch=1, input=self.input_size, hidden=self.hidden_size, layers=self.num_layers)
        try:  # the ops decide it, not the sequence or the batch
            backward_plan(make_plan(self.cell, sizes, "graph", save_steps=True))
        except CellError as e:
            raise CellError(f"cell '{self.cell.name}' cannot be trained as a CellRNN: {e}") from None
        # The reverse direction's parameters live in a module of their own, `reverse` (their state-dict
        # names "reverse.l0_W"): no name made from a weight id can then meet another.
        self.reverse = torch.nn.Module() if self.bidirectional else None
        reverse_part = f".{REVERSE}."
        # key -> (whether `reverse` holds it, its name there): not the module itself, which would make a
        # cycle that keeps a dropped module, and its GPU memory, until Python's collector runs
        self._where: dict[str, tuple[bool, str]] = {}
        for key, value in params.items():
            reverse = reverse_part in key
            name = _param_name(key.replace(reverse_part, ".", 1))
            self._owner(reverse).register_parameter(name, torch.nn.Parameter(torch.from_numpy(value)))
            self._where[key] = (reverse, name)
        self._names = {key: name for key, (reverse, name) in self._where.items() if not reverse}
        self._layer_params = self._layer_places()
        self._cell_text = ops.cell_text(self.cell)
        check_sizes(sizes, self.cell)
        if self.bidirectional and self.num_layers > 1:
            try:  # the layers above the first read both directions' outputs side by side
                check_widths(Sizes(seq=1, batch=1, input=2 * self.hidden_size, hidden=self.hidden_size),
                             self.cell)
            except CellError as e:
                raise CellError(f"a bidirectional stack of cell '{self.cell.name}': its layers above the "
                                f"first read inputs of 2 x hidden_size = {2 * self.hidden_size}, and {e}"
                                ) from None
        self._sizes_checked: set[tuple[int, int]] = set()  # (T, B) that passed check_sizes
        self._zero_states = Zeros()
        self._recent = RecentCalls()  # (for schedules_run)
        self._quick: QuickCall | None = None  # the last call on a GPU, where it can be kept
        self._quick_packed: QuickCall | None = None  # and the last of a PackedSequence
        self._quick_lengths: QuickCall | None = None  # and the last of rows of their own lengths
        # and of each layer and direction, where they run a call each (over the module's zeros)
        self._kept_layers = KeptLayers(self._zero_states)

    def __prepare_scriptable__(self):
        refuse_script("CellRNN")

    def extra_repr(self) -> str:
        return (f"cell={self.cell.name!r}, input_size={self.input_size}, hidden_size={self.hidden_size}, "
                f"num_layers={self.num_layers}, schedule={self.schedule!r}"
                + (", batch_first=True" if self.batch_first else "")
                + (f", dropout={self.dropout}" if self.dropout else "")
                + (", bidirectional=True" if self.bidirectional else "")
                + (f", float32_states={self.float32_states!r}" if self.float32_states is not None else ""))

    @property
    def schedules_run(self) -> list[str]:
        """The rungs the module's recent forward passes ran (`auto` resolved: a training call's apart from
        an inference call's), one per size and grad mode seen: of the first layer's call where the layers
        ran one at a time."""
        return self._recent.rungs(self._cell_text, self._float32, self.hidden_size, self.num_layers,
                                  self.schedule, self.bidirectional)

    # -- parameters ----------------------------------------------------------------------------------
    @property
    def keys(self) -> tuple[str, ...]:
        """The parameter keys of the .npz files, in file order."""
        return tuple(self._where)

    @property
    def _directions(self) -> tuple[bool, ...]:
        """Whether each direction runs reversed in time: forward, then reverse where bidirectional."""
        return (False, True) if self.bidirectional else (False,)

    def param(self, key: str) -> torch.nn.Parameter:
        """The parameter behind an .npz key ("l0.W_i"), as the module holds it now (held_weights)."""
        if key not in self._where:
            raise CellError(f"{key!r} is not a parameter of this CellRNN ({self.num_layers} layer(s) of cell "
                            f"'{self.cell.name}'): its keys are {', '.join(self._where)}")
        reverse, name = self._where[key]
        return held(self._owner(reverse), name)

    def _layer_places(self) -> list[list[list[tuple[bool, str]]]]:
        """Each layer's parameters per direction, where `_where` says they are, in the order of a one-layer
        plan's keys (for the stacks that run a layer at a time)."""
        return [[[where for key, where in self._where.items()
                  if key.startswith(f"l{layer}.") and where[0] == reverse] for reverse in self._directions]
                for layer in range(self.num_layers)]

    def _owner(self, reverse: bool) -> torch.nn.Module:
        """The module that holds a parameter of the reverse direction or of the forward one."""
        return self.reverse if reverse else self

    def _layer_params_of(self, layer: int, reverse: bool) -> list[torch.Tensor]:
        """One layer's parameters of one direction, in the order of a one-layer plan's keys."""
        return [held(self._owner(r), name) for r, name in self._layer_params[layer][int(reverse)]]

    def _params(self) -> list[torch.Tensor]:
        """The parameters in the order of `keys`, as torch.func.functional_call, a parametrization or
        pruning may have replaced them (held_weights)."""
        return [held(self, name) for name in self._names.values()]

    def load_params(self, params: Mapping[str, object] | str | os.PathLike[str]) -> None:
        """Copies every parameter from a mapping of .npz keys to arrays or tensors, as `cellfuse
        init-params` writes them, or from such an .npz file; each is checked (present, of its shape,
        finite) before any is copied."""
        if isinstance(params, (str, os.PathLike)):
            params = load_npz(params, "parameters", param_key_check(self.cell, self.bidirectional))
        if not isinstance(params, Mapping):
            raise TypeError(f"params must map .npz keys to arrays, or name an .npz file; got a "
                            f"{type(params).__name__}")
        check_names(self.cell, params, {}, self.bidirectional)
        if param_layers(params) > self.num_layers:
            raise CellError(f"the parameters are for {param_layers(params)} layers, and this CellRNN has "
                            f"{self.num_layers}")
        arrays = params if isinstance(params, NpzArrays) else {
            key: value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
            for key, value in params.items()}
        check_params(self.cell, arrays, self.num_layers, self.input_size, self.hidden_size,
                     self.bidirectional)
        with torch.no_grad():
            for key in self.keys:
                self.param(key).copy_(torch.from_numpy(np.asarray(arrays[key])))

    def save_params(self, path: str | os.PathLike[str]) -> None:
        """Writes the parameters as `cellfuse init-params` does: an .npz of float32 arrays by key."""
        save_npz(path, {key: self.param(key).detach().cpu().numpy().astype(np.float32) for key in self.keys})

    # -- the forward pass ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor | PackedSequence, states: Mapping[str, torch.Tensor] | None = None,
                lengths: torch.Tensor | Sequence[int] | None = None
                ) -> tuple[torch.Tensor | PackedSequence, dict[str, torch.Tensor]]:
        """x [T, B, input_size] ([B, T, input_size] with batch_first); states maps state ids (any of them,
        or none: zeros) to initial values [num_layers, B, hidden_size]. Returns y [T, B, hidden_size]
        ([B, T, ...] with batch_first), the last layer's output at every step, and the final value of every
        state, [num_layers, B, hidden_size] each. With dropout, while training, each layer's output but the
        last goes through torch's dropout, as in torch.nn.LSTM. Where bidirectional, y holds both
        directions' outputs side by side ([..., 2 * hidden_size]) and the states are [num_layers * 2, B,
        hidden_size], in torch's order (layer by layer, forward before reverse).

        Sequences of different lengths: `lengths` (one per batch row, from 1 to T, in any order) makes each
        row stop at its own length in the kernels (its outputs zero past it, its final states those of its
        last step; the reverse direction starts at its last step; whatever the padding past it holds, NaN
        included, does not reach the run, and its gradient is zero). Or x is a
        torch.nn.utils.rnn.PackedSequence, and y is one with the same layout. The lengths are read on the
        host, as torch's packing reads them: give them on the CPU (a GPU tensor of them is copied there,
        which waits for the GPU). Under torch.compile and torch.export they are an input of the graph,
        which checks their bounds as it runs (a RuntimeError)."""
        # (what the path of a call depends on: dropout applies between layers while training)
        layout = (self.schedule, self.batch_first, self.training, self.dropout)
        tracing = traced_call("CellRNN")  # (first: a trace reads nothing of the kept call)
        if not tracing and self._quick is not None and lengths is None and type(x) is torch.Tensor:
            every = None if states is None else self._every_state(states)
            if states is None or every is not None:
                done = self._quick(x, layout, self._params(), every)
                if done is not None:
                    return done[0], dict(zip(self.state_ids, done[1], strict=True))
        quick = self._quick_lengths  # (once: another thread's call may replace it)
        if (not tracing and quick is not None and lengths is not None and type(x) is torch.Tensor
                and x.dim() == 3):
            every = None if states is None else self._every_state(states)
            time_major = x.transpose(0, 1) if self.batch_first else x
            if (states is None or every is not None) and quick.may_take(time_major, layout):
                # (the lengths read once: where the kept call turns the call down, the whole path takes them
                # as read here, an iterator of them included)
                lengths = stacks.read_lengths(lengths, time_major.shape[0], time_major.shape[1])
                done = self._kept_lengths_call(quick, time_major, lengths, layout, every)
                if done is not None:
                    return done[0], dict(zip(self.state_ids, done[1], strict=True))
        x_given = x
        packed = None
        by_layer = self.bidirectional or bool(self.dropout and self.training and self.num_layers > 1)
        if isinstance(x, PackedSequence):
            if lengths is not None:
                raise CellError("lengths are given twice: by the PackedSequence and by `lengths`")
            # its rows in the packed data's order, the states sorted to it
            packed, state_layers = Unpacked(x), 1 if by_layer else self.num_layers
            quick = self._quick_packed
            every = None if states is None else self._every_state(states)
            if not tracing and quick is not None and (states is None or every is not None):
                done = quick.packed(packed, x, layout, self._params(), every, self.hidden_size, state_layers)
                if done is not None:
                    return done[0], dict(zip(self.state_ids, done[1], strict=True))
            if packed.x is None:
                packed.pad(self.hidden_size, state_layers)
            x, lengths = packed.x, packed.lengths
        elif self.batch_first and isinstance(x, torch.Tensor) and x.dim() == 3:
            x = x.transpose(0, 1)
        cast = stacks.autocast_dtype(x) if isinstance(x, torch.Tensor) else None
        if cast is not None:  # under torch.autocast: x and the states in its dtype
            x = x.to(cast)
            if isinstance(states, Mapping):
                states = {s: v.to(cast) if isinstance(v, torch.Tensor) else v for s, v in states.items()}
        initial = self._check(x, states)
        steps = None  # (the lengths' steps-left state, where there are lengths)
        if packed is not None:
            initial, steps = packed.sorted(initial), packed.steps
        elif lengths is not None:  # (a PackedSequence's are right by construction, its padding zeros)
            lengths = stacks.read_lengths(lengths, x.shape[0], x.shape[1])
            x, steps, lengths = stacks.lengths_applied(x, lengths, 1 if by_layer else self.num_layers,
                                                       self.hidden_size)
        params = self._params()
        if by_layer:
            y, finals = stacks.layer_by_layer(
                x, initial, self._layer_params_of, self.num_layers, self.bidirectional, self.dropout,
                self.training, self._cell_text, self.hidden_size, self.schedule, lengths, self._float32,
                steps, None if tracing else self._kept_layers)
        else:
            y, finals = stacks.run(x, initial, params, self._cell_text, self.hidden_size, self.num_layers,
                                   self.schedule, lengths, float32=self._float32, steps=steps)
        if not tracing:  # (the dtype of the plans the pass ran)
            # (whether the first call of the ops saved: where the layers run one at a time, by the
            # first layer's parameters, which may be frozen where the others are not)
            save = stacks.saves(x, initial, self._layer_params_of(0, False) if by_layer else params)
            self._recent.saw(x, lengths is not None, by_layer, save)
        if not tracing:  # (kept where quick_call can make the call again; each kind replaces its own)
            kept = None
            if not by_layer and (states is None or self._every_state(states) is not None):
                zeros = [self._zero_states(tuple(initial[0].shape), x.dtype, x.device)] * len(initial)
                if packed is not None:
                    kept = kept_packed_call(packed, x, layout, params, zeros, self._cell_text,
                                            self.hidden_size, self.num_layers, self._float32, cast)
                elif lengths is not None:
                    kept = kept_lengths_call(x, layout, params, zeros, steps, self._cell_text,
                                             self.hidden_size, self.num_layers, self._float32, cast)
                else:
                    kept = kept_call(x_given, x, layout, params, zeros, self._cell_text, self.hidden_size,
                                     self.num_layers, self._float32, cast=cast)
            if packed is not None:
                self._quick_packed = kept
            elif lengths is not None:
                self._quick_lengths = kept
            else:
                self._quick = kept
        if packed is not None:
            y, finals = packed.pack(y), packed.unsorted(finals)
        elif self.batch_first:
            y = y.transpose(0, 1)
        return y, dict(zip(self.state_ids, finals, strict=True))

    def _kept_lengths_call(self, quick: QuickCall, x: torch.Tensor, lengths: torch.Tensor, layout: tuple,
                           every: list[torch.Tensor] | None
                           ) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """y and the final states of a call of rows of their own lengths like the one kept, `quick` (x time
        first; `lengths` as stacks.read_lengths gives them; `every`: every initial state given, or None for
        zeros), its padding zeroed as the whole path does; None where it is not like it. A module called
        over rows of other lengths call after call (a training loop's batches) thus skips the whole path's
        checks and lookups, as a PackedSequence's call does."""
        x, steps, _ = stacks.lengths_applied(x, lengths, self.num_layers, self.hidden_size)
        done = quick.lengths(x, layout, self._params(), every, steps)
        if done is None or not self.batch_first:
            return done
        return done[0].transpose(0, 1), done[1]

    def _every_state(self, states: object) -> list[torch.Tensor] | None:
        """The initial states in the cell's order where `states` maps every state id to one, else None."""
        if isinstance(states, Mapping) and len(states) == len(self.state_ids):
            try:
                return [states[s] for s in self.state_ids]
            except KeyError:
                return None
        return None

    def _check(self, x: object, states: object) -> list[torch.Tensor]:
        """The initial states in the order of `state_ids` (zeros where not given), after checking every
        input against the module: shapes, dtype and device."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a tensor [T, B, {self.input_size}], got a {type(x).__name__}")
        if x.dim() != 3 or x.shape[2] != self.input_size or 0 in x.shape:
            raise CellError(f"x has shape {list(x.shape)}, expected [T, B, {self.input_size}] (sequence, "
                            "batch, input_size), T and B at least 1")
        device, dtype = x.device, x.dtype
        if device.type not in DTYPES:
            raise CellError(f"x is on {device}; CellRNN runs on the CPU or a CUDA device")
        if dtype not in DTYPES[device.type]:
            raise CellError(f"x has dtype {dtype}; on {device.type} CellRNN runs {dtype_names(device.type)}")
        # (by is_cuda, is_cpu and the device's index: a tensor's device is an object made at every ask)
        cuda, index, dtypes = x.is_cuda, x.get_device(), param_dtypes(dtype)
        for key, (reverse, name) in self._where.items():
            p = held(self._owner(reverse), name)
            elsewhere = (not p.is_cuda or p.get_device() != index) if cuda else not p.is_cpu
            if elsewhere or p.dtype not in dtypes:
                raise CellError(f"parameter '{key}' is {p.dtype} on {p.device}, and x is {dtype} on "
                                f"{device}: move the module to x's device and dtype (module.to(x))")
        T, B = x.shape[0], x.shape[1]
        if (T, B) not in self._sizes_checked:  # the cell's part was checked when the module was made
            check_sizes(Sizes(seq=T, batch=B, input=self.input_size, hidden=self.hidden_size,
                              layers=self.num_layers))
            self._sizes_checked.add((T, B))
        if states is None:
            states = {}
        if not isinstance(states, Mapping):
            raise TypeError(f"states must map state ids to tensors, got a {type(states).__name__}")
        for s in states:
            if s not in self.state_ids:
                raise CellError(f"states: {s!r} is not a state of cell '{self.cell.name}' (states: "
                                f"{', '.join(self.state_ids)})")
        want = (self.num_layers * len(self._directions), B, self.hidden_size)
        for s, value in states.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"state '{s}' must be a tensor {list(want)}, got a {type(value).__name__}")
            if tuple(value.shape) != want:
                layers = "num_layers * 2" if self.bidirectional else "num_layers"
                raise CellError(f"state '{s}' has shape {list(value.shape)}, expected {list(want)} "
                                f"({layers}, batch, hidden_size)")
            if value.device != device or value.dtype != dtype:
                raise CellError(f"state '{s}' is {value.dtype} on {value.device}, and x is {dtype} on "
                                f"{device}")
        return [states[s] if s in states else self._zero_states(want, dtype, device) for s in self.state_ids]

    def _apply(self, fn, recurse=True):
        # (their zeros are on the device and dtype it leaves)
        self._quick = self._quick_packed = self._quick_lengths = None
        self._kept_layers = KeptLayers(self._zero_states)
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_recent"] = RecentCalls()
        state["_zero_states"] = Zeros()
        state["_quick"] = state["_quick_packed"] = state["_quick_lengths"] = None
        state["_kept_layers"] = KeptLayers(state["_zero_states"])
        return state

    def __setstate__(self, state: dict) -> None:
        # (a module saved when it kept its recent calls in two fields of its own loads with a RecentCalls)
        state.pop("_seen", None)
        state.pop("_last_seen", None)
        state.setdefault("_recent", RecentCalls())
        super().__setstate__(state)

        # (a module saved when the parameters' map held the module that holds each key, itself or
        # `reverse`, loads with the map of now)
        def now(where: tuple) -> tuple[bool, str]:
            owner, name = where
            return (owner is not self, name) if isinstance(owner, torch.nn.Module) else where
        self._where = {key: now(where) for key, where in self._where.items()}
        self._layer_params = self._layer_places()

