"""Parameters and inputs of a run: their keys, shapes, random initialisation and .npz files."""

from __future__ import annotations

import io
import os
import zipfile
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


def hidden_from_params(cell: Cell, params: dict[str, np.ndarray]) -> int | None:
    """The hidden size that layer 0's parameters imply, if any weight has a hidden dimension."""
    for w in cell.of_op("weight"):
        arr = params.get(param_key(0, w.id))
        if arr is None or w.shape is None or arr.ndim != len(w.shape):
            continue
        for dim, n in zip(w.shape, arr.shape):
            if dim == "hidden":
                return int(n)
    return None


def check_params(cell: Cell, params: dict[str, np.ndarray], layers: int, input: int, hidden: int) -> None:
    for key, shape in expected_params(cell, layers, input, hidden).items():
        if key not in params:
            raise CellError(f"parameter '{key}' is missing (expected shape {list(shape)})")
        found = params[key]
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
            if arr.shape != (layers, batch, hidden):
                raise CellError(f"inputs: initial state '{s.id}' has shape {list(arr.shape)}, "
                                f"expected [{layers}, {batch}, {hidden}] (layers, batch, hidden)")
            states[s.id] = arr
        else:
            states[s.id] = np.zeros((layers, batch, hidden), np.float32)
    return x, states


def load_npz(path: str | os.PathLike[str], what: str) -> dict[str, np.ndarray]:
    """All arrays of an .npz file; never unpickles anything."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise CellError(f"{what} {path}: not an .npz archive")
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise CellError(f"{what} {path}: no such file") from None
    except CellError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise CellError(f"{what} {path}: not a readable .npz file ({e})") from None


def save_npz(path: str | os.PathLike[str], arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, buf.getvalue())
