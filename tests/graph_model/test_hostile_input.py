"""Hostile input to the Python API: whatever a file or a caller hands over, the answer is a CellError whose
message names the culprit, quickly and without running out of memory; never another exception, a hang,
or a silent acceptance."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import stat
import struct
import threading
import tracemalloc
import warnings
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from cellfuse.graph_model import (
    Cell,
    CellError,
    CellFileError,
    Node,
    NpzArrays,
    Sizes,
    analyze,
    atomic_write,
    cell_from_json,
    cell_from_text,
    cell_to_text,
    check_params,
    check_sizes,
    expected_params,
    init_params,
    input_key_check,
    load_cell,
    load_npz,
    load_template,
    param_key_check,
    param_layers,
    resolve_run,
    run_reference,
    save_cell,
    save_npz,
)
from cellfuse.graph_model.limits import (
    MAX_CELL_FILE_BYTES,
    MAX_EDITOR_DATA_DEPTH,
    MAX_ELEMENTS,
    MAX_LAYERS,
    MAX_LENGTH,
    MAX_NODES,
    MAX_WIDTH,
)
from cellfuse.graph_model.templates import template_text


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Turns a hang into a test failure rather than a test run that never ends."""
    def timeout(signum, frame):
        raise AssertionError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def elman_json() -> dict:
    return json.loads(template_text("elman"))


def elman_run(hidden: int = 4, input: int = 3, seq: int = 2, batch: int = 2):
    cell = load_template("elman")
    params = init_params(cell, 1, input, hidden, seed=1)
    x = np.linspace(-1.0, 1.0, seq * batch * input, dtype=np.float32).reshape(seq, batch, input)
    return cell, params, {"x": x}


# -- 1. a key given twice ----------------------------------------------------------------------------

def test_a_top_level_key_given_twice_is_refused():
    text = template_text("elman").replace('"output": "h_new"', '"output": "h", "output": "h_new"')
    with pytest.raises(CellError) as e:
        cell_from_text(text, "e.cell.json")
    msg = str(e.value)
    assert msg.startswith("e.cell.json: ") and "'output'" in msg and "twice" in msg


@pytest.mark.parametrize("old, new, words", [
    ('{"id": "W", "op": "weight", "shape": ["input", "hidden"]}',
     '{"id": "W", "op": "weight", "shape": ["input", "hidden"], "shape": ["hidden", "hidden"]}',
     ["node 'W'", "'shape'"]),
    ('"sizes": {"input": 512, "hidden": 512}', '"sizes": {"input": 512, "hidden": 512, "hidden": 8}',
     ["'hidden'"]),
    ('"updates": {"h": "h_new"}', '"updates": {"h": "h_new", "h": "a"}', ["'h'"]),
    ('"layout": {', '"layout": {"x": [1, 2], "x": [3, 4], ', ["'x'"]),
    ('"name": "Elman RNN"', '"name": "Elman RNN", "x-note": {"a": 1, "a": 2}', ["'a'"]),
])
def test_a_key_given_twice_in_any_object_is_refused(old, new, words):
    text = template_text("elman")
    assert old in text
    with pytest.raises(CellError) as e:
        cell_from_text(text.replace(old, new, 1))
    for w in words:
        assert w in str(e.value)
    assert "twice" in str(e.value)


