"""What a researcher could otherwise use, in PyTorch, on the same cell, weights and inputs:
the cell interpreted op by op ("PyTorch eager"), the same captured into a CUDA graph, the whole forward
pass (every step of every layer) under torch.compile, with CUDA graphs (mode "reduce-overhead", its
best) and in its default mode, cuDNN (torch.nn.LSTM / torch.nn.GRU) when the cell is one cuDNN
implements, the `sru` package's own CUDA kernel when the cell is the SRU template, and FlashRNN's fused
LSTM kernel (the `flashrnn` package) when it is the LSTM.

Built with `train=True`, the cell's programs and cuDNN's run with autograd, their weights leaves that
require gradients, and `Training` runs one forward + backward pass of any of them."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

import numpy as np

from ..graph_model import (
    OPS,
    Cell,
    Gradients,
    OpSpec,
    load_template,
    param_key,
    require_valid,
    state_dependent,
)
from ..graph_model.reference import step as reference_step


def torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def torch_function(torch, spec: OpSpec) -> Callable:
    """The op's function of the `torch` module: its table entry's name, dotted into submodules; a row
    reduction's over the last dim, kept as a column that spreads over the row."""
    function = functools.reduce(getattr, spec.torch.split("."), torch)
    return functools.partial(function, dim=-1, keepdim=True) if spec.is_reduction else function


def make_step(cell: Cell) -> Callable:
    """step(x_t, states: tuple, weights: dict) -> (output, new states tuple), one torch op per node: the
    reference interpreter's step, with each op's PyTorch meaning from the op table."""
    import torch

    info = require_valid(cell)
    state_ids = list(cell.updates)

    def meaning(spec: OpSpec) -> Callable:
        return torch_function(torch, spec)

    def step(x_t, states, weights):
        values = reference_step(cell, info.order, weights, x_t, dict(zip(state_ids, states, strict=True)),
                                meaning, float)
        return values[cell.output], tuple(values[cell.updates[s]] for s in state_ids)

    return step


# torch.compile's modes that the benchmark runs, by baseline name
COMPILE_MODES = {"torch.compile": "reduce-overhead", "torch.compile default": "default"}


def _as_numpy(t) -> np.ndarray:
    """A tensor's values in numpy: a 16-bit tensor's as float32 (numpy has no bfloat16)."""
    import torch

    t = t.detach().cpu()
    return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()


class _CellWeights:
    """The cell's weights as tensors, per layer by weight id; with `train`, leaves that require gradients."""

    def __init__(self, cell: Cell, params: dict[str, np.ndarray], layers: int, device: str, train: bool):
        import torch

        self.torch, self.cell, self.layers, self.train = torch, cell, layers, train
        def leaf(layer: int, weight: str):
            return torch.from_numpy(params[param_key(layer, weight)]).to(device).requires_grad_(train)

        self.weights = [{w.id: leaf(layer, w.id) for w in cell.of_op("weight")} for layer in range(layers)]

    def _grad_mode(self):
        return self.torch.enable_grad() if self.train else self.torch.no_grad()

    def parameters(self) -> list:
        return [t for layer in self.weights for t in layer.values()]

    def param_gradients(self, grads) -> dict[str, np.ndarray]:
        """The gradients of `parameters()`, in their order, by parameter key."""
        keys = [param_key(layer, w) for layer, ws in enumerate(self.weights) for w in ws]
        return {k: _as_numpy(g) for k, g in zip(keys, grads, strict=True)}


class TorchCell(_CellWeights):
    """The cell in PyTorch on the GPU, one op per node, run step by step over the whole sequence and all
    layers."""

    def __init__(self, cell: Cell, params: dict[str, np.ndarray], layers: int, device: str = "cuda",
                 train: bool = False):
        super().__init__(cell, params, layers, device, train)
        self.step = make_step(cell)

    def __call__(self, x, initial: list):
        """x: [T, B, input] tensor; initial: per state [L, B, H] tensors. Returns y [T, B, H]."""
        seq = x
        with self._grad_mode():
            for layer in range(self.layers):
                states = tuple(s[layer] for s in initial)
                ys = []
                for t in range(seq.shape[0]):
                    out, states = self.step(seq[t], states, self.weights[layer])
                    ys.append(out)
                seq = self.torch.stack(ys)
        return seq


