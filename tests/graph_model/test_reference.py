"""The reference interpreter against formulas written here from the papers, not from the cells.

Conventions: row vectors, x @ W with W of shape [in, hidden], parameters named as in the template files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellfuse.graph_model import (
    Cell,
    CellBuilder,
    CellError,
    Node,
    exp,
    expected_params,
    load_template,
    run_reference,
    tanh,
)

T, B, INPUT, HIDDEN = 5, 2, 3, 4


def sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def lstm(p, x, s):
    # Hochreiter & Schmidhuber 1997 with the forget gate of Gers, Schmidhuber & Cummins 2000.
    h, c = s["h"], s["c"]
    i = sig(x @ p["W_i"] + h @ p["U_i"] + p["b_i"])
    f = sig(x @ p["W_f"] + h @ p["U_f"] + p["b_f"])
    o = sig(x @ p["W_o"] + h @ p["U_o"] + p["b_o"])
    g = np.tanh(x @ p["W_g"] + h @ p["U_g"] + p["b_g"])
    c = f * c + i * g
    h = o * np.tanh(c)
    return {"h": h, "c": c}, h


def peephole_lstm(p, x, s):
    # Greff et al. 2015, "vanilla LSTM": the input and forget gates look at c(t-1), the output gate at c(t).
    h, c_prev = s["h"], s["c"]
    i = sig(x @ p["W_i"] + h @ p["U_i"] + p["p_i"] * c_prev + p["b_i"])
    f = sig(x @ p["W_f"] + h @ p["U_f"] + p["p_f"] * c_prev + p["b_f"])
    z = np.tanh(x @ p["W_g"] + h @ p["U_g"] + p["b_g"])
    c = f * c_prev + i * z
    o = sig(x @ p["W_o"] + h @ p["U_o"] + p["p_o"] * c + p["b_o"])
    h = o * np.tanh(c)
    return {"h": h, "c": c}, h


def cifg_lstm(p, x, s):
    # Coupled input and forget gate (Greff et al. 2015): f = 1 - i.
    h, c = s["h"], s["c"]
    i = sig(x @ p["W_i"] + h @ p["U_i"] + p["b_i"])
    o = sig(x @ p["W_o"] + h @ p["U_o"] + p["b_o"])
    g = np.tanh(x @ p["W_g"] + h @ p["U_g"] + p["b_g"])
    c = (1.0 - i) * c + i * g
    h = o * np.tanh(c)
    return {"h": h, "c": c}, h


def gru(p, x, s):
    # torch.nn.GRU: r = s(W_ir x + b_ir + W_hr h + b_hr), z likewise,
    # n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h.
    h = s["h"]
    r = sig(x @ p["W_ir"] + p["b_ir"] + h @ p["W_hr"] + p["b_hr"])
    z = sig(x @ p["W_iz"] + p["b_iz"] + h @ p["W_hz"] + p["b_hz"])
    n = np.tanh(x @ p["W_in"] + p["b_in"] + r * (h @ p["W_hn"] + p["b_hn"]))
    h = (1.0 - z) * n + z * h
    return {"h": h}, h


def gru_cho(p, x, s):
    # Cho et al. 2014: h~ = tanh(W x + U (r * h)), h' = z * h + (1 - z) * h~ (with biases).
    h = s["h"]
    r = sig(x @ p["W_r"] + h @ p["U_r"] + p["b_r"])
    z = sig(x @ p["W_z"] + h @ p["U_z"] + p["b_z"])
    h_tilde = np.tanh(x @ p["W_n"] + (r * h) @ p["U_n"] + p["b_n"])
    h = z * h + (1.0 - z) * h_tilde
    return {"h": h}, h


def mgu(p, x, s):
    # Zhou et al. 2016: f = s(W_f [h, x] + b_f), h~ = tanh(W_h [f * h, x] + b_h), h' = (1 - f) h + f h~.
    h = s["h"]
    f = sig(x @ p["W_f"] + h @ p["U_f"] + p["b_f"])
    h_tilde = np.tanh(x @ p["W_h"] + (f * h) @ p["U_h"] + p["b_h"])
    h = (1.0 - f) * h + f * h_tilde
    return {"h": h}, h


def indrnn(p, x, s):
    # Li et al. 2018: h = relu(W x + u * h + b), u a vector: each neuron sees only its own past.
    h = np.maximum(x @ p["W"] + p["u"] * s["h"] + p["b"], 0.0)
    return {"h": h}, h


def elman(p, x, s):
    # Elman 1990 as torch.nn.RNN(nonlinearity="tanh"): h = tanh(W x + U h + b).
    h = np.tanh(x @ p["W"] + s["h"] @ p["U"] + p["b"])
    return {"h": h}, h


FORMULAS = {f.__name__: f for f in [lstm, peephole_lstm, cifg_lstm, gru, gru_cho, mgu, indrnn, elman]}


class Recording(dict):
    """A dict that remembers which keys were read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def run_formula(step, params, x, init, layers):
    seq = x.astype(np.float64)
    finals: dict[str, list[np.ndarray]] = {}
    for layer in range(layers):
        prefix = f"l{layer}."
        p = Recording({k[len(prefix):]: v.astype(np.float64) for k, v in params.items()
                       if k.startswith(prefix)})
        s = {k: v[layer].astype(np.float64) for k, v in init.items()}
        ys = []
        for t in range(seq.shape[0]):
            s, y = step(p, seq[t], s)
            ys.append(y)
        assert p.read == set(p), f"the cell has parameters the formula does not use: {set(p) - p.read}"
        seq = np.stack(ys)
        for k, v in s.items():
            finals.setdefault(k, []).append(v)
    return seq, {k: np.stack(v) for k, v in finals.items()}