def _zip(path: Path, members: Iterable[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a name given twice, and writes it all the same
        with zipfile.ZipFile(path, "w", compression) as z:
            for name, data in members:
                z.writestr(name, data)
    return path


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.mark.parametrize("names", [["x.npy", "x.npy"], ["x.npy", "x"]])
def test_an_npz_with_two_arrays_of_one_name_is_refused(tmp_path, names):
    path = _zip(tmp_path / "two.npz", [(n, _npy(np.full((1, 1, 1), float(i), np.float32)))
                                       for i, n in enumerate(names)])
    with pytest.raises(CellError) as e:
        load_npz(path, "inputs")
    msg = str(e.value)
    assert msg.startswith(f"inputs {path}: ") and "two arrays named 'x'" in msg


# -- 2. NaN and infinity in the data ----------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_non_finite_parameter_is_refused_naming_its_key(bad):
    cell, params, inputs = elman_run()
    params["l0.U"] = params["l0.U"].copy()
    params["l0.U"][1, 2] = bad
    with pytest.raises(CellError) as e:
        run_reference(cell, params, inputs)
    msg = str(e.value)
    assert "parameter 'l0.U'" in msg and "NaN or infinity" in msg and "[1, 2]" in msg


def test_an_infinite_weight_that_tanh_would_hide_is_refused():
    # tanh(inf) is 1: without the check this run gives finite numbers from an infinite weight.
    cell = load_template("elman")
    params = {"l0.W": np.array([[np.inf]], np.float32), "l0.U": np.zeros((1, 1), np.float32),
              "l0.b": np.zeros(1, np.float32)}
    with pytest.raises(CellError, match=r"parameter 'l0.W' holds NaN or infinity"):
        run_reference(cell, params, {"x": np.ones((2, 1, 1), np.float32)})


@pytest.mark.parametrize("key", ["x", "h"])
@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_inputs_are_refused_naming_the_key(key, bad):
    cell, params, inputs = elman_run()
    arr = inputs["x"].copy() if key == "x" else np.zeros((1, 2, 4), np.float32)
    arr.flat[-1] = bad
    inputs[key] = arr
    with pytest.raises(CellError) as e:
        run_reference(cell, params, inputs)
    assert f"'{key}' holds NaN or infinity" in str(e.value)


def test_an_infinite_parameter_in_a_file_is_refused(tmp_path):
    cell, params, inputs = elman_run()
    params["l0.b"] = np.array([0, 0, np.inf, 0], np.float32)
    save_npz(tmp_path / "p.npz", params)
    with pytest.raises(CellError, match="'l0.b' holds NaN or infinity"):
        run_reference(cell, load_npz(tmp_path / "p.npz", "parameters"), inputs)


# -- 3. sizes below 1 ---------------------------------------------------------------------------------

def test_parameters_of_hidden_size_zero_are_refused_naming_a_key():
    cell, _, inputs = elman_run()
    params = {"l0.W": np.zeros((3, 0), np.float32), "l0.U": np.zeros((0, 0), np.float32),
              "l0.b": np.zeros(0, np.float32)}
    with pytest.raises(CellError) as e:
        run_reference(cell, params, inputs)
    assert "'l0.W'" in str(e.value) and "[3, 0]" in str(e.value) and "at least 1" in str(e.value)


@pytest.mark.parametrize("layers, input, hidden, name", [(0, 3, 4, "layers"), (1, 0, 4, "input size"),
                                                         (1, 3, 0, "hidden size"), (-2, 3, 4, "layers")])
def test_init_params_refuses_sizes_below_one(layers, input, hidden, name):
    with pytest.raises(CellError) as e:
        init_params(load_template("lstm"), layers, input, hidden)
    msg = str(e.value)
    assert msg.startswith("cannot make parameters: ") and name in msg and "at least 1" in msg


@pytest.mark.parametrize("shape", [(0, 2, 3), (2, 0, 3), (2, 2, 0)])
def test_an_empty_input_sequence_is_refused(shape):
    cell, params, _ = elman_run()
    with pytest.raises(CellError, match=r"'x' has shape"):
        run_reference(cell, params, {"x": np.zeros(shape, np.float32)})


# -- 4. the Python API handed the wrong types --------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    (lambda d: d.update({1: 2}), ["unknown top-level key", "1"]),
    (lambda d: d["nodes"][0].update({2: "x"}), ["node 'x'", "unknown key"]),
    (lambda d: d["updates"].update({3: "h_new"}), ["'updates'"]),
    (lambda d: d.update(layout={4: [0, 0]}), ["'layout'"]),
    (lambda d: d.update({"x-note": {"a": {5: 1}}}), ["'x-note'", "not a string"]),
])
def test_cell_from_json_with_keys_that_are_not_strings(change, words):
    data = elman_json()
    change(data)
    with pytest.raises(CellError) as e:
        cell_from_json(data)
    for w in words:
        assert w in str(e.value)


def test_cell_from_json_with_non_string_keys_only():
    with pytest.raises(CellError, match="unknown format"):
        cell_from_json({1: 2})


@pytest.mark.parametrize("path", ["a\0b.cell.json", Path("dir\0") / "c.cell.json"])
def test_a_path_with_a_nul_character(path):
    with pytest.raises(CellError, match="NUL"):
        load_cell(path)
    with pytest.raises(CellError, match="NUL"):
        save_cell(load_template("elman"), path)
    with pytest.raises(CellError, match=r"parameters .*NUL"):
        load_npz(path, "parameters")


@pytest.mark.parametrize("path", [None, 3, b"e.cell.json", ["e.cell.json"]])
def test_a_path_of_the_wrong_type(path):
    with pytest.raises(CellError, match="a file name must be a string or a path"):
        load_cell(path)
    with pytest.raises(CellError, match="a file name must be a string or a path"):
        save_cell(load_template("elman"), path)


def _break(change) -> Cell:
    cell = load_template("elman")
    change(cell)
    return cell