class CompiledCell(_CellWeights):
    """The whole forward pass (every step of every layer) under torch.compile in one mode, written as a
    PyTorch programmer writes an RNN by hand, so that torch.compile starts from its best program: the
    matmuls that share a left operand are one matmul on weights concatenated along N, and everything that
    depends on no state (the input projections, and any work on x before them) runs once over all steps
    before the loop. The op-by-op program of `TorchCell` compiles too, but to a slower forward
    (docs/results/2026-11-23-templates-and-baselines.md).
    With mode None, the same program runs uncompiled (how it is checked on a machine without a GPU).
    With `train`, the stacked weights are concatenated in the forward pass, from the weights that are the
    leaves, so that autograd splits their gradient back (a weight in two groups gets the sum of both)."""

    def __init__(self, cell: Cell, params: dict[str, np.ndarray], layers: int, mode: str | None,
                 device: str = "cuda", train: bool = False):
        super().__init__(cell, params, layers, device, train)
        info = require_valid(cell)
        self.order, self.shapes = info.order, info.shapes
        self.nodes = cell.by_id()
        state_dep = state_dependent(cell, self.order)
        # what runs once over the whole sequence before the loop, and what runs in each step
        self.before_loop = [n for n in self.order if not state_dep[n] and self.nodes[n].op != "input"]
        self.in_step = [n for n in self.order if state_dep[n] and self.nodes[n].op != "state"]
        # matmuls by left operand, in order; each group's weights concatenated along N, per layer
        self.groups: dict[str, list[str]] = {}
        for n in self.order:
            if OPS[self.nodes[n].op].is_matmul:
                self.groups.setdefault(self.nodes[n].args[0], []).append(n)
        with self.torch.no_grad():  # training stacks them in the forward pass, for autograd to split back
            self.stacked = [] if self.train else [self._stack(layer) for layer in range(layers)]
        self.forward = self._forward
        if mode:
            # torch.compile keeps its compiled code per Python code object, and past 8 entries (say, the
            # fifth cell of a benchmark, compiled in two modes) it runs the rest uncompiled without a
            # word. Each CompiledCell compiles a copy of `_forward`'s code: an entry of its own.
            code = CompiledCell._forward.__code__.replace()
            forward = types.FunctionType(code, globals(), "forward")
            self.forward = self.torch.compile(types.MethodType(forward, self), mode=mode, dynamic=False)

    def _stack(self, layer: int) -> dict:
        """Each group's weights of one layer concatenated along N, by the group's left operand."""
        w = self.weights[layer]
        return {left: self.torch.cat([w[self.nodes[m].args[1]] for m in ms], dim=1)
                for left, ms in self.groups.items()}

    def _values(self, nodes: list[str], values: dict, layer: int, row_of: Callable, stacked: dict) -> None:
        """Computes `nodes` (in order) into `values`; row_of(a) is the value of an arg read from outside."""
        torch = self.torch
        for n in nodes:
            node = self.nodes[n]
            spec = OPS[node.op]
            if node.op == "weight":
                values[n] = self.weights[layer][n]
            elif node.op == "const":
                values[n] = float(node.value)
            elif spec.is_matmul:
                if n not in values:  # the first of its group: the group's one matmul
                    ms = self.groups[node.args[0]]
                    out = row_of(node.args[0]) @ stacked[node.args[0]]
                    widths = [self.weights[layer][self.nodes[m].args[1]].shape[1] for m in ms]
                    values.update(zip(ms, torch.split(out, widths, dim=1), strict=True))
            elif spec.in_kernel:
                values[n] = torch_function(torch, spec)(*(row_of(a) for a in node.args))

    def _forward(self, x, initial: list):
        seq = x
        state_ids = list(self.cell.updates)
        for layer in range(self.layers):
            T, B = seq.shape[0], seq.shape[1]
            stacked = self._stack(layer) if self.train else self.stacked[layer]
            hoisted = {n: seq.reshape(T * B, -1) for n in self.order if self.nodes[n].op == "input"}
            self._values(self.before_loop, hoisted, layer, hoisted.__getitem__, stacked)
            # Each step's rows of a hoisted value, split once: autograd joins the steps' gradients back
            # with one concatenation. Indexing the rows in each step instead gives each step's gradient
            # its own zero-padded full-size tensor, which torch.compile sums in one kernel that reads all
            # T of them for every element (a large part of the peephole LSTM's training step, measured:
            # docs/results/2026-11-26-training-against-torch-compile.md).
            rows = {a: v.split(B) for a, v in hoisted.items() if self.shapes[a] and self.shapes[a][0] == "B"}
            states = {s: initial[i][layer] for i, s in enumerate(state_ids)}
            ys = []
            for t in range(T):
                step = dict(states)

                def row_of(a, t=t, step=step, hoisted=hoisted, rows=rows):
                    if a in step:
                        return step[a]
                    return rows[a][t] if a in rows else hoisted[a]

                self._values(self.in_step, step, layer, row_of, stacked)
                states = {s: row_of(self.cell.updates[s]) for s in state_ids}
                ys.append(row_of(self.cell.output))
            seq = self.torch.stack(ys)
        return seq

    def __call__(self, x, initial: list):
        with self._grad_mode():
            return self.forward(x, initial)


