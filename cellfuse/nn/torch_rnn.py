"""`cellfuse.nn.LSTM` and `cellfuse.nn.GRU`: torch.nn.LSTM and torch.nn.GRU's constructor, parameters
(names, shapes, initialisation), forward signature and results, computed by torch's cells (`torch_cell`:
the `lstm` and `gru` templates' gates with torch's two biases apart) through CellRNN's ops, so that a
model built on torch's modules changes one line.

The parameters are torch's (`weight_ih_l0`, `weight_hh_l0_reverse`, `bias_ih_l0`, ...: a state dict loads
both ways); the cell's weights are views of them (gate i's rows of `weight_ih` are the transpose of the
cell's `W`, its rows of `bias_ih` and `bias_hh` the cell's two biases), made once and reused; a training
call gives autograd the parameters themselves, each one's gradient joined from its views' in one op
(weight_views).

A stack of one direction runs as one fused call of every layer. Two directions, or dropout between layers
while training, run layer by layer: the reverse direction on the sequence reversed in time, torch's
dropout between layers. A PackedSequence runs each row to its own length in the kernels (see
stacks) and comes back packed as torch's does; hx and the final states are in the batch's own order.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from functools import partial

import torch
from torch.nn.utils.rnn import PackedSequence

from ..gpu_runtime.auto_schedule import AUTO
from ..graph_model import Cell, CellError, init_params
from ..graph_model.builder import CellBuilder, sigmoid, tanh
from . import ops, stacks
from .held_weights import held
from .packed_sequences import Unpacked
from .quick_call import KeptLayers, QuickCall, kept_call, kept_packed_call
from .recent_calls import RecentCalls
from .runners import DTYPES, dtype_names, param_dtypes
from .tracing import refuse_script, traced, traced_call
from .weight_views import WeightViews, joined
from .zeros import Zeros

# torch's gates in the order of its rows: the cell's input and recurrent matrices and its input and
# recurrent biases (torch_cell's names)
GATES = {"lstm": [(f"W_{g}", f"U_{g}", f"b_{g}", f"c_{g}") for g in "ifgo"],
         "gru": [(f"W_i{g}", f"W_h{g}", f"b_i{g}", f"b_h{g}") for g in "rzn"]}


class TorchRefusal(CellError, ValueError, RuntimeError):
    """A drop-in's refusal of an argument or input that torch's module refuses too (sizes, dropout, x's
    or hx's shapes and types, a sequence of no steps): torch raises a RuntimeError or a ValueError for
    them, so this is both, and code written for torch's module catches it as it caught torch's."""


def torch_cell(kind: str, bias: bool = True) -> Cell:
    """torch.nn.LSTM's or GRU's cell (the `lstm` and `gru` templates' gates), with torch's two biases per
    gate apart (b_ih's rows and b_hh's, named as GATES says), or none without `bias`: every weight the
    kernels read is then a view of a parameter, whose version counter says when it changed (a sum of
    two biases, or zeros, made at every call would have the weights packed again at every call)."""
    b = CellBuilder(kind.upper(), f"torch.nn.{kind.upper()}'s cell")
    x, h = b.input("x"), b.state("h")

    def affine(a, w: str, rows: str, bias_name: str):
        out = a @ b.weight(w, rows, "hidden")
        return out + b.weight(bias_name, "hidden") if bias else out

    if kind == "lstm":
        c, gates = b.state("c"), {}
        for (w, u, b_in, b_rec), squash in zip(GATES["lstm"], (sigmoid, sigmoid, tanh, sigmoid), strict=True):
            gate = w.removeprefix("W_")
            gates[gate] = squash(affine(x, w, "input", b_in) + affine(h, u, "hidden", b_rec)).named(gate)
        c_new = (gates["f"] * c + gates["i"] * gates["g"]).named("c_new")
        h_new = (gates["o"] * tanh(c_new)).named("h_new")
        b.update(h, h_new)  # the states in torch's order: (h, c)
        b.update(c, c_new)
    else:
        (w_r, u_r, b_ir, b_hr), (w_z, u_z, b_iz, b_hz), (w_n, u_n, b_in, b_hn) = GATES["gru"]
        r = sigmoid(affine(x, w_r, "input", b_ir) + affine(h, u_r, "hidden", b_hr)).named("r")
        z = sigmoid(affine(x, w_z, "input", b_iz) + affine(h, u_z, "hidden", b_hz)).named("z")
        n = tanh(affine(x, w_n, "input", b_in) + r * affine(h, u_n, "hidden", b_hn)).named("n")
        h_new = ((1.0 - z) * n + z * h).named("h_new")
        b.update(h, h_new)
    b.output(h_new)
    return b.build()


def _source_gradients(names: Sequence[str], gates: Sequence[Sequence[str]],
                      grads: Sequence[torch.Tensor], needed: Sequence[bool]) -> list[torch.Tensor | None]:
    """One layer's parameters' gradients (in the order of the module's `_sources`) from its weights' (in
    the order of `names`, the cell's keys), each the gates' rows (`gates`: each gate's names, in torch's
    order of rows) joined in one op (see weight_views)."""
    by_name = dict(zip(names, grads, strict=True))
    out: list[torch.Tensor | None] = []
    for j, need in enumerate(needed):
        rows = [by_name[gate[j]] for gate in gates]
        out.append(torch.cat([g.t() if g.dim() == 2 else g for g in rows]) if need else None)
    return out


def _callers_level() -> int:
    """warnings.warn's stacklevel, called here, that names the first caller outside this module (LSTM's
    constructor calls _TorchRNN's, GRU's is _TorchRNN's)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


class _TorchRNN(torch.nn.Module):
    """What LSTM and GRU share; `kind` is the template ("lstm" or "gru")."""

    kind: str

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None, *, schedule: str = AUTO):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("num_layers", num_layers)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TorchRefusal(f"{name} must be a whole number of at least 1, got {value!r}")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise TorchRefusal(f"dropout must be a number from 0 to 1, got {dropout!r}")
        if dropout > 0 and num_layers == 1:  # (torch's warning, word for word)
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero "
                          f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", stacklevel=_callers_level())
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        ops.check_schedule(schedule)
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional, self.schedule = bool(bidirectional), schedule
        self.proj_size = 0  # (torch's modules have it; its checks read it)
        cell = torch_cell(self.kind, self.bias)
        # the ops name the cell by its text on one line (see CellRNN)
        self._cell_text = ops.cell_text(cell)
        self._state_ids = tuple(cell.updates)
        self._gates = GATES[self.kind]
        # each layer's parameters a call reads the cell's weights out of, in the order of a gate's names
        self._sources = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if self.bias else ("weight_ih",
                                                                                           "weight_hh")
        self._view_cache: dict[tuple[int, bool], tuple[tuple, WeightViews]] = {}
        self._fused: tuple[list[WeightViews], WeightViews] | None = None  # (see _fused_params)
        self._zeros = Zeros()
        self._quick: QuickCall | None = None  # the last call on a GPU, where it can be kept
        self._quick_packed: QuickCall | None = None  # and the last of a PackedSequence
        # and of each layer and direction, where they run a call each (over the module's zeros)
        self._kept_layers = KeptLayers(self._zeros)
        self._recent = RecentCalls()  # (for schedules_run)
        # the template's weights of a layer, in the order of its keys (l0.W_i -> W_i), which the ops take
        self._names = [key.split(".", 1)[1] for key in init_params(cell, 1, 1, 1, 0)]
        gate_rows = len(self._gates) * hidden_size
        factory = {"device": device, "dtype": dtype}
        for i, names in enumerate(self._all_weights):
            width = input_size if i < self._directions else hidden_size * self._directions
            shapes = [(gate_rows, width), (gate_rows, hidden_size), (gate_rows,), (gate_rows,)]
            for name, shape in zip(names, shapes, strict=False):
                self.register_parameter(name, torch.nn.Parameter(torch.empty(shape, **factory)))
        self.reset_parameters()

    # torch's own checks and the hidden state's reordering, which code that subclasses torch's modules
    # calls: they read only what these modules share with torch's (the sizes, the flags, _flat_weights)
    check_input = torch.nn.RNNBase.check_input
    get_expected_hidden_size = torch.nn.RNNBase.get_expected_hidden_size
    check_hidden_size = torch.nn.RNNBase.check_hidden_size
    check_forward_args = torch.nn.RNNBase.check_forward_args
    permute_hidden = torch.nn.RNNBase.permute_hidden

    # torch's modules' lists of their parameters, which code written for them reads (to set the forget
    # gates' biases, say)
    @property
    def mode(self) -> str:
        return self.kind.upper()

    @property
    def _all_weights(self) -> list[list[str]]:
        """The parameters' names per layer and direction, in torch's order."""
        return [[f"{name}_l{layer}{suffix}" for name in self._sources]
                for layer in range(self.num_layers) for suffix in self._suffixes]

    @property
    def _flat_weights_names(self) -> list[str]:
        return [name for names in self._all_weights for name in names]

    @property
    def all_weights(self) -> list[list[torch.nn.Parameter]]:
        """Each layer's and direction's parameters (torch's modules' `all_weights`)."""
        return [[held(self, name) for name in names] for names in self._all_weights]

    @property
    def _flat_weights(self) -> list[torch.Tensor]:
        """Every parameter in the order of `_flat_weights_names`, as they are now (torch's modules keep
        such a list up to date)."""
        return [held(self, name) for name in self._flat_weights_names]

    @property
    def _directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def _suffixes(self) -> tuple[str, ...]:
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self) -> None:
        """Every parameter uniform in +-1/sqrt(hidden_size), as torch's modules start."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """Nothing to do, here as in torch's modules after a move: the kernels' copy of the weights is
        made again whenever a parameter changes (its version counter tells)."""

    def __prepare_scriptable__(self):
        refuse_script(f"cellfuse.nn.{type(self).__name__}")

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s + f", schedule={self.schedule!r}"

    # -- the template's weights, read out of torch's ---------------------------------------------------
    def _layer_params(self, layer: int, reverse: bool) -> list[torch.Tensor]:
        """One layer's weights of one direction in the cell's order of keys: views of torch's parameters,
        made again only when a parameter was replaced (moved, or swapped by torch.func.functional_call),
        its requires_grad changed, or grad mode did, or, in grad mode, the current stream; a call otherwise
        reuses them (two dozen views cost tens of microseconds a call), and they follow in-place changes
        of the parameters as views do.

        Why the stream: a view made in grad mode holds its parameter's AccumulateGrad node, which keeps
        the stream current when it was made, and torch's engine wants a parameter's gradient to come from
        the stream of that node (it synchronises, and warns, where it does not). The ops' node of a call
        runs its backward pass on the stream of the call (stacks.layer_by_layer runs a reverse direction
        on a stream of its own): the views of that call are made on it."""
        suffix = "_reverse" if reverse else ""
        sources = [held(self, f"{name}_l{layer}{suffix}") for name in self._sources]
        if traced():
            return self._views(sources)
        graph = torch.is_grad_enabled()
        stream = (torch._C._cuda_getCurrentRawStream(sources[0].get_device())
                  if graph and sources[0].is_cuda else None)
        key = (graph, stream, *((id(p), p.data_ptr(), p.requires_grad) for p in sources))
        cached = self._view_cache.get((layer, reverse))
        if cached is None or cached[0] != key:
            # The views made before go first, the fused call's too: while one lives, its parameter's
            # AccumulateGrad node does, and new views would take that node, with its stream (a training
            # step captured into a CUDA graph after eager ones then failed: the engine made the default
            # stream wait for the capturing one)
            self._view_cache.pop((layer, reverse), None)
            self._fused = None
            cached = None  # (the old views, held by this name too, go before the new are made)
            # (their gradients' function holds what it reads, not the module: a bound method here would
            # make a cycle that keeps a dropped module, and its GPU memory, until Python's collector runs)
            gradients = partial(_source_gradients, self._names, self._gates)
            cached = self._view_cache[layer, reverse] = (key, WeightViews(self._views(sources), sources,
                                                                          gradients))
        return cached[1]

    def _views(self, sources: list[torch.Tensor]) -> list[torch.Tensor]:
        H = self.hidden_size
        by_name = {}
        for i, names in enumerate(self._gates):  # torch's gates, in torch's order of rows
            rows = slice(i * H, (i + 1) * H)
            for name, source in zip(names, sources, strict=False):
                by_name[name] = source[rows].t() if source.dim() == 2 else source[rows]
        return [by_name[name] for name in self._names]

    def _apply(self, fn, recurse=True):
        self._view_cache.clear()  # views of the tensors a move replaces would keep them alive
        self._fused = None
        self._quick = self._quick_packed = None  # (so would the kept calls' zeros)
        self._kept_layers = KeptLayers(self._zeros)
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_view_cache"], state["_fused"] = {}, None
        state["_zeros"] = Zeros()
        state["_quick"] = state["_quick_packed"] = None
        state["_kept_layers"] = KeptLayers(state["_zeros"])
        state["_recent"] = RecentCalls()
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_recent", RecentCalls())  # (a module saved before it kept its recent calls)
        super().__setstate__(state)

    @property
    def schedules_run(self) -> list[str]:
        """The rungs the module's recent forward passes ran (`auto` resolved: a training call's apart from
        an inference call's), one per size and grad mode seen: of the first layer's call where the layers
        ran one at a time (as CellRNN's)."""
        return self._recent.rungs(self._cell_text, ops.DEFAULT_FLOAT32, self.hidden_size, self.num_layers,
                                  self.schedule, self.bidirectional)

    # -- the forward pass ------------------------------------------------------------------------------
    def _check(self, x: object) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input must be a tensor, got a {type(x).__name__}")
        if (x.dim() in (2, 3) and x.shape[-1] == self.input_size
                and x.shape[1 if self.batch_first and x.dim() == 3 else 0] == 0):
            raise TorchRefusal(f"input has shape {list(x.shape)}: no steps")
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            raise TorchRefusal(f"input has shape {list(x.shape)}, expected [T, B, {self.input_size}]"
                               f"{' with batch_first: [B, T, ...]' if self.batch_first else ''} or "
                               f"unbatched [T, {self.input_size}]")
        if x.device.type not in DTYPES or x.dtype not in DTYPES[x.device.type]:
            raise CellError(f"input is {x.dtype} on {x.device}; on {x.device.type} this module runs "
                            f"{dtype_names(x.device.type) if x.device.type in DTYPES else 'nothing'}")
        p = held(self, "weight_ih_l0")
        if p.device != x.device or p.dtype not in param_dtypes(x.dtype):
            raise TorchRefusal(f"the parameters are {p.dtype} on {p.device}, and input is {x.dtype} on "
                               f"{x.device}: move the module to the input's device and dtype")
        return x

    def _initial(self, hx, batch: int, x: torch.Tensor) -> list[torch.Tensor]:
        """The initial states in the template's order, each [layers * directions, B, H]."""
        want = (self.num_layers * self._directions, batch, self.hidden_size)
        given = (hx if isinstance(hx, (tuple, list)) else (hx,)) if hx is not None else None
        if given is not None and len(given) != len(self._state_ids):
            raise TorchRefusal(f"hx must be {self._hx_doc}, got {len(given)} tensor(s)")
        out = []
        for i, state in enumerate(self._state_ids):
            value = given[i] if given is not None else self._zeros(want, x.dtype, x.device)
            if tuple(value.shape) != want:
                raise TorchRefusal(f"hx's {state} has shape {list(value.shape)}, expected {list(want)} "
                                   "(num_layers * num_directions, batch, hidden_size)")
            if value.dtype != x.dtype or value.device != x.device:
                raise TorchRefusal(f"hx's {state} is {value.dtype} on {value.device}, and input is "
                                   f"{x.dtype} on {x.device}")
            out.append(value)
        return out

    def forward(self, input, hx=None):
        layout = (self.schedule, self.batch_first, self.training, self.dropout)
        # (first: a trace reads nothing of the kept call)
        tracing = traced_call(f"cellfuse.nn.{type(self).__name__}")
        every = None if hx is None else list(hx) if isinstance(hx, (tuple, list)) else [hx]
        if not tracing and self._quick is not None and type(input) is torch.Tensor:
            done = self._quick(input, layout, self._fused_params(), every)
            if done is not None:
                return self._returned(*done)
        fused = not self.bidirectional and (self.dropout == 0 or not self.training or self.num_layers == 1)
        input_given = input
        packed, lengths = None, None
        if isinstance(input, PackedSequence):  # padded, each row to its length, in the data's order of rows
            packed, state_layers = Unpacked(input), self.num_layers if fused else 1
            if not tracing and self._quick_packed is not None:
                done = self._quick_packed.packed(packed, input, layout, self._fused_params(), every,
                                                 self.hidden_size, state_layers)
                if done is not None:
                    return self._returned(*done)
            if packed.x is None:
                packed.pad(self.hidden_size, state_layers)
            input, lengths = packed.x, packed.lengths
        cast = stacks.autocast_dtype(input) if isinstance(input, torch.Tensor) else None
        if cast is not None:  # under torch.autocast: the input and hx in its dtype, as torch.nn.LSTM's
            input = input.to(cast)
            if hx is not None:
                hx = (tuple(h.to(cast) for h in hx) if isinstance(hx, (tuple, list)) else hx.to(cast))
        x = self._check(input)
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(1)
            if hx is not None:
                hx = tuple(h.unsqueeze(1) for h in (hx if isinstance(hx, (tuple, list)) else (hx,)))
        elif self.batch_first and packed is None:
            x = x.transpose(0, 1)
        initial = self._initial(hx, x.shape[1], x)
        if x.shape[1] == 0:
            y, finals = self._no_rows(x, initial)
            return self._returned(y.transpose(0, 1) if self.batch_first else y, finals)
        if packed is not None:
            initial = packed.sorted(initial)
        if not tracing:  # (the kept call this one would replace)
            if packed is None:
                self._quick = None
            else:
                self._quick_packed = None
        steps = None if packed is None else packed.steps
        if fused:
            params = first = self._fused_params()
            y, finals = stacks.run(x, initial, params, self._cell_text, self.hidden_size, self.num_layers,
                                   self.schedule, lengths, steps=steps)
            if not tracing and not unbatched:  # (see quick_call)
                zeros = [self._zeros(tuple(initial[0].shape), x.dtype, x.device)] * len(initial)
                if packed is None:
                    self._quick = kept_call(input_given, x, layout, params, zeros, self._cell_text,
                                            self.hidden_size, self.num_layers, ops.DEFAULT_FLOAT32,
                                            cast=cast)
                else:
                    self._quick_packed = kept_packed_call(packed, x, layout, params, zeros, self._cell_text,
                                                          self.hidden_size, self.num_layers,
                                                          ops.DEFAULT_FLOAT32, cast)
        else:
            first = self._layer_params(0, False)
            y, finals = stacks.layer_by_layer(
                x, initial, self._layer_params, self.num_layers, self.bidirectional, self.dropout,
                self.training, self._cell_text, self.hidden_size, self.schedule, lengths, steps=steps,
                kept=None if tracing else self._kept_layers)
        if not tracing:  # (as CellRNN's: whether the first call of the ops saved, by its parameters)
            self._recent.saw(x, lengths is not None, not fused, stacks.saves(x, initial, first))
        if unbatched:
            y, finals = y.squeeze(1), [f.squeeze(1) for f in finals]
        elif packed is not None:
            y, finals = packed.pack(y), packed.unsorted(finals)
        elif self.batch_first:
            y = y.transpose(0, 1)
        return self._returned(y, finals)

    def _no_rows(self, x: torch.Tensor, initial: list[torch.Tensor]
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """torch's outputs for a batch of no rows (x time first): y of no rows and the final states, the
        initial ones, each following the parameters, x and the initial states in autograd as torch's do,
        so that a backward pass gives them gradients (of zeros)."""
        follow = sum(t.reshape(-1)[:0].sum() for t in (*self._flat_weights, x))  # (a zero)
        y = x.new_zeros((x.shape[0], 0, self._directions * self.hidden_size)) + follow
        return y, [s + follow for s in initial]

    def _fused_params(self) -> list[torch.Tensor]:
        """Every layer's weights of the forward direction, for a call of the layers at once (one
        WeightViews, kept while each layer's are)."""
        layers = [self._layer_params(layer, False) for layer in range(self.num_layers)]
        if traced():
            return [p for views in layers for p in views]
        if self._fused is None or any(a is not b for a, b in zip(self._fused[0], layers, strict=True)):
            self._fused = (layers, joined(layers))
        return self._fused[1]

    def _returned(self, y: torch.Tensor, finals: list[torch.Tensor]):
        """What torch's module returns: output, (h_n, c_n) or output, h_n."""
        if self.kind == "lstm":
            return y, (finals[0], finals[1])
        return y, finals[0]


class LSTM(_TorchRNN):
    """torch.nn.LSTM's module (without `proj_size`), run by CellFuse's `lstm` template; `schedule` as
    CellRNN's. forward(input, (h_0, c_0)=None) -> output, (h_n, c_n)."""

    kind = "lstm"
    _hx_doc = "(h_0, c_0)"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None, *, schedule: str = AUTO):
        if proj_size:
            raise CellError("cellfuse.nn.LSTM has no proj_size (LSTM with projections): its template has no "
                            "projection; draw a cell with one, or use torch.nn.LSTM")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device, dtype, schedule=schedule)

    get_expected_cell_size = torch.nn.LSTM.get_expected_cell_size
    check_forward_args = torch.nn.LSTM.check_forward_args
    permute_hidden = torch.nn.LSTM.permute_hidden


class GRU(_TorchRNN):
    """torch.nn.GRU's module, run by CellFuse's `gru` template; `schedule` as CellRNN's.
    forward(input, h_0=None) -> output, h_n."""

    kind = "gru"
    _hx_doc = "h_0"
