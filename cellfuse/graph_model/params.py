"""Parameters and inputs of a run: their keys, shapes, size limits, random initialisation and .npz files."""

from __future__ import annotations

import io
import math
import operator
import os
import re
import weakref
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np

from .cell import Cell, Node
from .cellfile import as_path, atomic_write, open_regular
from .limits import MAX_ELEMENTS, MAX_LAYERS, MAX_LENGTH, MAX_WIDTH
from .validate import DIMS, CellError, CellInfo, analyze, check_count, check_types, number_str, shown


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


REVERSE = "reverse"  # the middle part of a bidirectional stack's reverse-direction keys: l0.reverse.W


def param_key(layer: int, weight_id: str, reverse: bool = False) -> str:
    return f"l{layer}.{REVERSE}.{weight_id}" if reverse else f"l{layer}.{weight_id}"


def _weight_dims(w: Node) -> list[str]:
    if not isinstance(w.shape, list) or len(w.shape) not in (1, 2) or any(d not in DIMS for d in w.shape):
        raise CellError(f"node '{w.id}': a weight's shape must be one or two of {list(DIMS)}, "
                        f"got {shown(w.shape)}")
    return w.shape


def weight_shape(cell: Cell, weight_id: str, input: int, hidden: int) -> tuple[int, ...]:
    dims = {"input": input, "hidden": hidden}
    return tuple(dims[d] for d in _weight_dims(cell.node(weight_id)))


# -- size limits ----------------------------------------------------------------------------------

def _weight_elements(cell: Cell, layers: int, input: int, hidden: int) -> int:
    """How many numbers the weights of all layers hold (for layer > 0, `input` is `hidden`)."""
    def one_layer(k: int) -> int:
        return sum(math.prod(weight_shape(cell, w.id, k, hidden)) for w in cell.of_op("weight"))

    return one_layer(input) + (layers - 1) * one_layer(hidden)


def check_sizes(sizes: Sizes, cell: Cell | None = None) -> None:
    """Raises CellError unless the sizes can be run: each a whole number from 1 to its limit (see
    limits.py), and the arrays they imply within MAX_ELEMENTS elements: the activations (the input
    sequence and every layer's outputs) and, given the cell, its weights for every layer.

    Call it before any work that the sizes scale: the message names the size, its value and the limit,
    where the work itself would hang, overflow or run out of memory.
    """
    if not isinstance(sizes, Sizes):
        raise CellError(f"expected Sizes, got a {type(sizes).__name__}")
    if cell is not None:
        check_types(cell)
    layers = check_count("layers", sizes.layers, MAX_LAYERS)
    seq = check_count("the sequence length", sizes.seq, MAX_LENGTH)
    batch = check_count("the batch size", sizes.batch, MAX_LENGTH)
    input = check_count("the input size", sizes.input, MAX_WIDTH)
    hidden = check_count("the hidden size", sizes.hidden, MAX_WIDTH)
    activations = seq * batch * (input + layers * hidden)
    if activations > MAX_ELEMENTS:
        raise CellError(f"seq {seq}, batch {batch}, input {input}, hidden {hidden} and {layers} layer(s) "
                        f"make {activations} activations (the input sequence and every layer's outputs), "
                        f"above the limit of {MAX_ELEMENTS}")
    if cell is not None:
        weights = _weight_elements(cell, layers, input, hidden)
        if weights > MAX_ELEMENTS:
            raise CellError(f"the weights of {layers} layer(s) of cell '{cell.name}' at input {input}, "
                            f"hidden {hidden} hold {weights} numbers, above the limit of {MAX_ELEMENTS}")


def check_widths(sizes: Sizes, cell: Cell, info: CellInfo | None = None) -> None:
    """Raises CellError, in one sentence naming the node, where the cell combines a [batch, input] value
    with a [batch, hidden] one (a width tie, see validate.WidthTie) and the first layer's input size is
    not its hidden size; every later layer reads hidden-wide values, so only the first is checked.
    `info` is the cell's analysis where the caller has it.

    Called by whatever runs, plans or makes parameters for the sizes, and not by check_sizes, which a
    caller that knows only some of the sizes (the input of an inputs file) calls too."""
    ties = (info or analyze(cell)).ties
    if ties and sizes.input != sizes.hidden:
        tie = ties[0]
        raise CellError(f"cell '{cell.name}' cannot run at input size {number_str(sizes.input)} and hidden "
                        f"size {number_str(sizes.hidden)}: node '{tie.node}' {tie.reason}, so the two must "
                        "be equal")