class Autocast:
    """A model run under torch.autocast to a 16-bit `dtype`, as PyTorch's mixed precision runs a module:
    its weights stay float32, and autocast runs the ops it lists for `dtype` (the matmuls) in it and those
    it lists for float32 in float32. The weights are made leaves that require gradients, as a module's
    parameters are, so that autocast casts each once per call instead of at each step's use."""

    def __init__(self, model, dtype):
        self.model, self.dtype = model, dtype
        for weight in model.parameters():
            weight.requires_grad_()

    def __call__(self, x, initial: list):
        import torch

        with torch.autocast(x.device.type, dtype=self.dtype):
            return self.model(x, initial)

    def parameters(self):  # (the model's, for a training pass: see Training)
        return self.model.parameters()

    def param_gradients(self, grads) -> dict[str, np.ndarray]:
        return self.model.param_gradients(grads)


class GraphedCell:
    """A model's whole forward pass on fixed tensors, captured once into a CUDA graph and replayed: what
    eager PyTorch gives once its launch overhead is gone."""

    def __init__(self, model: TorchCell | Autocast, x, initial: list, warmup: int = 3):
        import torch

        self.x, self.initial = x, initial
        side = torch.cuda.Stream()  # torch.cuda.graph wants warm-up runs on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                model(x, initial)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.y = model(x, initial)

    def __call__(self, x, initial: list):
        """Replays the graph; x and initial must be the tensors it was captured on."""
        if x is not self.x or initial is not self.initial:
            raise ValueError("a captured forward pass replays on the tensors it was captured on")
        self.graph.replay()
        return self.y


def cudnn_kind(cell: Cell) -> str | None:
    """"lstm" or "gru" when the cell computes what torch.nn.LSTM / torch.nn.GRU compute."""
    for kind in ("lstm", "gru"):
        if cell.structure_hash() == load_template(kind).structure_hash():
            return kind
    return None


# The cell's parameters of each gate, in the gate order of cuDNN and of torch.nn.LSTM / GRU: (input weight,
# recurrent weight, bias) for the LSTM, whose one bias per gate is cuDNN's b_ih + b_hh; (input weight,
# recurrent weight, input bias, recurrent bias) for the GRU, whose recurrent bias of the new gate is
# inside r * (...), as in cuDNN's and PyTorch's GRU.
CUDNN_GATES = {"lstm": [("W_i", "U_i", "b_i"), ("W_f", "U_f", "b_f"), ("W_g", "U_g", "b_g"),
                        ("W_o", "U_o", "b_o")],
               "gru": [("W_ir", "W_hr", "b_ir", "b_hr"), ("W_iz", "W_hz", "b_iz", "b_hz"),
                       ("W_in", "W_hn", "b_in", "b_hn")]}


def cudnn_gates(kind: str, params: dict[str, np.ndarray], layer: int, reverse: bool = False
                ) -> list[tuple[np.ndarray, ...]]:
    """One layer's parameters (of its reverse direction, where `reverse`) gate by gate in cuDNN's order
    (CUDNN_GATES): its input matrix and its recurrent one as cuDNN holds them, [out, in] (the cell's
    x @ W has W [in, out]: the transpose), its input bias and its recurrent bias, which cuDNN adds (the
    LSTM cell has one bias per gate: the input bias, beside a recurrent bias of zeros)."""
    out = []
    for names in CUDNN_GATES[kind]:
        w_in, w_rec, b_in = (params[param_key(layer, name, reverse)] for name in names[:3])
        b_rec = params[param_key(layer, names[3], reverse)] if len(names) == 4 else np.zeros_like(b_in)
        out.append((w_in.T, w_rec.T, b_in, b_rec))
    return out