@pytest.mark.parametrize("change, words", [
    (lambda c: setattr(c.nodes[0], "id", 5), ["node #1", "'id'", "5"]),
    (lambda c: setattr(c.nodes[0], "id", None), ["node #1", "'id'"]),
    (lambda c: setattr(c.node("xw"), "args", None), ["node 'xw'", "'args'", "None"]),
    (lambda c: setattr(c.node("xw"), "args", "x W"), ["node 'xw'", "'args'"]),
    (lambda c: setattr(c.node("xw"), "args", ["x", 7]), ["node 'xw'", "'args'"]),
    (lambda c: setattr(c.node("xw"), "op", None), ["node 'xw'", "'op'"]),
    (lambda c: c.nodes.append("h_new"), ["node #11", "str"]),
    (lambda c: setattr(c, "nodes", None), ["'nodes'"]),
    (lambda c: setattr(c, "updates", None), ["'updates'"]),
    (lambda c: setattr(c, "updates", [("h", "h_new")]), ["'updates'"]),
    (lambda c: setattr(c, "updates", {"h": 1}), ["'updates'"]),
    (lambda c: setattr(c, "updates", {2: "h_new"}), ["'updates'"]),
    (lambda c: setattr(c, "output", ["h_new"]), ["'output'"]),
    (lambda c: setattr(c, "output", 3), ["'output'"]),
    (lambda c: setattr(c, "name", 10**5000), ["'name'", "too large to show"]),  # no str() for it
    (lambda c: setattr(c, "sizes", None), ["'sizes'"]),
])
def test_analyze_of_a_cell_with_fields_of_the_wrong_type(change, words):
    cell = _break(change)
    with pytest.raises(CellError) as e:
        analyze(cell)
    for w in words:
        assert w in str(e.value)
    with pytest.raises(CellError):
        run_reference(cell, *elman_run()[1:])


def test_analyze_of_something_that_is_no_cell():
    for thing in (None, {"nodes": []}, "lstm"):
        with pytest.raises(CellError, match="expected a Cell"):
            analyze(thing)


@pytest.mark.parametrize("layers, words", [(-1, "at least 1, got -1"), (0, "at least 1, got 0"),
                                           (True, "whole number, got True"), (1.0, "whole number, got 1.0"),
                                           ("1", "whole number, got '1'"),
                                           (10**11, "100000000000, above the limit of 1024")])
def test_run_reference_with_a_bad_number_of_layers(layers, words):
    cell, params, inputs = elman_run()
    with within(10), pytest.raises(CellError) as e:
        run_reference(cell, params, inputs, layers)
    assert str(e.value).startswith("layers ") and words in str(e.value)


def test_run_reference_takes_numpy_integers_as_layers():
    cell, params, inputs = elman_run()
    assert run_reference(cell, params, inputs, np.int64(1)).final["h"].shape == (1, 2, 4)


def test_save_cell_into_a_directory(tmp_path):
    with pytest.raises(CellError) as e:
        save_cell(load_template("elman"), tmp_path)
    assert str(e.value) == f"{tmp_path}: is a directory; name the file to write"
    assert isinstance(e.value, OSError)  # callers that catch trouble with files as OSError see it too
    assert list(tmp_path.iterdir()) == []


def test_save_npz_into_a_directory(tmp_path):
    with pytest.raises(CellError, match="is a directory"):
        save_npz(tmp_path, {"x": np.zeros(1, np.float32)})
    assert list(tmp_path.iterdir()) == []


def _fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    return fifo


def _catch(call, *args) -> BaseException | None:
    try:
        call(*args)
    except BaseException as e:  # the test looks at it
        return e
    return None


