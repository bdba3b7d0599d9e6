"""The reference backward pass: the exact derivative of a run, in float64, by backpropagation through time.

For a seed dy of the output sequence y [T, B, hidden] and seeds dfinal of the final states [L, B, hidden],
it computes the gradient of sum(dy * y) + sum over states s of sum(dfinal[s] * final[s]) with respect to
the input sequence, every initial state and every parameter. Like the reference interpreter it is the
oracle, written for clarity: the forward runs the reference's `step`, and the backward walks each step's
nodes once in reverse topological order, applying the derivative rules of the op table.

What the backward reads of the forward: the value of every live node of every step of every layer (a
`Tape`). It is the simplest choice and the exact one (nothing is recomputed, so nothing can differ from
the forward), at a memory cost of T * layers * nodes values, which a reference can afford.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cell import Cell
from .ops import OPS
from .params import param_key
from .reference import resolve_run, step
from .validate import CellError, require_valid, shown


@dataclass
class Tape:
    """A forward pass in float64 with what its backward pass needs: y [T, B, hidden], the final states
    [L, B, hidden], each layer's weights, and values[layer][t], the value of every live node."""

    cell: Cell
    order: list[str]  # the live nodes, in topological order
    y: np.ndarray
    final: dict[str, np.ndarray]
    weights: list[dict[str, np.ndarray]]
    values: list[list[dict[str, np.ndarray]]]


@dataclass
class Gradients:
    """The gradients of a backward pass, in float64, each of the shape of what it is the gradient of:
    dx [T, B, input], dinitial[state] [L, B, hidden] for every state of the cell (given as an input or
    not), dparams[key] for every parameter key."""

    dx: np.ndarray
    dinitial: dict[str, np.ndarray]
    dparams: dict[str, np.ndarray]


def record_forward(cell: Cell, params: Mapping[str, Any], inputs: Mapping[str, Any],
                   layers: int | None = None) -> Tape:
    """The forward pass of `run_reference`, kept in float64 (run_reference's y and final are this y and
    final rounded to float32), with every node's value of every step.

    Raises CellError where run_reference does, but for values too large for float32, which float64
    holds; and for a cell with an op whose table entry has no derivative: the tape is for a backward
    pass."""
    info = require_valid(cell)
    nodes = cell.by_id()
    missing = sorted({nodes[nid].op for nid in info.order
                      if not OPS[nodes[nid].op].is_source and OPS[nodes[nid].op].grad is None})
    if missing:
        raise CellError(f"cell '{cell.name}' uses op(s) with no derivative in the op table: "
                        f"{', '.join(missing)}")
    layers, _, x, init = resolve_run(cell, params, inputs, layers)
    seq = x.astype(np.float64)
    all_weights, all_values = [], []
    final: dict[str, list[np.ndarray]] = {s: [] for s in init}
    for layer in range(layers):
        weights = {w.id: params[param_key(layer, w.id)].astype(np.float64) for w in cell.of_op("weight")}
        states = {s: v[layer].astype(np.float64) for s, v in init.items()}
        steps = []
        for t in range(seq.shape[0]):
            with np.errstate(all="ignore"):  # overflow is caught below, as a non-finite output
                values = step(cell, info.order, weights, seq[t], states)
            steps.append(values)
            states = {s: values[cell.updates[s]] for s in states}
        seq = np.stack([values[cell.output] for values in steps])
        for s, v in states.items():
            final[s].append(v)
        all_weights.append(weights)
        all_values.append(steps)
    tape = Tape(cell, info.order, seq, {s: np.stack(v) for s, v in final.items()}, all_weights, all_values)
    if not np.all(np.isfinite(seq)) or not all(np.all(np.isfinite(v)) for v in tape.final.values()):
        raise CellError("the output or a final state holds NaN or infinity: check the parameters and inputs")
    return tape