class CudnnCell:
    """torch.nn.LSTM or torch.nn.GRU (cuDNN) loaded with the cell's weights, in the torch `dtype` (None: that
    of `params`); both directions where `bidirectional` (the reverse one's weights the l{layer}.reverse.*
    keys)."""

    def __init__(self, kind: str, params: dict[str, np.ndarray], layers: int, input_size: int, hidden: int,
                 device: str = "cuda", train: bool = False, bidirectional: bool = False, dtype=None):
        import torch

        self.torch, self.kind, self.layers, self.hidden, self.train = torch, kind, layers, hidden, train
        self.suffixes = ("", "_reverse") if bidirectional else ("",)
        cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
        if dtype is None:
            dtype = torch.from_numpy(params[param_key(0, CUDNN_GATES[kind][0][0])]).dtype
        # In training mode: cuDNN's backward pass refuses a module in eval mode (and there is no dropout).
        self.module = cls(input_size, hidden, num_layers=layers, bidirectional=bidirectional).to(
            device, dtype).train(train)
        with torch.no_grad():
            for layer in range(layers):
                for suffix in self.suffixes:
                    # torch.nn.LSTM / GRU stack the gates' matrices and biases along their rows
                    gates = cudnn_gates(kind, params, layer, bool(suffix))
                    for i, name in enumerate(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
                        value = np.concatenate([gate[i] for gate in gates])
                        getattr(self.module, f"{name}_l{layer}{suffix}").copy_(torch.from_numpy(value))

    def __call__(self, x, initial: list):
        with self.torch.enable_grad() if self.train else self.torch.no_grad():
            if self.kind == "lstm":  # the cell's states are (h, c), as torch.nn.LSTM's
                y, _ = self.module(x, (initial[0], initial[1]))
            else:
                y, _ = self.module(x, initial[0])
        return y

    def parameters(self) -> list:
        return [getattr(self.module, f"{name}_l{layer}{suffix}") for layer in range(self.layers)
                for suffix in self.suffixes for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]

    def param_gradients(self, grads) -> dict[str, np.ndarray]:
        """The gradients of `parameters()`, in their order, mapped back to the cell's parameter keys: the
        mapping of __init__ read backwards (gate i's rows of weight_ih are W^T; the LSTM's one bias per
        gate is bias_ih + bias_hh, whose gradients are the same)."""
        H, out = self.hidden, {}
        grads = iter([_as_numpy(g) for g in grads])
        for layer in range(self.layers):
            for suffix in self.suffixes:
                w_ih, w_hh, b_ih, b_hh = (next(grads) for _ in range(4))
                for i, gate in enumerate(CUDNN_GATES[self.kind]):
                    rows = slice(i * H, (i + 1) * H)
                    key = functools.partial(param_key, layer, reverse=bool(suffix))
                    out[key(gate[0])] = w_ih[rows].T
                    out[key(gate[1])] = w_hh[rows].T
                    out[key(gate[2])] = b_ih[rows]
                    if self.kind == "gru":
                        out[key(gate[3])] = b_hh[rows]
        return out


SRU_PACKAGE = "sru package"  # the baseline's name
SRU_INSTALL = "pip install sru ninja"  # ninja builds its kernel at the first import


def is_sru(cell: Cell) -> bool:
    """True when the cell computes what the `sru` package's SRU computes (our `sru` template)."""
    return cell.structure_hash() == load_template("sru").structure_hash()


@functools.cache
def sru_unavailable() -> str | None:
    """Why the `sru` package's CUDA kernel cannot run here, or None. The package compiles its kernel with
    the machine's nvcc at its first import and, when that fails, warns and loads a stub that fails at the
    first call: the warning is the reason."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import sru  # noqa: F401
        except Exception as e:  # not installed, or not even the stub builds (no ninja, no compiler)
            return f"the sru package does not import ({type(e).__name__}: {e}); {SRU_INSTALL}"
    for w in caught:
        if "unsuccessful" in str(w.message):  # the compiler's first error says most; ninja's last line least
            lines = [line.strip() for line in str(w.message).splitlines()[1:] if line.strip()]
            errors = [line for line in lines if "error" in line.lower()]
            return f"the sru package's CUDA kernel did not build: {(errors or lines)[0]}"
    return None


class SruPackageCell:
    """The `sru` package's SRU (Lei et al. 2017, its version 2 with v_f, v_r on c(t-1); no tanh, no
    rescaling of x, no dropout) loaded with the SRU template's weights: the package's own fused CUDA kernel
    for the recurrence, beside cuBLAS for the input projection. Its weight of a layer is [input, 3 * hidden]
    with the three matrices interleaved per hidden unit (column 3j + k is unit j of matrix k: x_tilde's W,
    then W_f, then W_r); v and b are [forget; reset]."""

    MATRICES = ("W", "W_f", "W_r")

    def __init__(self, params: dict[str, np.ndarray], layers: int, input_size: int, hidden: int,
                 device: str = "cuda", train: bool = False):
        import sru
        import torch

        self.torch, self.layers, self.hidden, self.train = torch, layers, hidden, train
        dtype = torch.from_numpy(params[param_key(0, "W")]).dtype
        self.module = sru.SRU(input_size, hidden, num_layers=layers, dropout=0.0, rescale=False,
                              has_skip_term=True, use_tanh=False, layer_norm=False)
        self.module = self.module.to(device, dtype).train(train)
        with torch.no_grad():
            for layer, rnn in enumerate(self.module.rnn_lst):
                def p(name: str, layer: int = layer) -> np.ndarray:
                    return params[param_key(layer, name)]

                weight = np.stack([p(m) for m in self.MATRICES], axis=-1).reshape(input_size, 3 * hidden)
                for name, value in (("weight", weight), ("weight_c", np.concatenate([p("v_f"), p("v_r")])),
                                    ("bias", np.concatenate([p("b_f"), p("b_r")]))):
                    getattr(rnn, name).copy_(torch.from_numpy(value))

    def __call__(self, x, initial: list):
        with self.torch.enable_grad() if self.train else self.torch.no_grad():
            y, _ = self.module(x, initial[0])  # the template's one state is c
        return y

    def parameters(self) -> list:
        return [getattr(rnn, name) for rnn in self.module.rnn_lst for name in ("weight", "weight_c", "bias")]

    def param_gradients(self, grads) -> dict[str, np.ndarray]:
        """The gradients of `parameters()`, in their order, mapped back to the cell's parameter keys."""
        H, out = self.hidden, {}
        grads = [_as_numpy(g) for g in grads]
        for layer in range(self.layers):
            weight, v, b = grads[3 * layer:3 * layer + 3]
            per_matrix = weight.reshape(weight.shape[0], H, 3)
            for k, m in enumerate(self.MATRICES):
                out[param_key(layer, m)] = per_matrix[:, :, k]
            for name, value in (("v_f", v[:H]), ("v_r", v[H:]), ("b_f", b[:H]), ("b_r", b[H:])):
                out[param_key(layer, name)] = value
        return out


