"""Parameters and inputs of a run: keys, shapes, random initialisation, checks and .npz files."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from cellfuse.graph_model import (
    CellError,
    check_inputs,
    check_params,
    expected_params,
    init_params,
    load_npz,
    load_template,
    param_key,
    param_layers,
    resolve_run,
    run_reference,
    save_npz,
)

LSTM_WEIGHTS = {f"{m}_{g}" for m in "WUb" for g in "ifog"}


def test_param_key():
    assert param_key(0, "W_i") == "l0.W_i" and param_key(12, "b") == "l12.b"


def test_init_params_shapes_per_layer():
    cell = load_template("lstm")
    params = init_params(cell, layers=3, input=5, hidden=4, seed=0)
    assert set(params) == {f"l{k}.{w}" for k in range(3) for w in LSTM_WEIGHTS}
    assert params["l0.W_i"].shape == (5, 4)
    assert params["l1.W_i"].shape == (4, 4) and params["l2.W_g"].shape == (4, 4)
    assert params["l0.U_f"].shape == params["l2.U_o"].shape == (4, 4)
    assert params["l0.b_o"].shape == params["l2.b_i"].shape == (4,)
    assert all(v.dtype == np.float32 for v in params.values())
    assert {k: v.shape for k, v in params.items()} == expected_params(cell, 3, 5, 4)
    assert param_layers(params) == 3


def test_init_params_are_uniform_within_one_over_sqrt_hidden():
    hidden = 16
    bound = 1.0 / np.sqrt(hidden)
    params = init_params(load_template("gru"), layers=2, input=40, hidden=hidden, seed=5)
    values = np.concatenate([v.ravel() for v in params.values()])
    assert np.all(np.abs(values) <= bound)
    assert values.min() < -0.95 * bound and values.max() > 0.95 * bound
    # Uniform: a quarter of the values in each quarter of the range, give or take.
    counts, _ = np.histogram(values, bins=4, range=(-bound, bound))
    assert np.all(np.abs(counts / values.size - 0.25) < 0.03), counts
    assert abs(values.mean()) < 0.02 * bound * 10


def test_init_params_seed():
    cell = load_template("mgu")
    a = init_params(cell, 2, 3, 4, seed=7)
    b = init_params(cell, 2, 3, 4, seed=7)
    c = init_params(cell, 2, 3, 4, seed=8)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def test_param_layers_ignores_other_keys():
    assert param_layers({"l0.W": 0, "l3.b": 0, "x": 0, "lx.W": 0, "final.h": 0}) == 4
    assert param_layers({}) == 0


def test_check_params_accepts_init_params():
    cell = load_template("peephole_lstm")
    check_params(cell, init_params(cell, 2, 3, 4), 2, 3, 4)


def test_missing_parameter_names_key_and_shape():
    cell = load_template("lstm")
    params = init_params(cell, 2, 3, 4)
    del params["l1.U_i"]
    with pytest.raises(CellError) as e:
        check_params(cell, params, 2, 3, 4)
    assert "'l1.U_i'" in str(e.value) and "missing" in str(e.value) and "[4, 4]" in str(e.value)


def test_misshaped_parameter_names_key_and_both_shapes():
    cell = load_template("lstm")
    params = init_params(cell, 2, 3, 4)
    params["l1.W_f"] = np.zeros((3, 4), np.float32)  # layer 1's input is hidden-sized
    with pytest.raises(CellError) as e:
        check_params(cell, params, 2, 3, 4)
    msg = str(e.value)
    assert "'l1.W_f'" in msg and "[3, 4]" in msg and "expected [4, 4]" in msg


def test_parameter_of_the_wrong_dtype():
    cell = load_template("elman")
    params = init_params(cell, 1, 3, 4)
    params["l0.U"] = params["l0.U"].astype(np.int32)
    with pytest.raises(CellError, match="'l0.U'.*int32"):
        check_params(cell, params, 1, 3, 4)


def run_data(name="lstm", layers=2, seq=3, batch=2, input=5, hidden=4):
    cell = load_template(name)
    params = init_params(cell, layers, input, hidden, seed=1)
    x = np.random.default_rng(0).standard_normal((seq, batch, input)).astype(np.float32)
    return cell, params, {"x": x}


def test_resolve_run_reads_sizes_from_the_data():
    cell, params, inputs = run_data()
    layers, hidden, x, states = resolve_run(cell, params, inputs)
    assert (layers, hidden) == (2, 4) and x is inputs["x"]
    assert set(states) == {"h", "c"} and all(v.shape == (2, 2, 4) for v in states.values())
    assert all(not v.any() for v in states.values())


def test_a_misshaped_bias_is_the_one_named():
    # One bias of the wrong size must not make every correct weight look wrong.
    cell, params, inputs = run_data(hidden=16)
    params["l0.b_i"] = np.zeros(7, np.float32)
    with pytest.raises(CellError) as e:
        resolve_run(cell, params, inputs)
    assert "'l0.b_i'" in str(e.value) and "[7]" in str(e.value) and "[16]" in str(e.value)


def test_a_misshaped_first_weight_is_the_one_named():
    cell, params, inputs = run_data(input=5, hidden=16)
    assert cell.of_op("weight")[0].id == "W_i"
    params["l0.W_i"] = np.zeros((5, 7), np.float32)
    with pytest.raises(CellError) as e:
        resolve_run(cell, params, inputs)
    assert "'l0.W_i'" in str(e.value) and "[5, 7]" in str(e.value) and "[5, 16]" in str(e.value)


def test_x_missing():
    cell, params, _ = run_data()
    with pytest.raises(CellError, match="'x' is missing"):
        resolve_run(cell, params, {"h": np.zeros((2, 2, 4), np.float32)})


@pytest.mark.parametrize("shape", [(3, 2), (3, 2, 5, 1), (0, 2, 5), (3, 0, 5)])
def test_x_of_the_wrong_rank_or_empty(shape):
    cell, params, _ = run_data()
    with pytest.raises(CellError) as e:
        resolve_run(cell, params, {"x": np.zeros(shape, np.float32)})
    assert "'x'" in str(e.value) and str(list(shape)) in str(e.value)


def test_x_of_the_wrong_input_size_names_x():
    cell, params, _ = run_data(input=5)
    with pytest.raises(CellError) as e:
        resolve_run(cell, params, {"x": np.zeros((3, 2, 6), np.float32)})
    msg = str(e.value)
    assert "'x'" in msg and "[3, 2, 6]" in msg and "5" in msg


def test_x_of_the_wrong_dtype():
    cell, params, _ = run_data()
    with pytest.raises(CellError, match="'x'.*int64"):
        resolve_run(cell, params, {"x": np.zeros((3, 2, 5), np.int64)})


def test_check_inputs_checks_x_against_the_input_size():
    cell = load_template("elman")
    with pytest.raises(CellError, match=r"'x' has shape \[3, 2, 6\], expected \[T, B, 5\]"):
        check_inputs(cell, {"x": np.zeros((3, 2, 6), np.float32)}, 1, 5, 4)


@pytest.mark.parametrize("shape", [(2, 2), (1, 2, 4), (2, 3, 4), (2, 2, 5)])
def test_misshaped_initial_state_is_named(shape):
    cell, params, inputs = run_data()
    inputs["c"] = np.zeros(shape, np.float32)
    with pytest.raises(CellError) as e:
        resolve_run(cell, params, inputs)
    msg = str(e.value)
    assert "initial state 'c'" in msg and str(list(shape)) in msg and "[2, 2, 4]" in msg


def test_initial_state_of_the_wrong_dtype():
    cell, params, inputs = run_data()
    inputs["h"] = np.zeros((2, 2, 4), "U3")
    with pytest.raises(CellError, match="initial state 'h'.*dtype"):
        resolve_run(cell, params, inputs)


def test_given_initial_states_are_used():
    cell, params, inputs = run_data()
    inputs["h"] = np.full((2, 2, 4), 0.5, np.float32)
    _, _, _, states = resolve_run(cell, params, inputs)
    assert np.all(states["h"] == 0.5) and not states["c"].any()


# -- .npz files ----------------------------------------------------------------------------------

def test_npz_round_trip(tmp_path):
    arrays = {"l0.W": np.arange(6, dtype=np.float32).reshape(2, 3), "x": np.ones((1, 1, 2), np.float32)}
    save_npz(tmp_path / "a.npz", arrays)
    back = load_npz(tmp_path / "a.npz", "parameters")
    assert set(back) == set(arrays)
    for k in arrays:
        assert back[k].dtype == arrays[k].dtype
        np.testing.assert_array_equal(back[k], arrays[k])
    assert [p.name for p in tmp_path.iterdir()] == ["a.npz"]


def test_load_npz_refuses_pickled_object_arrays(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(CellError) as e:
        load_npz(path, "inputs")
    assert str(path) in str(e.value) and "inputs" in str(e.value)


def test_load_npz_refuses_a_pickle(tmp_path):
    import pickle

    path = tmp_path / "evil.npz"
    path.write_bytes(pickle.dumps({"x": np.zeros(3)}))
    with pytest.raises(CellError, match="evil.npz"):
        load_npz(path, "inputs")


@pytest.mark.parametrize("content", [b"", b"hello, world\n", b"PK\x03\x04broken", b"\x93NUMPY"])
def test_load_npz_of_a_file_that_is_not_npz(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(CellError) as e:
        load_npz(path, "parameters")
    assert str(path) in str(e.value) and "parameters" in str(e.value)


def test_load_npz_of_an_npy_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(3, np.float32))
    with pytest.raises(CellError, match="not an .npz"):
        load_npz(path, "inputs")


def test_load_npz_of_a_zip_with_a_member_that_is_no_array(tmp_path):
    path = tmp_path / "zip.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x", b"not an array")
    with pytest.raises(CellError, match="'x'"):
        load_npz(path, "inputs")


def test_load_npz_of_a_corrupt_member(tmp_path):
    buf = io.BytesIO()
    np.savez_compressed(buf, x=np.zeros(10_000, np.float32))
    data = bytearray(buf.getvalue())
    mid = len(data) // 2
    data[mid:mid + 8] = b"\x00\xff" * 4
    path = tmp_path / "corrupt.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(CellError, match="corrupt.npz"):
        load_npz(path, "inputs")


def test_load_npz_missing_file_and_directory(tmp_path):
    with pytest.raises(CellError, match="no such file"):
        load_npz(tmp_path / "nope.npz", "parameters")
    with pytest.raises(CellError):
        load_npz(tmp_path, "parameters")


def test_a_run_from_files(tmp_path):
    cell, params, inputs = run_data()
    save_npz(tmp_path / "p.npz", params)
    save_npz(tmp_path / "x.npz", inputs)
    params, inputs = load_npz(tmp_path / "p.npz", "parameters"), load_npz(tmp_path / "x.npz", "inputs")
    out = run_reference(cell, params, inputs)
    assert out.y.shape == (3, 2, 4) and out.final["c"].shape == (2, 2, 4)


def test_values_that_are_not_arrays_are_named():
    cell, params, inputs = run_data()
    with pytest.raises(CellError, match="'x' is a list"):
        resolve_run(cell, params, {"x": [[[0.0] * 5] * 2] * 3})
    with pytest.raises(CellError, match="initial state 'h' is a float"):
        resolve_run(cell, params, {**inputs, "h": 0.0})
    with pytest.raises(CellError, match=r"parameter 'l0.U_i' is a list.*\[4, 4\]"):
        check_params(cell, {**params, "l0.U_i": [[0.0] * 4] * 4}, 2, 5, 4)
