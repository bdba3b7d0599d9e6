"""Parameters and inputs of a run: their keys, shapes, random initialisation and .npz files."""

from __future__ import annotations

import io
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cell import Cell
from .cellfile import atomic_write
from .validate import CellError


@dataclass(frozen=True)
class Sizes:
    """The sizes of one forward pass."""

    seq: int
    batch: int
    input: int
    hidden: int
    layers: int = 1

    def layer_input(self, layer: int) -> int:
        return self.input if layer == 0 else self.hidden


def param_key(layer: int, weight_id: str) -> str:
    return f"l{layer}.{weight_id}"


def weight_shape(cell: Cell, weight_id: str, input: int, hidden: int) -> tuple[int, ...]:
    dims = {"input": input, "hidden": hidden}
    return tuple(dims[d] for d in cell.node(weight_id).shape or ())


def expected_params(cell: Cell, layers: int, input: int, hidden: int) -> dict[str, tuple[int, ...]]:
    """Every parameter key a run needs, with its shape (for layer > 0, `input` is `hidden`)."""
    out = {}
    for layer in range(layers):
        k = input if layer == 0 else hidden
        for w in cell.of_op("weight"):
            out[param_key(layer, w.id)] = weight_shape(cell, w.id, k, hidden)
    return out


def init_params(cell: Cell, layers: int, input: int, hidden: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random parameters, uniform in +-1/sqrt(hidden) as PyTorch initialises its RNNs."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(hidden)
    return {key: rng.uniform(-bound, bound, size=shape).astype(np.float32)
            for key, shape in expected_params(cell, layers, input, hidden).items()}


def param_layers(params: dict[str, np.ndarray]) -> int:
    """How many layers the keys of a parameter file cover."""
    layers = 0
    for key in params:
        head = key.split(".", 1)[0]
        if head.startswith("l") and head[1:].isdigit():
            layers = max(layers, int(head[1:]) + 1)
    return layers


def sizes_from_params(cell: Cell, params: dict[str, np.ndarray]) -> dict[str, int]:
    """The input and hidden sizes the parameters imply, where some weight has such a dimension.

    Every weight of every layer votes (for layer > 0 `input` is `hidden`) and the most common size wins,
    so that one mis-shaped parameter is the one reported, not every weight that disagrees with it.
    """
    votes: dict[str, Counter[int]] = {"input": Counter(), "hidden": Counter()}
    for layer in range(param_layers(params)):
        for w in cell.of_op("weight"):
            arr = params.get(param_key(layer, w.id))
            if (not isinstance(arr, np.ndarray) or not isinstance(w.shape, list)
                    or arr.ndim != len(w.shape)):
                continue
            for dim, n in zip(w.shape, arr.shape, strict=True):
                if dim in votes:
                    votes[dim if layer == 0 else "hidden"][int(n)] += 1
    return {dim: counts.most_common(1)[0][0] for dim, counts in votes.items() if counts}


def check_params(cell: Cell, params: dict[str, np.ndarray], layers: int, input: int, hidden: int) -> None:
    for key, shape in expected_params(cell, layers, input, hidden).items():
        if key not in params:
            raise CellError(f"parameter '{key}' is missing (expected shape {list(shape)})")
        found = params[key]
        if not isinstance(found, np.ndarray):
            raise CellError(f"parameter '{key}' is a {type(found).__name__}, expected a float32 array "
                            f"of shape {list(shape)}")
        if found.shape != shape:
            raise CellError(f"parameter '{key}' has shape {list(found.shape)}, expected {list(shape)}")
        if not np.issubdtype(found.dtype, np.floating):
            raise CellError(f"parameter '{key}' has dtype {found.dtype}, expected float32")


def check_inputs(cell: Cell, inputs: dict[str, np.ndarray], layers: int, input: int | None,
                 hidden: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The input sequence and the initial states (zeros where not given), checked."""
    if "x" not in inputs:
        raise CellError("inputs: key 'x' is missing (expected float32 [T, B, input])")
    x = inputs["x"]
    if not isinstance(x, np.ndarray):
        raise CellError(f"inputs: 'x' is a {type(x).__name__}, expected a float32 array [T, B, input]")
    if x.ndim != 3 or (input is not None and x.shape[2] != input) or 0 in x.shape:
        want = f"[T, B, {input}]" if input is not None else "[T, B, input]"
        raise CellError(f"inputs: 'x' has shape {list(x.shape)}, expected {want}")
    if not np.issubdtype(x.dtype, np.floating):
        raise CellError(f"inputs: 'x' has dtype {x.dtype}, expected float32")
    batch = x.shape[1]
    states = {}
    for s in cell.of_op("state"):
        if s.id in inputs:
            arr = inputs[s.id]
            if not isinstance(arr, np.ndarray):
                raise CellError(f"inputs: initial state '{s.id}' is a {type(arr).__name__}, expected a "
                                f"float32 array [{layers}, {batch}, {hidden}]")
            if arr.shape != (layers, batch, hidden):
                raise CellError(f"inputs: initial state '{s.id}' has shape {list(arr.shape)}, "
                                f"expected [{layers}, {batch}, {hidden}] (layers, batch, hidden)")
            if not np.issubdtype(arr.dtype, np.floating):
                raise CellError(f"inputs: initial state '{s.id}' has dtype {arr.dtype}, expected float32")
            states[s.id] = arr
        else:
            states[s.id] = np.zeros((layers, batch, hidden), np.float32)
    return x, states


def load_npz(path: str | os.PathLike[str], what: str) -> dict[str, np.ndarray]:
    """All arrays of an .npz file; never unpickles anything. `what` names the file in errors."""
    path = Path(path)
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CellError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise CellError(f"{what} {path}: is a directory, not an .npz file") from None
    except Exception as e:  # a file from anywhere: whatever numpy makes of it, it is not ours to run
        raise CellError(f"{what} {path}: not a readable .npz file ({type(e).__name__}: {e})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise CellError(f"{what} {path}: not an .npz archive (an .npz holds named arrays, "
                        "as numpy.savez writes them)")
    arrays: dict[str, np.ndarray] = {}
    with data:
        for key in data.files:
            try:
                arr = data[key]
            except Exception as e:
                raise CellError(f"{what} {path}: array '{key}' cannot be read "
                                f"({type(e).__name__}: {e})") from None
            if not isinstance(arr, np.ndarray):
                raise CellError(f"{what} {path}: member '{key}' is not a numpy array")
            arrays[key] = arr
    return arrays


def save_npz(path: str | os.PathLike[str], arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, buf.getvalue())