FLASHRNN = "flashrnn"  # the baseline's name
FLASHRNN_INSTALL = "pip install flashrnn einops ninja"  # ninja builds its kernels at the first call
FLASHRNN_BACKEND = "cuda_fused"  # its fastest: the recurrence in one kernel, the weights on chip


def flashrnn_unavailable() -> str | None:
    """Why FlashRNN cannot run here, or None (its kernels are built at the first call, whose failure the
    benchmark reports)."""
    try:
        import flashrnn  # noqa: F401
    except Exception as e:
        return f"the flashrnn package does not import ({type(e).__name__}: {e}); {FLASHRNN_INSTALL}"
    return None


@functools.cache  # (once: the package's function is replaced for the process)
def _give_flashrnn_the_device_limits() -> None:
    """FlashRNN sizes its kernels from four of the device's limits, which it reads through a C++ extension
    of its own built at the first call; that extension copies every field of cudaDeviceProp, some of which
    CUDA 13 removed (clockRate, memoryClockRate, ...), so that its build fails there. The same four limits,
    read from the driver, leave its kernels as they are."""
    import importlib

    from .driver import bindings, check

    cu = bindings()
    attribute = cu.CUdevice_attribute
    limits = {"maxThreadsPerBlock": attribute.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
              "regsPerMultiprocessor": attribute.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
              "multiProcessorCount": attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
              "sharedMemPerBlockOptin": attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN}

    def device_limits(device_id: int) -> dict:
        check(cu.cuInit(0), "initialising the driver")
        device = check(cu.cuDeviceGet(device_id), "asking for the device")
        return {key: int(check(cu.cuDeviceGetAttribute(which, device), f"asking for the device's {key}"))
                for key, which in limits.items()}

    importlib.import_module("flashrnn.flashrnn.flashrnn").get_gpu_info = device_limits