def random_params(cell, layers, rng):
    return {k: (rng.standard_normal(shape) * 0.6).astype(np.float32)
            for k, shape in expected_params(cell, layers, INPUT, HIDDEN).items()}


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("with_states", [False, True])
@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_reference_matches_the_paper(name, layers, with_states):
    rng = np.random.default_rng([layers, int(with_states), len(name)])
    cell = load_template(name)
    params = random_params(cell, layers, rng)
    x = rng.standard_normal((T, B, INPUT)).astype(np.float32)
    state_ids = sorted(s.id for s in cell.of_op("state"))
    init = {s: (rng.standard_normal((layers, B, HIDDEN)) * 0.8).astype(np.float32) if with_states
            else np.zeros((layers, B, HIDDEN), np.float32) for s in state_ids}
    inputs = {"x": x, **(init if with_states else {})}

    got = run_reference(cell, params, inputs)
    want_y, want_final = run_formula(FORMULAS[name], params, x, init, layers)

    assert got.y.dtype == np.float32 and got.y.shape == (T, B, HIDDEN)
    assert sorted(got.final) == state_ids
    np.testing.assert_allclose(got.y, want_y, rtol=1e-5, atol=1e-6)
    for s in state_ids:
        assert got.final[s].dtype == np.float32 and got.final[s].shape == (layers, B, HIDDEN)
        np.testing.assert_allclose(got.final[s], want_final[s], rtol=1e-5, atol=1e-6)
    # The last layer's output at the last step is its final h.
    np.testing.assert_allclose(got.y[-1], got.final["h"][-1], rtol=0, atol=0)


def test_initial_states_matter():
    rng = np.random.default_rng(1)
    cell = load_template("lstm")
    params = random_params(cell, 2, rng)
    x = rng.standard_normal((T, B, INPUT)).astype(np.float32)
    zero = run_reference(cell, params, {"x": x})
    c0 = np.ones((2, B, HIDDEN), np.float32)
    given = run_reference(cell, params, {"x": x, "c": c0})
    assert not np.allclose(zero.y, given.y)
    explicit_zero = run_reference(cell, params, {"x": x, "c": np.zeros_like(c0), "h": np.zeros_like(c0)})
    np.testing.assert_array_equal(zero.y, explicit_zero.y)


def elman_params(W, U, b):
    return {"l0.W": np.array(W, np.float32), "l0.U": np.array(U, np.float32), "l0.b": np.array(b, np.float32)}