@pytest.mark.parametrize("load", [load_cell, lambda p: load_npz(p, "parameters")])
def test_loading_a_fifo_is_refused_without_blocking(tmp_path, load):
    fifo = _fifo(tmp_path)
    outcome: list[BaseException | None] = []
    thread = threading.Thread(target=lambda: outcome.append(_catch(load, fifo)), daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # blocked in open(): a writer frees it, then the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail("loading a FIFO blocked")
    error = outcome[0]
    assert isinstance(error, CellError) and "not a regular file" in str(error) and str(fifo) in str(error)


def test_saving_onto_a_fifo_leaves_it_as_it_is(tmp_path):
    fifo = _fifo(tmp_path)
    with within(10), pytest.raises(CellError, match="not a regular file"):
        save_cell(load_template("elman"), fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_loading_a_device_is_refused_without_reading_it():
    with within(10), pytest.raises(CellError, match="/dev/zero: not a regular file"):
        load_cell("/dev/zero")
    with within(10), pytest.raises(CellError, match="not a regular file"):
        load_npz("/dev/zero", "inputs")


def test_atomic_write_of_data_that_is_not_bytes(tmp_path):
    with pytest.raises(CellError, match="must be bytes"):
        atomic_write(tmp_path / "a.txt", "text")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_failures_name_the_target_and_are_cell_errors(tmp_path):
    target = tmp_path / "missing" / "c.bin"
    with pytest.raises(CellFileError) as e:
        atomic_write(target, b"x")
    assert str(e.value).startswith(f"{target}: cannot write: ") and ".tmp" not in str(e.value)


@pytest.mark.parametrize("extra", [{"x-set": {1, 2}}, {"x-f": float("nan")}, {"x-big": 10**5000}],
                         ids=["set", "nan", "huge int"])
def test_cell_to_text_of_editor_data_no_file_can_hold(extra):
    cell = load_template("elman")
    cell.extra = extra
    with pytest.raises(CellError, match="cannot be written as a cell file"):
        cell_to_text(cell)


def test_a_save_never_writes_what_loading_would_refuse(tmp_path):
    cell = load_template("elman")
    cell.sizes = {"input": 3, "hidden": 10**7}
    with pytest.raises(CellError, match="'sizes': 'hidden' is 10000000, above the limit of 1048576"):
        save_cell(cell, tmp_path / "c.cell.json")
    cell = load_template("elman")
    cell.nodes.append(Node("k", "const", value=math.nan))
    with pytest.raises(CellError, match="node 'k': 'value' must be a finite number, got nan"):
        save_cell(cell, tmp_path / "c.cell.json")
    assert list(tmp_path.iterdir()) == []


def test_save_npz_of_keys_that_are_not_strings(tmp_path):
    with pytest.raises(CellError, match="cannot be written as an .npz"):
        save_npz(tmp_path / "a.npz", {1: np.zeros(1)})
    assert list(tmp_path.iterdir()) == []


def test_parameters_or_inputs_that_are_no_mapping():
    cell, params, inputs = elman_run()
    with pytest.raises(CellError, match="the parameters must be a mapping"):
        run_reference(cell, list(params.values()), inputs)
    with pytest.raises(CellError, match="the inputs must be a mapping"):
        run_reference(cell, params, inputs["x"])


def test_init_params_refuses_a_bad_seed():
    for seed in (-1, 1.5, True, "0"):
        with pytest.raises(CellError, match="a seed must be a whole number, 0 or more"):
            init_params(load_template("elman"), 1, 3, 4, seed)


def test_unknown_keys_are_refused_by_name():
    cell, params, inputs = elman_run()
    with pytest.raises(CellError, match=r"parameter 'l0.V' is not a parameter of cell 'Elman RNN'.*W, U, b"):
        run_reference(cell, {**params, "l0.V": np.zeros(1, np.float32)}, inputs)
    for key in ("W", "l01.W", "l0", 7):
        with pytest.raises(CellError, match="is not a parameter of cell"):
            run_reference(cell, {**params, key: np.zeros(1, np.float32)}, inputs)
    with pytest.raises(CellError, match=r"inputs: 'y' is neither the input sequence 'x' nor a state.*h"):
        run_reference(cell, params, {**inputs, "y": np.zeros(1, np.float32)})


# -- 5. sizes beyond the limits: no hang, no overflow, no memory error -------------------------------

@pytest.mark.parametrize("key", ["l99999999999.z", "l99999999999.W", "l1024.W", "l" + "9" * 5000 + ".W"])
def test_a_parameter_of_a_layer_beyond_the_limit_is_refused_at_once(key):
    cell, params, inputs = elman_run()
    with within(10), pytest.raises(CellError) as e:
        run_reference(cell, {**params, key: np.zeros(1, np.float32)}, inputs)
    msg = str(e.value)
    assert "beyond the limit of 1024 layers" in msg and key[:20] in msg and len(msg) < 300
    with within(10), pytest.raises(CellError, match="beyond the limit"):
        param_layers({key: 0})


def test_the_last_layer_within_the_limit_is_a_layer():
    assert param_layers({f"l{MAX_LAYERS - 1}.W": 0}) == MAX_LAYERS


def test_a_key_with_digits_that_are_not_ascii_names_no_layer():
    assert param_layers({"l\u00b2.W": 0, "l\u0663.W": 0}) == 0
    cell, params, inputs = elman_run()
    with pytest.raises(CellError, match="is not a parameter"):
        run_reference(cell, {**params, "l\u00b2.W": np.zeros(1, np.float32)}, inputs)


@pytest.mark.parametrize("size, words", [
    (10**400, "a number of about 401 digits, above the limit of 1048576"),
    (100_000_000_000, "100000000000, above the limit of 1048576"),
    (MAX_WIDTH + 1, f"{MAX_WIDTH + 1}, above the limit"),
    (2.0, "whole number, got 2.0"),
    (False, "whole number, got False"),
    (None, "whole number, got None"),
])
def test_init_params_refuses_sizes_beyond_the_limits(size, words):
    with within(10), pytest.raises(CellError) as e:
        init_params(load_template("elman"), 1, 3, size)
    assert str(e.value).startswith("cannot make parameters: the hidden size") and words in str(e.value)


def test_expected_params_does_not_loop_over_absurd_layers():
    with within(10), pytest.raises(CellError, match="layers is 100000000000, above the limit of 1024"):
        expected_params(load_template("lstm"), 10**11, 3, 4)


@pytest.mark.parametrize("field, limit, name", [("layers", MAX_LAYERS, "layers"),
                                                ("seq", MAX_LENGTH, "the sequence length"),
                                                ("batch", MAX_LENGTH, "the batch size"),
                                                ("input", MAX_WIDTH, "the input size"),
                                                ("hidden", MAX_WIDTH, "the hidden size")])
def test_check_sizes_bounds_each_size(field, limit, name):
    ones = dict(seq=1, batch=1, input=1, hidden=1, layers=1)
    check_sizes(Sizes(**{**ones, field: limit}))
    for bad, words in ((limit + 1, f"is {limit + 1}, above the limit of {limit}"), (0, "at least 1, got 0"),
                       (10**400, "above the limit"), (1.5, "whole number"), (True, "whole number")):
        with pytest.raises(CellError) as e:
            check_sizes(Sizes(**{**ones, field: bad}))
        assert str(e.value).startswith(name) and words in str(e.value)


def test_check_sizes_bounds_the_activations():
    check_sizes(Sizes(seq=2**10, batch=2**10, input=2**13, hidden=2**13, layers=1))  # 2**34 in all
    with pytest.raises(CellError) as e:
        check_sizes(Sizes(seq=2**10, batch=2**10, input=2**13, hidden=2**13, layers=2))
    assert "activations" in str(e.value) and str(MAX_ELEMENTS) in str(e.value)


def test_check_sizes_bounds_the_weights_of_the_cell():
    lstm = load_template("lstm")  # 8 matrices of 2**32 numbers at these sizes
    check_sizes(Sizes(seq=1, batch=1, input=2**16, hidden=2**16, layers=1))
    with pytest.raises(CellError) as e:
        check_sizes(Sizes(seq=1, batch=1, input=2**16, hidden=2**16, layers=1), lstm)
    msg = str(e.value)
    assert "weights" in msg and "'LSTM'" in msg and str(MAX_ELEMENTS) in msg


def test_check_sizes_of_what_is_not_sizes():
    with pytest.raises(CellError, match="expected Sizes, got a dict"):
        check_sizes({"seq": 1})


def test_a_cell_file_with_a_size_beyond_the_limit():
    data = elman_json()
    data["sizes"] = {"input": 3, "hidden": 10**400}
    with pytest.raises(CellError) as e:
        cell_from_text(json.dumps(data), "e.cell.json")
    assert "'sizes': 'hidden' is a number of about 401 digits, above the limit of 1048576" in str(e.value)


def test_a_cell_with_too_many_nodes_is_one_quick_error():
    n = MAX_NODES + 1
    nodes = [Node("x", "input"), Node("h", "state")] + [Node(f"a{i}", "tanh", ["h"]) for i in range(n - 2)]
    cell = Cell("big", nodes=nodes, updates={"h": "a0"}, output="a0")
    with within(10):
        info = analyze(cell)
    assert [p.message for p in info.errors] == [f"the cell has {n} nodes, more than the limit of {MAX_NODES}"]


# -- 6. .npz members that are large, unused or lying ---------------------------------------------------

def _zeros_member(z: zipfile.ZipFile, name: str, shape: tuple[int, ...]) -> None:
    """A float32 member of zeros, written in pieces: it compresses about a thousand to one."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with z.open(f"{name}.npy", "w", force_zip64=True) as f:
        f.write(header.getvalue())
        left = math.prod(shape) * 4
        piece = bytes(2**22)
        while left:
            f.write(piece[:min(left, len(piece))])
            left -= min(left, len(piece))


BIG = (2**26,)  # 256 MiB of float32


def _npz_with(tmp_path: Path, arrays: dict[str, np.ndarray], bombs: dict[str, tuple[int, ...]]) -> Path:
    path = tmp_path / "p.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, arr in arrays.items():
            z.writestr(f"{name}.npy", _npy(arr))
        for name, shape in bombs.items():
            _zeros_member(z, name, shape)
    assert path.stat().st_size < 2**20
    return path


@contextlib.contextmanager
def reads_seen(monkeypatch) -> Iterator[list[str]]:
    """The names of the members whose data is read, and the peak of memory traced meanwhile."""
    seen: list[str] = []
    real = np.lib.format.read_array

    def spy(f, *args, **kwargs):
        seen.append(f.name.removesuffix(".npy"))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(np.lib.format, "read_array", spy)
    tracemalloc.start()
    try:
        yield seen
        assert tracemalloc.get_traced_memory()[1] < 2**26, "more than 64 MiB was allocated"
    finally:
        tracemalloc.stop()


def test_an_unknown_member_is_refused_by_name_without_being_read(tmp_path, monkeypatch):
    cell, params, inputs = elman_run()
    path = _npz_with(tmp_path, params, {"padding": BIG})
    with reads_seen(monkeypatch) as seen, pytest.raises(CellError, match="parameter 'padding' is not a"):
        run_reference(cell, load_npz(path, "parameters"), inputs)
    assert seen == []


@pytest.mark.slow  # writes a large member and traces the memory a read takes
def test_a_known_member_of_a_layer_not_run_is_not_read(tmp_path, monkeypatch):
    cell, params, inputs = elman_run()
    path = _npz_with(tmp_path, params, {"l1.U": BIG})
    with reads_seen(monkeypatch) as seen:
        out = run_reference(cell, load_npz(path, "parameters"), inputs, layers=1)
    assert out.y.shape == (2, 2, 4) and sorted(seen) == ["l0.U", "l0.W", "l0.b"]


@pytest.mark.slow  # writes a large member and traces the memory a read takes
def test_a_needed_member_of_the_wrong_shape_is_refused_before_it_is_read(tmp_path, monkeypatch):
    cell, params, inputs = elman_run()
    del params["l0.b"]
    path = _npz_with(tmp_path, params, {"l0.b": BIG})
    with reads_seen(monkeypatch) as seen, pytest.raises(CellError) as e:
        run_reference(cell, load_npz(path, "parameters"), inputs)
    assert f"'l0.b' has shape [{BIG[0]}], expected [4]" in str(e.value) and "l0.b" not in seen


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_header_claiming_more_than_the_member_holds_is_refused_at_once(tmp_path, compression):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    path = _zip(tmp_path / "liar.npz", [("x.npy", header.getvalue() + bytes(16))], compression)
    with within(10), pytest.raises(CellError) as e:
        load_npz(path, "inputs")
    msg = str(e.value)
    assert msg.startswith(f"inputs {path}: array 'x' claims shape [{2**40}]") and "but holds 16" in msg


def test_npz_arrays_are_a_mapping_that_reads_when_asked(tmp_path, monkeypatch):
    save_npz(tmp_path / "a.npz", {"a": np.arange(3, dtype=np.float32), "b": np.ones((2, 2))})
    arrays = load_npz(tmp_path / "a.npz", "inputs")
    assert isinstance(arrays, NpzArrays)
    with reads_seen(monkeypatch) as seen:
        assert "a" in arrays and "c" not in arrays and len(arrays) == 2 and list(arrays) == ["a", "b"]
        assert arrays.peek("b").shape == (2, 2) and seen == []
        np.testing.assert_array_equal(arrays["a"], [0, 1, 2])
        np.testing.assert_array_equal(arrays["a"], [0, 1, 2])
        assert seen == ["a"]
    arrays["c"] = np.zeros(1)
    del arrays["b"]
    assert sorted(arrays) == ["a", "c"]


def test_an_npz_is_read_as_it_was_when_opened(tmp_path):
    path = tmp_path / "a.npz"
    save_npz(path, {"x": np.zeros((2, 2, 2), np.float32)})
    arrays = load_npz(path, "inputs")
    save_npz(path, {"y": np.ones(1, np.float32)})  # a new file in its place
    assert arrays["x"].shape == (2, 2, 2)


def test_an_npz_rewritten_in_place_after_it_was_opened(tmp_path):
    path = tmp_path / "a.npz"
    # Stored, so the header is in the file as text; x large enough that reading y's header moved the
    # file's buffer past x's, and x's header is read from the file again.
    np.savez(path, x=np.zeros((2, 2, 4096), np.float32), y=np.zeros(1, np.float32))
    arrays = load_npz(path, "inputs")
    data = path.read_bytes()
    with open(path, "r+b") as f:
        f.write(data.replace(b"(2, 2, 4096)", b"(2, 4096, 2)", 1))
    with pytest.raises(CellError, match="'x' changed after the file was opened"):
        arrays["x"]


@pytest.mark.slow  # thousands of arrays: a quadratic reader would take minutes, a linear one seconds
def test_many_arrays_are_read_in_linear_time(tmp_path):
    cell = load_template("lstm")
    params = init_params(cell, MAX_LAYERS, 1, 1)  # 12 arrays a layer, the most a run takes
    save_npz(tmp_path / "p.npz", params)
    x = np.ones((1, 1, 1), np.float32)
    with within(60):
        out = run_reference(cell, load_npz(tmp_path / "p.npz", "parameters"), {"x": x})
    assert out.final["c"].shape == (MAX_LAYERS, 1, 1)


def _stored_zip(path: Path, names: list[str], data: bytes) -> Path:
    """A zip archive of `data` stored under each name, written record by record: zipfile takes seconds
    for a hundred thousand members, this a fraction of one. It ends in zip64 records, as an archive of
    more than 65535 members must."""
    crc, size, offset = zlib.crc32(data), len(data), 0
    local, central = [], []
    for name in names:
        n = name.encode()
        # zipfile's own layouts: a local file header, a central directory entry (no compression, 1980-01-01)
        head = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0x21, crc, size, size, len(n), 0)
        central.append(struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0x21, crc, size,
                                   size, len(n), 0, 0, 0, 0, 0, offset) + n)
        head += n
        local.append(head + data)
        offset += len(head) + size
    directory = b"".join(central)
    end64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, len(names), len(names), len(directory),
                        offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, offset + len(directory), 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, len(directory), offset, 0)
    path.write_bytes(b"".join(local) + directory + end64 + locator + end)
    return path


def test_the_stored_zip_of_these_tests_is_an_npz(tmp_path):
    path = _stored_zip(tmp_path / "a.npz", ["a.npy", "b.npy"], _npy(np.arange(3, dtype=np.float32)))
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None and z.namelist() == ["a.npy", "b.npy"]
    arrays = load_npz(path, "inputs")
    np.testing.assert_array_equal(arrays["b"], [0, 1, 2])


@contextlib.contextmanager
def headers_seen(monkeypatch) -> Iterator[list[str]]:
    """The names of the members whose .npy header is read."""
    seen: list[str] = []
    real = np.lib.format.read_magic

    def spy(f):
        seen.append(f.name.removesuffix(".npy"))
        return real(f)

    monkeypatch.setattr(np.lib.format, "read_magic", spy)
    yield seen


MANY = 100_000


@pytest.fixture(scope="module")
def many_arrays(tmp_path_factory) -> Path:
    """An .npz of a hundred thousand tiny arrays, none of them a parameter or an input of any cell."""
    return _stored_zip(tmp_path_factory.mktemp("many") / "many.npz", [f"junk{i}.npy" for i in range(MANY)],
                       _npy(np.zeros(1, np.float32)))


@pytest.mark.parametrize("what, check, words", [
    ("parameters", param_key_check,
     "is not a parameter of cell 'LSTM': its parameters are l{layer}.{weight} for the weights W_i, U_i, b_i, "
     "W_f, U_f, b_f, W_o, U_o, b_o, W_g, U_g, b_g"),
    ("inputs", input_key_check,
     "is neither the input sequence 'x' nor a state of cell 'LSTM' (states: h, c)"),
], ids=["parameters", "inputs"])
def test_a_hundred_thousand_unexpected_arrays_are_refused_before_any_header_is_read(many_arrays, monkeypatch,
                                                                                    what, check, words):
    path = many_arrays
    with headers_seen(monkeypatch) as seen, pytest.raises(CellError) as e:
        load_npz(path, what, check(load_template("lstm")))
    assert str(e.value) == f"{what} {path}: holds {MANY} arrays, and 'junk0' {words}"
    assert seen == []


def test_the_first_unexpected_array_is_named_wherever_it_is(tmp_path, monkeypatch):
    cell = load_template("elman")
    params = init_params(cell, 2, 3, 4)
    names = [f"{key}.npy" for key in params] + ["l0.V.npy"]
    path = _stored_zip(tmp_path / "p.npz", names, _npy(np.zeros(1, np.float32)))
    with headers_seen(monkeypatch) as seen, pytest.raises(CellError) as e:
        load_npz(path, "parameters", param_key_check(cell))
    assert str(e.value) == (f"parameters {path}: holds 7 arrays, and 'l0.V' is not a parameter of cell "
                            "'Elman RNN': its parameters are l{layer}.{weight} for the weights W, U, b")
    assert seen == []
    with pytest.raises(CellError) as e:
        load_npz(_stored_zip(tmp_path / "p.npz", ["l5000.W.npy"], b""), "parameters", param_key_check(cell))
    assert str(e.value).startswith(f"parameters {path}: parameter 'l5000.W' is for a layer beyond the limit")


def test_expected_arrays_load_as_without_a_check(tmp_path):
    cell = load_template("lstm")
    save_npz(tmp_path / "p.npz", init_params(cell, 2, 3, 4))
    save_npz(tmp_path / "x.npz", {"x": np.ones((2, 1, 3), np.float32), "c": np.zeros((2, 1, 4), np.float32)})
    params = load_npz(tmp_path / "p.npz", "parameters", param_key_check(cell))
    inputs = load_npz(tmp_path / "x.npz", "inputs", input_key_check(cell))
    assert sorted(params) == sorted(init_params(cell, 2, 3, 4)) and sorted(inputs) == ["c", "x"]
    assert run_reference(cell, params, inputs).y.shape == (2, 1, 4)


# -- 7. more of the same kinds ---------------------------------------------------------------------------

def test_a_cell_file_beyond_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.cell.json"
    with open(path, "wb") as f:
        f.truncate(MAX_CELL_FILE_BYTES + 1)  # sparse: no disk is filled for it
    with pytest.raises(CellError, match=r"big.cell.json: larger than 16 MiB"):
        load_cell(path)


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_editor_data_nested_too_deeply_is_refused():
    data = elman_json()
    data["x-deep"] = _nested(MAX_EDITOR_DATA_DEPTH)
    assert cell_from_json(data).copy().extra["x-deep"] == data["x-deep"]
    data["x-deep"] = _nested(MAX_EDITOR_DATA_DEPTH + 1)
    with pytest.raises(CellError, match=f"'x-deep' is nested more than {MAX_EDITOR_DATA_DEPTH} levels"):
        cell_from_text(json.dumps(data))
    data["nodes"][0]["x-deep"] = data.pop("x-deep")
    with pytest.raises(CellError, match="node 'x': 'x-deep' is nested more than"):
        cell_from_json(data)


def test_editor_data_that_holds_itself_is_refused():
    loop: list = []
    loop.append(loop)
    data = elman_json()
    data["x-loop"] = loop
    with within(10), pytest.raises(CellError, match="'x-loop' is nested more than"):
        cell_from_json(data)


@pytest.mark.parametrize("value, words", [("NaN", "nan"), ("Infinity", "inf"), ("[1, -Infinity]", "-inf")])
def test_editor_data_with_numbers_json_has_not(value, words):
    text = template_text("elman").replace('"name": "Elman RNN"', f'"name": "Elman RNN", "x-v": {value}')
    with pytest.raises(CellError, match=f"'x-v' holds {words}, which is not a JSON number"):
        cell_from_text(text)


def test_editor_data_of_python_objects_is_refused():
    data = elman_json()
    data["nodes"][2]["x-obj"] = {"when": object()}
    with pytest.raises(CellError, match="node 'W': 'x-obj' holds a object"):
        cell_from_json(data)


@pytest.mark.parametrize("field, value", [("format", "z" * 10**6), ("name", 10**5000), ("output", 10**5000),
                                          ("description", [[]] * 10**5)],
                         ids=["long format", "huge name", "huge output", "long description"])
def test_huge_values_make_short_messages(field, value):
    with pytest.raises(CellError) as e:
        cell_from_json({**elman_json(), field: value})
    assert f"'{field}'" in str(e.value) or "format" in str(e.value)
    assert len(str(e.value)) < 200


def test_a_very_long_id_is_an_ordinary_problem():
    cell = load_template("elman")
    cell.rename("a", "a" * 10**6)
    assert analyze(cell).ok
    cell.node("W").id = "1" + "w" * 10**6
    assert not analyze(cell).ok


def test_check_params_of_a_cell_with_a_broken_weight_shape():
    cell = load_template("elman")
    cell.node("W").shape = ["input", "batch"]
    with pytest.raises(CellError, match=r"node 'W': a weight's shape must be one or two of"):
        check_params(cell, {}, 1, 3, 4)
    with pytest.raises(CellError, match=r"cannot make parameters: node 'W'"):
        init_params(cell, 1, 3, 4)


def test_the_limits_of_a_run_are_checked_before_anything_is_made():
    # 2**24 steps at hidden 2**11 are 2**35 activations: refused before any zeros are made for the
    # initial states (x takes no memory: one number, repeated).
    cell = load_template("elman")
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (2**24, 1, 1), (0, 0, 0))
    with within(10), pytest.raises(CellError, match="activations"):
        resolve_run(cell, init_params(cell, 1, 1, 2**11), {"x": x})