class FlashRnnCell:
    """FlashRNN's LSTM (Pöppel et al. 2024, the `flashrnn` package) loaded with the LSTM template's weights,
    a layer at a time: x @ W for all steps by torch's matmul, then the recurrence by FlashRNN, which takes
    those pre-activations [B, T, gates, heads, H] (one head here), its recurrent matrix [gates, heads, H, H]
    as cuDNN holds each gate's ([out, in]), one bias per gate, and the states (h, c) [2, B, 1, heads, H].
    Its gates are cuDNN's order (i, f, z = g, o). Forward only; the tensors in `dtype`."""

    def __init__(self, params: dict[str, np.ndarray], layers: int, hidden: int, dtype, device: str = "cuda",
                 backend: str = FLASHRNN_BACKEND):
        import torch
        from flashrnn import flashrnn

        if backend != "vanilla":
            _give_flashrnn_the_device_limits()
        self.torch, self.flashrnn, self.backend, self.hidden = torch, flashrnn, backend, hidden
        self.dtype_name = str(dtype).removeprefix("torch.")
        self.layers = []
        for layer in range(layers):
            gates = cudnn_gates("lstm", params, layer)
            w = np.concatenate([gate[0].T for gate in gates], axis=1)  # [in, 4H]: x @ w, gate by gate
            r = np.stack([gate[1] for gate in gates])[:, None]  # [4, 1, H, H]
            b = np.stack([gate[2] + gate[3] for gate in gates])[:, None]  # [4, 1, H]
            self.layers.append(tuple(torch.from_numpy(a).to(device, dtype) for a in (w, r, b)))

    def __call__(self, x, initial: list):
        torch, H = self.torch, self.hidden
        T, B = x.shape[0], x.shape[1]
        with torch.no_grad():
            for layer, (w, r, b) in enumerate(self.layers):
                wx = (x @ w).view(T, B, 4, 1, H).transpose(0, 1).contiguous()
                states = torch.stack([initial[0][layer], initial[1][layer]]).view(2, B, 1, 1, H).to(x.dtype)
                out, _ = self.flashrnn(wx, r, b, states=states, function="lstm", backend=self.backend,
                                       dtype=self.dtype_name)
                x = out[0, :, :, 0, :].transpose(0, 1)  # h of every step, [T, B, H]
        return x


class Training:
    """One forward + backward pass of a baseline built with `train=True`, with autograd: the gradients of
    sum(dy * y) with respect to x, the initial states and every parameter, as the backward Plans give them.
    Each call returns torch's gradient tensors (which a CUDA-graphed model may overwrite in its next call:
    `gradients` copies them out)."""

    def __init__(self, model, state_ids: list[str], x, initial: list, dy):
        import torch

        self.torch, self.model, self.state_ids, self.dy = torch, model, state_ids, dy
        self.x = x.detach().clone().requires_grad_()
        self.initial = [s.detach().clone().requires_grad_() for s in initial]
        self.leaves = [self.x, *self.initial, *model.parameters()]

    def __call__(self) -> tuple:
        y = self.model(self.x, self.initial)
        return self.torch.autograd.grad(y, self.leaves, self.dy)

    def gradients(self, grads) -> Gradients:
        n = len(self.state_ids)
        dinitial = zip(self.state_ids, grads[1:1 + n], strict=True)
        return Gradients(grads[0].detach().cpu().numpy(), {s: g.detach().cpu().numpy() for s, g in dinitial},
                         self.model.param_gradients(grads[1 + n:]))