# -- parameters -----------------------------------------------------------------------------------

def expected_params(cell: Cell, layers: int, input: int, hidden: int,
                    bidirectional: bool = False) -> dict[str, tuple[int, ...]]:
    """Every parameter key a run needs, with its shape (for layer > 0, `input` is `hidden`, or twice it
    in a bidirectional stack, whose layers read both directions' outputs side by side; there each layer
    has its reverse direction's keys, `l{layer}.reverse.{weight}`, after its own).

    Only shapes, nothing allocated: the sizes are checked by whoever makes or reads the arrays (a plan
    for export may name sizes no run could hold). The layers are bounded, as they are looped over."""
    check_types(cell)
    layers = check_count("layers", layers, MAX_LAYERS)
    out = {}
    for layer in range(layers):
        k = input if layer == 0 else hidden * (2 if bidirectional else 1)
        for reverse in (False, True) if bidirectional else (False,):
            for w in cell.of_op("weight"):
                out[param_key(layer, w.id, reverse)] = weight_shape(cell, w.id, k, hidden)
    return out


def _check_seed(seed: object) -> int:
    try:
        n = None if isinstance(seed, bool) else operator.index(seed)
    except TypeError:
        n = None
    if n is None or n < 0:
        raise CellError(f"a seed must be a whole number, 0 or more, got {shown(seed)}")
    return n


def init_params(cell: Cell, layers: int, input: int, hidden: int, seed: int = 0,
                bidirectional: bool = False) -> dict[str, np.ndarray]:
    """Random parameters, uniform in +-1/sqrt(hidden) as PyTorch initialises its RNNs (with the reverse
    direction's too, where `bidirectional`: see expected_params)."""
    try:
        # The weights do not depend on the sequence or the batch: 1 leaves them unconstrained.
        sizes = Sizes(seq=1, batch=1, input=input, hidden=hidden, layers=layers)
        check_sizes(sizes, cell)
        check_widths(sizes, cell)
    except CellError as e:
        raise CellError(f"cannot make parameters: {e}") from None
    shapes = expected_params(cell, layers, input, hidden, bidirectional)
    rng = np.random.default_rng(_check_seed(seed))
    bound = 1.0 / math.sqrt(hidden)
    try:
        return {key: rng.uniform(-bound, bound, size=shape).astype(np.float32)
                for key, shape in shapes.items()}
    except MemoryError:
        raise CellError(f"cannot make parameters: not enough memory for {layers} layer(s) at input {input}, "
                        f"hidden {hidden}") from None


_LAYER_HEAD = re.compile(r"l([0-9]+)")


def _layer_of(key: object) -> int | None:
    """The layer a parameter key is for (`l3.W`: 3), or None for a key that names no layer.

    A layer beyond MAX_LAYERS is an error here, before anything counts or loops over layers."""
    if not isinstance(key, str):
        return None
    m = _LAYER_HEAD.fullmatch(key.split(".", 1)[0])
    if m is None:
        return None
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > len(str(MAX_LAYERS)) or int(digits) >= MAX_LAYERS:  # never int() of 5000 digits
        raise CellError(f"parameter {shown(key)} is for a layer beyond the limit of {MAX_LAYERS} layers "
                        f"(l0 to l{MAX_LAYERS - 1})")
    return int(digits)


def param_layers(params: Mapping[str, object]) -> int:
    """How many layers the keys of a parameter file cover."""
    layers = 0
    for key in params:
        layer = _layer_of(key)
        if layer is not None:
            layers = max(layers, layer + 1)
    return layers


def _names_a_parameter(key: object, weights: list[str], bidirectional: bool = False) -> bool:
    if not isinstance(key, str) or "." not in key:
        return False
    layer, weight = _layer_of(key), key.split(".", 1)[1]
    reverse = bidirectional and weight.startswith(f"{REVERSE}.")
    if reverse:
        weight = weight[len(REVERSE) + 1:]
    return layer is not None and weight in weights and key == param_key(layer, weight, reverse)


# Of a key of a file of arrays: None where it is expected, else why not, as the end of a sentence that
# starts with the key.
KeyCheck = Callable[[object], str | None]