def test_elman_by_hand():
    # hidden = 2, input = 1, T = 2, one sequence.
    # Step 1: a = 1 * [ln2 - 0.4, ln3 - 0.8] + 0 + [0.4, 0.8] = [ln2, ln3];
    #         tanh(ln 2) = (2 - 1/2) / (2 + 1/2) = 0.6, tanh(ln 3) = (3 - 1/3) / (3 + 1/3) = 0.8.
    # Step 2: a = 0 + [0.6, 0.8] @ [[1, 0], [0, -1]] + [0.4, 0.8] = [1.0, 0.0]; h = [tanh 1, 0].
    ln2, ln3 = math.log(2.0), math.log(3.0)
    params = elman_params([[ln2 - 0.4, ln3 - 0.8]], [[1.0, 0.0], [0.0, -1.0]], [0.4, 0.8])
    x = np.array([[[1.0]], [[0.0]]], np.float32)
    out = run_reference(load_template("elman"), params, {"x": x})
    assert out.y.dtype == np.float32 and out.y.shape == (2, 1, 2)
    np.testing.assert_allclose(out.y[:, 0, :], [[0.6, 0.8], [math.tanh(1.0), 0.0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out.final["h"], [[[math.tanh(1.0), 0.0]]], rtol=1e-6, atol=1e-7)
    assert set(out.arrays()) == {"y", "final.h"}


def test_elman_by_hand_with_an_initial_state():
    # x = 0, b = 0, h0 = [0.5, -0.25], U = diag(2, 4): step 1 a = [1, -1]; step 2 a = 2 tanh(1) * [1, -2].
    params = elman_params([[7.0, -3.0]], [[2.0, 0.0], [0.0, 4.0]], [0.0, 0.0])
    x = np.zeros((2, 1, 1), np.float32)
    h0 = np.array([[[0.5, -0.25]]], np.float32)
    out = run_reference(load_template("elman"), params, {"x": x, "h": h0})
    t1 = math.tanh(1.0)
    np.testing.assert_allclose(out.y[:, 0, :], [[t1, -t1], [math.tanh(2 * t1), -math.tanh(4 * t1)]],
                               rtol=1e-6, atol=1e-7)


def test_fewer_layers_than_the_parameters_hold():
    rng = np.random.default_rng(2)
    cell = load_template("gru")
    params = random_params(cell, 3, rng)
    x = rng.standard_normal((T, B, INPUT)).astype(np.float32)
    one = run_reference(cell, params, {"x": x}, layers=1)
    assert one.final["h"].shape == (1, B, HIDDEN)
    want, _ = run_formula(gru, {k: v for k, v in params.items() if k.startswith("l0.")}, x,
                          {"h": np.zeros((1, B, HIDDEN))}, 1)
    np.testing.assert_allclose(one.y, want, rtol=1e-5, atol=1e-6)


def test_more_layers_than_the_parameters_hold():
    rng = np.random.default_rng(3)
    cell = load_template("gru")
    params = random_params(cell, 2, rng)
    with pytest.raises(CellError, match="'l2.W_ir' is missing"):
        run_reference(cell, params, {"x": rng.standard_normal((T, B, INPUT)).astype(np.float32)}, layers=3)


def test_overflow_is_a_cell_error():
    b = CellBuilder("blowup", input=1, hidden=1)
    x, h, W = b.input("x"), b.state("h"), b.weight("W", "input", "hidden")
    h_new = exp(x @ W + h)
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    params = {"l0.W": np.array([[400.0]], np.float32)}
    with pytest.raises(CellError, match="NaN or infinity"):
        run_reference(cell, params, {"x": np.ones((3, 1, 1), np.float32)})


def test_a_state_that_overflows_out_of_sight_is_a_cell_error():
    # y stays finite while the state c goes to infinity.
    b = CellBuilder("hidden blowup", input=1, hidden=1)
    x, h, c, W = b.input("x"), b.state("h"), b.state("c"), b.weight("W", "input", "hidden")
    xw = x @ W
    b.update(c, exp(xw + c))
    h_new = tanh(xw)
    b.update(h, h_new)
    b.output(h_new)
    params = {"l0.W": np.array([[400.0]], np.float32)}
    with pytest.raises(CellError, match="state 'c' holds NaN or infinity"):
        run_reference(b.build(), params, {"x": np.ones((3, 1, 1), np.float32)})


def test_an_invalid_cell_is_refused():
    cell = load_template("elman")
    cell.nodes.append(Node("c", "state"))
    params = elman_params(np.zeros((3, 4)), np.zeros((4, 4)), np.zeros(4))
    with pytest.raises(CellError, match="'c'"):
        run_reference(cell, params, {"x": np.zeros((2, 1, 3), np.float32)})


def test_dead_nodes_are_not_computed():
    cell = load_template("elman")
    cell.nodes.append(Node("boom", "exp", ["a"]))  # would overflow if it were computed
    cell.nodes.append(Node("k", "const", value=1e308))
    cell.nodes.append(Node("boom2", "mul", ["k", "boom"]))
    params = elman_params(np.full((1, 2), 400.0), np.zeros((2, 2)), np.zeros(2))
    out = run_reference(cell, params, {"x": np.ones((2, 1, 1), np.float32)})
    np.testing.assert_allclose(out.y, 1.0)


def test_a_cell_whose_output_is_the_state_lags_one_step():
    cell = Cell("lag", nodes=[Node("x", "input"), Node("h", "state"),
                              Node("W", "weight", shape=["input", "hidden"]),
                              Node("xw", "matmul", ["x", "W"])],
                updates={"h": "xw"}, output="h")
    x = np.arange(3, dtype=np.float32).reshape(3, 1, 1)
    out = run_reference(cell, {"l0.W": np.array([[2.0]], np.float32)}, {"x": x})
    np.testing.assert_array_equal(out.y[:, 0, 0], [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(out.final["h"], [[[4.0]]])


def test_a_result_beyond_float32_is_a_cell_error():
    # exp(100) is finite in float64 but not in float32, which is what a run returns.
    b = CellBuilder("big", input=1, hidden=1)
    x, h, W = b.input("x"), b.state("h"), b.weight("W", "input", "hidden")
    h_new = exp(x @ W)
    b.update(h, h_new)
    b.output(h_new)
    with pytest.raises(CellError, match="float32"):
        run_reference(b.build(), {"l0.W": np.array([[100.0]], np.float32)},
                      {"x": np.ones((1, 1, 1), np.float32)})
