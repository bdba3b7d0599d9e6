"""The reference interpreter: runs a cell node by node with numpy, in float64.

It is the oracle every schedule and backend is checked against, so it is written for clarity:
no stacking, no fusion, one op of the op table at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cell import DEFAULT_SIZES, Cell
from .limits import MAX_LAYERS
from .ops import OPS, OpSpec
from .params import check_inputs, check_names, check_params, param_key, param_layers, sizes_from_params
from .validate import CellError, check_count, check_types, require_valid


@dataclass
class Forward:
    """The result of a forward pass: y [T, B, hidden] and final states [L, B, hidden]."""

    y: np.ndarray
    final: dict[str, np.ndarray]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"y": self.y, **{f"final.{s}": v for s, v in self.final.items()}}


def numpy_meaning(spec: OpSpec) -> Callable[..., Any]:
    return spec.numpy


def step(cell: Cell, order: list[str], weights: dict[str, Any], x_t: Any, states: dict[str, Any],
         meaning: Callable[[OpSpec], Callable[..., Any]] = numpy_meaning,
         const: Callable[[float], Any] = np.float64) -> dict[str, Any]:
    """The value of every live node for one step of one layer.

    Written once for every array library: `meaning` gives an elementwise op's function (numpy's by
    default; the PyTorch baselines pass torch's), `const` makes a constant, and a matmul is `a @ W`."""
    nodes = cell.by_id()
    values: dict[str, Any] = {}
    for nid in order:
        n = nodes[nid]
        if n.op == "input":
            values[nid] = x_t
        elif n.op == "state":
            values[nid] = states[nid]
        elif n.op == "weight":
            values[nid] = weights[nid]
        elif n.op == "const":
            values[nid] = const(n.value)
        elif OPS[n.op].is_matmul:
            values[nid] = values[n.args[0]] @ values[n.args[1]]
        else:
            values[nid] = meaning(OPS[n.op])(*(values[a] for a in n.args))
    return values


def resolve_run(cell: Cell, params: Mapping[str, Any], inputs: Mapping[str, Any],
                layers: int | None = None) -> tuple[int, int, np.ndarray, dict[str, np.ndarray]]:
    """Checks a run's data against the cell: (layers, hidden, x, initial states).

    In this order, so that nothing large is read or made before what makes it large is checked: the
    keys, the number of layers, the sizes the arrays' shapes imply, and only then the arrays' data.
    """
    check_types(cell)
    for what, arrays in (("parameters", params), ("inputs", inputs)):
        if not isinstance(arrays, Mapping):
            raise CellError(f"the {what} must be a mapping of names to arrays, got a {type(arrays).__name__}")
    check_names(cell, params, inputs)
    layers = max(param_layers(params), 1) if layers is None else check_count("layers", layers, MAX_LAYERS)
    implied = sizes_from_params(cell, params, layers)
    hidden = implied.get("hidden", cell.sizes.get("hidden", DEFAULT_SIZES["hidden"]))
    x, states = check_inputs(cell, inputs, layers, implied.get("input"), hidden)
    check_params(cell, params, layers, x.shape[2], hidden)
    return layers, hidden, x, states


def run_reference(cell: Cell, params: Mapping[str, Any], inputs: Mapping[str, Any],
                  layers: int | None = None) -> Forward:
    """One forward pass over the whole sequence, all layers; float64 inside, float32 out."""
    info = require_valid(cell)
    layers, hidden, x, init = resolve_run(cell, params, inputs, layers)
    seq = x.astype(np.float64)
    states_out: dict[str, list[np.ndarray]] = {s: [] for s in init}
    for layer in range(layers):
        weights = {w.id: params[param_key(layer, w.id)].astype(np.float64) for w in cell.of_op("weight")}
        states = {s: v[layer].astype(np.float64) for s, v in init.items()}
        ys = []
        for t in range(seq.shape[0]):
            with np.errstate(all="ignore"):  # overflow is caught below, as a non-finite output
                values = step(cell, info.order, weights, seq[t], states)
            states = {s: values[cell.updates[s]] for s in states}
            ys.append(values[cell.output])
        seq = np.stack(ys)
        for s, v in states.items():
            states_out[s].append(v)
    if not np.all(np.isfinite(seq)):
        raise CellError("the output holds NaN or infinity: check the parameters and inputs")
    final = {s: np.stack(v) for s, v in states_out.items()}
    for s, v in final.items():
        if not np.all(np.isfinite(v)):
            raise CellError(f"the final value of state '{s}' holds NaN or infinity: check the parameters "
                            "and inputs")
    with np.errstate(over="ignore"):  # a finite float64 beyond float32's range becomes inf, checked below
        y32 = seq.astype(np.float32)
        final32 = {s: v.astype(np.float32) for s, v in final.items()}
    if not np.all(np.isfinite(y32)) or not all(np.all(np.isfinite(v)) for v in final32.values()):
        raise CellError("the output or a final state is too large for float32: check the parameters "
                        "and inputs")
    return Forward(y32, final32)