def param_key_check(cell: Cell, bidirectional: bool = False) -> KeyCheck:
    """The check of a parameter key against the cell: l{layer}.{weight} for one of its weights (or
    l{layer}.reverse.{weight}, where `bidirectional`)."""
    weights = [w.id for w in cell.of_op("weight")]
    forms = "l{layer}.{weight} and l{layer}.reverse.{weight}" if bidirectional else "l{layer}.{weight}"
    why = (f"is not a parameter of cell '{cell.name}': its parameters are {forms} for the "
           f"weights {', '.join(weights) or '(none)'}")
    return lambda key: None if _names_a_parameter(key, weights, bidirectional) else why


def input_key_check(cell: Cell) -> KeyCheck:
    """The check of an inputs key against the cell: 'x' or the id of one of its states."""
    states = [s.id for s in cell.of_op("state")]
    why = (f"is neither the input sequence 'x' nor a state of cell '{cell.name}' "
           f"(states: {', '.join(states) or 'none'})")
    return lambda key: None if key == "x" or key in states else why


def check_names(cell: Cell, params: Mapping[str, object], inputs: Mapping[str, object],
                bidirectional: bool = False) -> None:
    """Refuses a key that names nothing of the cell, before any array is read: an array nobody needs
    is never read from its file, and a misspelt key does not go unnoticed. (load_npz, given the same
    checks, refuses such a key before it reads even the arrays' headers.)"""
    for start, keys, check in (("parameter ", params, param_key_check(cell, bidirectional)),
                               ("inputs: ", inputs, input_key_check(cell))):
        for key in keys:
            why = check(key)
            if why is not None:
                raise CellError(f"{start}{shown(key)} {why}")


def sizes_from_params(cell: Cell, params: Mapping[str, object], layers: int) -> dict[str, int]:
    """The input and hidden sizes the parameters of the first `layers` layers imply, where some weight
    has such a dimension.

    Every weight of every layer votes (for layer > 0 `input` is `hidden`) and the most common size wins,
    so that one mis-shaped parameter is the one reported, not every weight that disagrees with it. The
    shapes are read from the arrays' headers: no array is read for its vote.
    """
    votes: dict[str, Counter[int]] = {"input": Counter(), "hidden": Counter()}
    for layer in range(layers):
        for w in cell.of_op("weight"):
            key = param_key(layer, w.id)
            found = _peek(params, key) if key in params else None
            if not _is_array(found) or not isinstance(w.shape, list) or len(found.shape) != len(w.shape):
                continue
            if 0 in found.shape:
                raise CellError(f"parameter '{key}' has shape {list(found.shape)}: every size must be at "
                                "least 1")
            for dim, n in zip(w.shape, found.shape, strict=True):
                if dim in votes:
                    votes[dim if layer == 0 else "hidden"][int(n)] += 1
    return {dim: counts.most_common(1)[0][0] for dim, counts in votes.items() if counts}


# -- checking a run's arrays ----------------------------------------------------------------------