def _seed(what: str, value: object, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise CellError(f"{what} must be a float array of shape {list(shape)}, got a {type(value).__name__}")
    if value.shape != shape:
        raise CellError(f"{what} has shape {list(value.shape)}, expected {list(shape)}")
    if not np.issubdtype(value.dtype, np.floating):
        raise CellError(f"{what} has dtype {value.dtype}, expected a float dtype")
    if not np.all(np.isfinite(value)):
        raise CellError(f"{what} holds NaN or infinity")
    return value.astype(np.float64)


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The gradient of an arg of `shape` from the gradient `g` of the broadcast value: a [N] row was
    repeated over the batch, a [B, 1] column over the row and a scalar over everything, so their
    gradients are the sums."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    spread = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=spread, keepdims=True) if spread else g


def _accumulate(grads: dict[str, np.ndarray], nid: str, g: np.ndarray) -> None:
    # Never in place: a rule may return its upstream gradient itself (add's does), shared with others.
    grads[nid] = grads[nid] + g if nid in grads else g


def backward(tape: Tape, dy: np.ndarray, dfinal: Mapping[str, np.ndarray] | None = None) -> Gradients:
    """The gradients of sum(dy * y) + sum(dfinal[s] * final[s]) for the run recorded in `tape`.

    dy has y's shape [T, B, hidden]; dfinal maps states (any of them, or none) to seeds of their final
    values' shape [L, B, hidden]. Raises CellError for a seed that does not fit, or gradients that are
    not finite."""
    cell, nodes = tape.cell, tape.cell.by_id()
    layers, (seq, batch, hidden) = len(tape.values), tape.y.shape
    dseq = _seed("dy", dy, tape.y.shape)
    if dfinal is None:
        dfinal = {}
    if not isinstance(dfinal, Mapping):
        raise CellError(f"dfinal must map states to arrays, got a {type(dfinal).__name__}")
    for s in dfinal:
        if s not in tape.final:
            raise CellError(f"dfinal: {shown(s)} is not a state of cell '{cell.name}' "
                            f"(states: {', '.join(tape.final) or 'none'})")
    seeds = {s: _seed(f"dfinal '{s}'", v, (layers, batch, hidden)) for s, v in dfinal.items()}
    # Only what depends on the input, a state or a weight has a gradient anyone asks for.
    varies: dict[str, bool] = {}
    for nid in tape.order:
        varies[nid] = nodes[nid].op in ("input", "state", "weight") or any(varies[a] for a in nodes[nid].args)

    input_id = cell.of_op("input")[0].id
    dinitial = {s: np.zeros((layers, batch, hidden)) for s in tape.final}
    dparams = {param_key(layer, w): np.zeros_like(v)
               for layer, weights in enumerate(tape.weights) for w, v in weights.items()}
    with np.errstate(all="ignore"):  # a non-finite gradient is caught below
        for layer in reversed(range(layers)):
            steps = tape.values[layer]
            dlayer_in = np.zeros((seq, *steps[0][input_id].shape))
            # the gradient of each state's value after the step being walked back
            dstate = {s: seeds[s][layer] if s in seeds else np.zeros((batch, hidden)) for s in tape.final}
            for t in reversed(range(seq)):
                values = steps[t]
                grads: dict[str, np.ndarray] = {cell.output: dseq[t]}
                for s, target in cell.updates.items():
                    _accumulate(grads, target, dstate[s])
                dstate = {s: np.zeros((batch, hidden)) for s in tape.final}
                for nid in reversed(tape.order):
                    if nid not in grads:
                        continue
                    g, n = grads.pop(nid), nodes[nid]
                    if n.op == "input":
                        dlayer_in[t] += g
                    elif n.op == "state":
                        dstate[nid] = g  # its value at step t is its value after step t-1
                    elif n.op == "weight":
                        dparams[param_key(layer, nid)] += g
                    else:  # no const has a gradient: nothing it computes varies
                        args = [values[a] for a in n.args]
                        for a, rule in zip(n.args, OPS[n.op].grad, strict=True):
                            if varies[a]:
                                _accumulate(grads, a, _unbroadcast(rule(g, *args, values[nid]),
                                                                   np.shape(values[a])))
            for s, g in dstate.items():
                dinitial[s][layer] = g
            dseq = dlayer_in  # layer l's input is layer l-1's output sequence
    out = Gradients(dseq, dinitial, dparams)
    for what, g in [("x", out.dx), *out.dinitial.items(), *out.dparams.items()]:
        if not np.all(np.isfinite(g)):
            raise CellError(f"the gradient of {what} holds NaN or infinity: check the parameters, inputs "
                            "and seeds")
    return out


def run_reference_backward(cell: Cell, params: Mapping[str, Any], inputs: Mapping[str, Any],
                           layers: int | None, dy: np.ndarray,
                           dfinal: Mapping[str, np.ndarray] | None = None) -> Gradients:
    """The gradients of sum(dy * y) + sum(dfinal[s] * final[s]) for the run `run_reference(cell, params,
    inputs, layers)`, with respect to inputs['x'], every initial state and every parameter; in float64.

    dy is a seed of y's shape [T, B, hidden]; dfinal maps some states (or none) to seeds of the shape of
    their final values [L, B, hidden]. For a loss of y and the final states, the seeds are the loss's
    gradients with respect to them (computed from `record_forward`'s values, then `backward`)."""
    return backward(record_forward(cell, params, inputs, layers), dy, dfinal)