class _Header(NamedTuple):
    """What an .npy array's header says: enough to check the array before reading it."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype


def _peek(arrays: Mapping[str, object], key: str) -> object:
    """arrays[key]; for an array of an .npz file not read yet, its header, which has its shape and dtype."""
    return arrays.peek(key) if isinstance(arrays, NpzArrays) else arrays[key]


def _is_array(value: object) -> bool:
    return isinstance(value, (np.ndarray, _Header))


def _check_finite(what: str, arr: np.ndarray) -> None:
    """NaN or infinity is refused where it enters: tanh(inf) is 1, so an infinite weight or input could
    pass through a run unnoticed. (min and max find either without a temporary as large as the array.)"""
    if np.isfinite(arr.min()) and np.isfinite(arr.max()):
        return
    first = [int(i) for i in np.unravel_index(int(np.argmin(np.isfinite(arr))), arr.shape)]
    raise CellError(f"{what} holds NaN or infinity (the first at {first}); only finite numbers can be run")


def check_params(cell: Cell, params: Mapping[str, object], layers: int, input: int, hidden: int,
                 bidirectional: bool = False) -> None:
    for key, shape in expected_params(cell, layers, input, hidden, bidirectional).items():
        if key not in params:
            raise CellError(f"parameter '{key}' is missing (expected shape {list(shape)})")
        found = _peek(params, key)
        if not _is_array(found):
            raise CellError(f"parameter '{key}' is a {type(found).__name__}, expected a float32 array "
                            f"of shape {list(shape)}")
        if found.shape != shape:
            raise CellError(f"parameter '{key}' has shape {list(found.shape)}, expected {list(shape)}")
        if not np.issubdtype(found.dtype, np.floating):
            raise CellError(f"parameter '{key}' has dtype {found.dtype}, expected float32")
        _check_finite(f"parameter '{key}'", params[key])  # the array is read only now, its shape known


def _check_x(inputs: Mapping[str, object], input: int | None) -> tuple[int, ...]:
    if "x" not in inputs:
        raise CellError("inputs: key 'x' is missing (expected float32 [T, B, input])")
    x = _peek(inputs, "x")
    if not _is_array(x):
        raise CellError(f"inputs: 'x' is a {type(x).__name__}, expected a float32 array [T, B, input]")
    if len(x.shape) != 3 or (input is not None and x.shape[2] != input) or 0 in x.shape:
        want = f"[T, B, {input}]" if input is not None else "[T, B, input]"
        raise CellError(f"inputs: 'x' has shape {list(x.shape)}, expected {want}")
    if not np.issubdtype(x.dtype, np.floating):
        raise CellError(f"inputs: 'x' has dtype {x.dtype}, expected float32")
    return x.shape


def _initial_state(inputs: Mapping[str, object], state: str, shape: tuple[int, int, int]) -> np.ndarray:
    want = f"[{shape[0]}, {shape[1]}, {shape[2]}]"
    arr = _peek(inputs, state)
    if not _is_array(arr):
        raise CellError(f"inputs: initial state '{state}' is a {type(arr).__name__}, expected a "
                        f"float32 array {want}")
    if arr.shape != shape:
        raise CellError(f"inputs: initial state '{state}' has shape {list(arr.shape)}, "
                        f"expected {want} (layers, batch, hidden)")
    if not np.issubdtype(arr.dtype, np.floating):
        raise CellError(f"inputs: initial state '{state}' has dtype {arr.dtype}, expected float32")
    value = inputs[state]
    _check_finite(f"inputs: initial state '{state}'", value)
    return value


def check_inputs(cell: Cell, inputs: Mapping[str, object], layers: int, input: int | None,
                 hidden: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The input sequence and the initial states (zeros where not given), checked."""
    seq, batch, x_input = _check_x(inputs, input)
    sizes = Sizes(seq=seq, batch=batch, input=x_input, hidden=hidden, layers=layers)
    check_sizes(sizes, cell)
    check_widths(sizes, cell)
    x = inputs["x"]
    _check_finite("inputs: 'x'", x)
    states = {}
    for s in cell.of_op("state"):
        if s.id in inputs:
            states[s.id] = _initial_state(inputs, s.id, (layers, batch, hidden))
        else:
            states[s.id] = np.zeros((layers, batch, hidden), np.float32)
    return x, states


# -- .npz files -----------------------------------------------------------------------------------

@contextmanager
def _reading(where: str, name: str) -> Iterator[None]:
    """Whatever a member of a file from anywhere makes zipfile or numpy raise becomes a CellError."""
    try:
        yield
    except CellError:
        raise
    except Exception as e:
        raise CellError(f"{where}: array '{name}' cannot be read ({type(e).__name__}: {e})") from None


def _open_zip(path: Path, where: str) -> zipfile.ZipFile:
    """The archive at `path`, open: its caller closes `.fp`, which zipfile leaves open when given it."""
    f = open_regular(path, where, "an .npz file")
    try:
        return zipfile.ZipFile(f)
    except Exception:  # whatever zipfile makes of it, it is not an archive of arrays
        f.close()
        raise CellError(f"{where}: not an .npz archive (an .npz holds named arrays, "
                        "as numpy.savez writes them)") from None


def _members(z: zipfile.ZipFile, where: str) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by array name; a name given twice is refused, as the last would win."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in z.infolist():
        name = info.filename.removesuffix(".npy")
        if name in members:
            raise CellError(f"{where}: holds two arrays named {shown(name)}; an .npz names each array once")
        members[name] = info
    return members


def _read_header(f: IO[bytes], info: zipfile.ZipInfo, name: str, where: str) -> _Header:
    """Reads an .npy member's header and checks it against the member's size in the archive's directory,
    so that reading the array decompresses no more than the header says, and a header claiming a huge
    array over a few bytes of data is refused before anything is allocated."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        header = _Header(*np.lib.format.read_array_header_1_0(f))
    elif version == (2, 0):
        header = _Header(*np.lib.format.read_array_header_2_0(f))
    else:
        raise ValueError(f".npy format version {version[0]}.{version[1]} is not read")
    if header.dtype.hasobject:
        raise CellError(f"{where}: array {shown(name)} holds Python objects, which are never loaded")
    data = math.prod(header.shape) * header.dtype.itemsize
    if info.file_size != f.tell() + data:
        raise CellError(f"{where}: array {shown(name)} claims shape {shown(list(header.shape))} of "
                        f"{header.dtype}, {number_str(data)} bytes, but holds {info.file_size - f.tell()}")
    return header


class _Member(NamedTuple):
    """An array of an .npz file not read yet: where it is, and what its header says."""

    info: zipfile.ZipInfo
    header: _Header


class NpzArrays(MutableMapping[str, np.ndarray]):
    """The arrays of an .npz file, each read from the file when first asked for.

    Opening the file lists the arrays and checks their headers; an array's data is read only when it is
    asked for, and the checks of a run look at its header first (`peek`), so that an array nobody needs
    costs nothing, however large it is. The file stays open while the mapping lives, so that what is
    read is the file as it was opened. Arrays can be set and deleted as in a dict.
    """

    def __init__(self, z: zipfile.ZipFile, where: str, members: dict[str, _Member]):
        self._zip = z
        self._where = where
        self._entries: dict[str, object] = dict(members)  # a _Member until read
        weakref.finalize(self, z.fp.close)  # type: ignore[union-attr]

    def peek(self, key: str) -> object:
        """The array if it was read or set, else its header (shape, fortran_order, dtype)."""
        value = self._entries[key]
        return value.header if isinstance(value, _Member) else value

    def __getitem__(self, key: str) -> np.ndarray:
        value = self._entries[key]
        if isinstance(value, _Member):
            value = self._entries[key] = self._read(key, value)
        return value  # type: ignore[return-value]

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        self._entries[key] = value

    def __delitem__(self, key: str) -> None:
        del self._entries[key]

    def __contains__(self, key: object) -> bool:
        return key in self._entries  # without reading it, as Mapping's own would

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _read(self, key: str, member: _Member) -> np.ndarray:
        with _reading(self._where, key), self._zip.open(member.info) as f:
            # Checked again: the file may have been rewritten in place since it was opened.
            if _read_header(f, member.info, key, self._where) != member.header:
                raise CellError(f"{self._where}: array '{key}' changed after the file was opened")
            f.seek(0)
            return np.lib.format.read_array(f, allow_pickle=False)


def load_npz(path: str | os.PathLike[str], what: str, keys: KeyCheck | None = None) -> NpzArrays:
    """The arrays of an .npz file, read when first used (see NpzArrays); never unpickles anything.
    `what` names the file in errors.

    `keys` (param_key_check(cell), input_key_check(cell)) refuses an array the caller does not expect,
    naming the first and how many arrays the file holds, from the archive's directory alone: before any
    array's header is read, so that a file of a hundred thousand arrays is refused at once rather than
    after a hundred thousand headers have been read and checked.
    """
    path = as_path(path, f"{what} ")
    where = f"{what} {path}"
    z = _open_zip(path, where)
    try:
        found = _members(z, where)
        for name in found if keys is not None else ():
            try:
                why = keys(name)
            except CellError as e:  # a key of a layer beyond the limit
                raise CellError(f"{where}: {e}") from None
            if why is not None:
                held = f"{len(found)} array{'s' * (len(found) != 1)}"
                raise CellError(f"{where}: holds {held}, and {shown(name)} {why}")
        members = {}
        for name, info in found.items():
            with _reading(where, name), z.open(info) as f:
                members[name] = _Member(info, _read_header(f, info, name, where))
    except BaseException:
        z.fp.close()  # type: ignore[union-attr]
        raise
    return NpzArrays(z, where, members)


def save_npz(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    try:
        np.savez(buf, **arrays)
    except (TypeError, ValueError) as e:  # a key that is not a str, a value numpy cannot store
        raise CellError(f"{path}: these arrays cannot be written as an .npz ({e})") from None
    atomic_write(path, buf.getvalue())
