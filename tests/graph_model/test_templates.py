"""The built-in cells: all there, all valid, laid out, and exactly what scripts/make_templates.py writes;
the cells that tie the input width to the hidden width against formulas written here from their papers."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.graph_model import (
    CellError,
    analyze,
    expected_params,
    init_params,
    load_template,
    run_reference,
    template_names,
)
from cellfuse.graph_model.templates import template_text

NAMES = ["cifg_lstm", "elman", "gru", "gru_cho", "indrnn", "layernorm_lstm", "lstm", "mgu", "peephole_lstm",
         "residual_lstm", "slstm", "sru"]
# The templates that combine x with a hidden-wide value, and the node that does it.
TIES = {"residual_lstm": "y", "sru": "highway"}


def test_template_names():
    assert template_names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_template_validates_without_problems(name):
    cell = load_template(name)
    info = analyze(cell)
    assert info.problems == []
    assert [t.node for t in info.ties] == ([TIES[name]] if name in TIES else [])
    assert cell.name and cell.description
    assert cell.sizes == {"input": 512, "hidden": 512}  # equal, as a cell that ties them needs
    assert len(cell.of_op("input")) == 1


@pytest.mark.parametrize("name", NAMES)
def test_layout_places_every_node_once(name):
    cell = load_template(name)
    ids = {n.id for n in cell.nodes}
    assert set(cell.layout) == ids
    positions = [tuple(p) for p in cell.layout.values()]
    assert len(set(positions)) == len(positions), "two nodes at the same position"


def test_shipped_files_are_what_the_script_writes(tmp_path, make_templates_module):
    make_templates_module.write_all(tmp_path)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [f"{n}.cell.json" for n in NAMES]
    for name in NAMES:
        assert (tmp_path / f"{name}.cell.json").read_text("utf-8") == template_text(name), name


def test_script_covers_every_template(make_templates_module):
    assert sorted(make_templates_module.TEMPLATES) == NAMES


def test_unknown_template():
    with pytest.raises(CellError) as e:
        load_template("lstmm")
    assert "'lstmm'" in str(e.value) and "lstm" in str(e.value)


def test_templates_are_independent_copies():
    a = load_template("lstm")
    a.nodes.pop()
    assert len(load_template("lstm").nodes) == len(a.nodes) + 1


# Shapes of the parameters, as the papers name them (checked against the reference in test_reference).
EXPECTED_WEIGHTS = {
    "lstm": {f"{m}_{g}" for m in "WUb" for g in "ifog"},
    "peephole_lstm": {f"{m}_{g}" for m in "WUb" for g in "ifog"} | {"p_i", "p_f", "p_o"},
    "cifg_lstm": {f"{m}_{g}" for m in "WUb" for g in "iog"},
    "gru": {f"{m}_{s}{g}" for m in "Wb" for s in "ih" for g in "rzn"},
    "gru_cho": {f"{m}_{g}" for m in "WUb" for g in "rzn"},
    "mgu": {f"{m}_{g}" for m in "WUb" for g in "fh"},
    "indrnn": {"W", "u", "b"},
    "elman": {"W", "U", "b"},
    "sru": {"W", "W_f", "W_r", "v_f", "v_r", "b_f", "b_r"},
    "residual_lstm": {f"{m}_{g}" for m in "WUb" for g in "ifog"},
    "slstm": {f"{m}_{g}" for m in "WUb" for g in "ifzo"},
    "layernorm_lstm": ({f"{m}_{g}" for m in "WUb" for g in "ifog"}
                       | {f"{m}_{side}_{g}" for m in ("alpha", "beta") for side in "xh" for g in "ifog"}
                       | {"alpha_c", "beta_c"}),
}


@pytest.mark.parametrize("name", NAMES)
def test_weights(name):
    cell = load_template(name)
    assert {w.id for w in cell.of_op("weight")} == EXPECTED_WEIGHTS[name]
    for w in cell.of_op("weight"):
        if w.id.startswith("W"):
            assert w.shape in (["input", "hidden"], ["hidden", "hidden"])
        elif w.id.startswith("U"):
            assert w.shape == ["hidden", "hidden"]
        else:
            assert w.shape == ["hidden"]


# -- the cells that tie the widths, against their papers --------------------------------------------
# Row vectors, x @ W with W of shape [in, hidden], parameters named as in the template files. The other
# templates are checked against their papers in test_reference.

T, B, WIDTH = 5, 3, 4


def sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def sru(p, x, s):
    # Lei et al. 2017, Simple Recurrent Units for Highly Parallelizable Recurrence (the form with v_f and
    # v_r on c(t-1)): no matrix multiplies the state; the highway term carries x itself to the output.
    c_prev = s["c"]
    x_tilde = x @ p["W"]
    f = sig(x @ p["W_f"] + p["v_f"] * c_prev + p["b_f"])
    r = sig(x @ p["W_r"] + p["v_r"] * c_prev + p["b_r"])
    c = f * c_prev + (1.0 - f) * x_tilde
    h = r * c + (1.0 - r) * x
    return {"c": c}, h


def residual_lstm(p, x, s):
    # An LSTM (forget gate of Gers 2000) whose output adds its input, as between the stacked layers of
    # Wu et al. 2016 (GNMT): x(l+1) = h(l) + x(l), while the state it carries to the next step is h(l).
    h, c = s["h"], s["c"]
    i = sig(x @ p["W_i"] + h @ p["U_i"] + p["b_i"])
    f = sig(x @ p["W_f"] + h @ p["U_f"] + p["b_f"])
    o = sig(x @ p["W_o"] + h @ p["U_o"] + p["b_o"])
    g = np.tanh(x @ p["W_g"] + h @ p["U_g"] + p["b_g"])
    c = f * c + i * g
    h = o * np.tanh(c)
    return {"h": h, "c": c}, h + x


PAPERS = {"sru": sru, "residual_lstm": residual_lstm}


def test_every_template_that_ties_the_widths_has_its_paper_here():
    assert sorted(PAPERS) == sorted(TIES)


def run_paper(step, params, x, init, layers):
    seq = x.astype(np.float64)
    finals: dict[str, list[np.ndarray]] = {}
    for layer in range(layers):
        prefix = f"l{layer}."
        p = {k[len(prefix):]: v.astype(np.float64) for k, v in params.items() if k.startswith(prefix)}
        s = {k: v[layer].astype(np.float64) for k, v in init.items()}
        ys = []
        for t in range(seq.shape[0]):
            s, y = step(p, seq[t], s)
            ys.append(y)
        seq = np.stack(ys)
        for k, v in s.items():
            finals.setdefault(k, []).append(v)
    return seq, {k: np.stack(v) for k, v in finals.items()}


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("with_states", [False, True])
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_a_template_that_ties_the_widths_computes_its_paper(name, layers, with_states):
    rng = np.random.default_rng([layers, int(with_states), len(name)])
    cell = load_template(name)
    params = {k: (rng.standard_normal(shape) * 0.6).astype(np.float32)
              for k, shape in expected_params(cell, layers, WIDTH, WIDTH).items()}
    x = rng.standard_normal((T, B, WIDTH)).astype(np.float32)
    state_ids = sorted(cell.updates)
    init = {s: (rng.standard_normal((layers, B, WIDTH)) * 0.8).astype(np.float32) if with_states
            else np.zeros((layers, B, WIDTH), np.float32) for s in state_ids}

    got = run_reference(cell, params, {"x": x, **(init if with_states else {})})
    want_y, want_final = run_paper(PAPERS[name], params, x, init, layers)

    assert got.y.shape == (T, B, WIDTH) and sorted(got.final) == state_ids
    np.testing.assert_allclose(got.y, want_y, rtol=1e-5, atol=1e-6)
    for s in state_ids:
        assert got.final[s].shape == (layers, B, WIDTH)
        np.testing.assert_allclose(got.final[s], want_final[s], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(TIES))
def test_a_template_that_ties_the_widths_refuses_other_sizes(name):
    cell = load_template(name)
    node = TIES[name]
    with pytest.raises(CellError) as e:
        init_params(cell, 2, 3, 4)
    assert f"node '{node}'" in str(e.value) and "input size 3 and hidden size 4" in str(e.value)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(shape).astype(np.float32)
              for k, shape in expected_params(cell, 2, 3, 4).items()}
    with pytest.raises(CellError) as e:
        run_reference(cell, params, {"x": np.zeros((2, 1, 3), np.float32)})
    message = str(e.value)
    assert message.startswith(f"cell '{cell.name}' cannot run at input size 3 and hidden size 4: "
                              f"node '{node}' ")
    assert message.endswith(", so the two must be equal") and "\n" not in message


# -- sLSTM and the layer-normalised LSTM, against their papers ------------------------------------------
# Written from the papers, with the gates' weights side by side as the papers' stacked matrices.

def slstm(p, x, s):
    # Beck et al. 2024, xLSTM: Extended Long Short-Term Memory, the sLSTM of section 2.2 with one head (so
    # the recurrent matrix is dense), an exponential input gate i = exp(i~) and a sigmoid forget gate,
    # stabilised by the state m: m_t = max(log f_t + m_{t-1}, log i_t), i' = exp(log i_t - m_t),
    # f' = exp(log f_t + m_{t-1} - m_t); c_t = f' c_{t-1} + i' z_t, n_t = f' n_{t-1} + i',
    # h_t = o_t c_t / n_t.
    h, c, n, m = s["h"], s["c"], s["n"], s["m"]
    z = np.tanh(x @ p["W_z"] + h @ p["U_z"] + p["b_z"])
    log_i = x @ p["W_i"] + h @ p["U_i"] + p["b_i"]
    f = sig(x @ p["W_f"] + h @ p["U_f"] + p["b_f"])
    o = sig(x @ p["W_o"] + h @ p["U_o"] + p["b_o"])
    m_new = np.maximum(np.log(f) + m, log_i)
    i_prime = np.exp(log_i - m_new)
    f_prime = np.exp(np.log(f) + m - m_new)
    c = f_prime * c + i_prime * z
    n = f_prime * n + i_prime
    h = o * (c / n)
    return {"h": h, "c": c, "n": n, "m": m_new}, h


def layer_norm(a, gain, bias, eps=1e-5):
    """Ba et al. 2016, eq. 4 and Haste's LayerNorm: the mean and the (biased) variance of each row."""
    mu = a.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(((a - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (a - mu) / sigma * gain + bias


def layernorm_lstm(p, x, s):
    # Ba et al. 2016, Layer Normalization, section 6.2 (as Haste's LayerNormLSTM computes it): the four
    # gates' pre-activations x W and h U each normalised as one vector, then the cell before its tanh:
    # (i, f, o, g) = LN(h U; a1, b1) + LN(x W; a2, b2) + b, c = s(f) c + s(i) tanh(g),
    # h = s(o) tanh(LN(c; a3, b3)). The cell carries c itself, not its norm.
    h, c = s["h"], s["c"]
    stack = lambda key: np.concatenate([p[key.format(g)] for g in "ifog"], axis=-1)  # noqa: E731
    gates = (layer_norm(h @ stack("U_{}"), stack("alpha_h_{}"), stack("beta_h_{}"))
             + layer_norm(x @ stack("W_{}"), stack("alpha_x_{}"), stack("beta_x_{}")) + stack("b_{}"))
    i, f, o, g = np.split(gates, 4, axis=-1)
    c = sig(f) * c + sig(i) * np.tanh(g)
    h = sig(o) * np.tanh(layer_norm(c, p["alpha_c"], p["beta_c"]))
    return {"h": h, "c": c}, h


RECENT_PAPERS = {"slstm": slstm, "layernorm_lstm": layernorm_lstm}
INPUT, HIDDEN = 3, 5


def initial_states(name, rng, layers, with_states):
    """Zeros (what a run starts from when none are given), or random ones; sLSTM's normaliser n, a
    sum of positive terms, is positive."""
    cell = load_template(name)
    if not with_states:
        return {s: np.zeros((layers, B, HIDDEN), np.float32) for s in cell.updates}
    out = {s: (rng.standard_normal((layers, B, HIDDEN)) * 0.8).astype(np.float32) for s in cell.updates}
    if name == "slstm":
        out["n"] = rng.uniform(0.5, 1.5, (layers, B, HIDDEN)).astype(np.float32)
    return out


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("with_states", [False, True])
@pytest.mark.parametrize("name", sorted(RECENT_PAPERS))
def test_slstm_and_layernorm_lstm_compute_their_papers(name, layers, with_states):
    rng = np.random.default_rng([layers, int(with_states), len(name), 7])
    cell = load_template(name)
    params = {k: (rng.standard_normal(shape) * 0.6).astype(np.float32)
              for k, shape in expected_params(cell, layers, INPUT, HIDDEN).items()}
    x = rng.standard_normal((T, B, INPUT)).astype(np.float32)
    init = initial_states(name, rng, layers, with_states)

    got = run_reference(cell, params, {"x": x, **(init if with_states else {})})
    want_y, want_final = run_paper(RECENT_PAPERS[name], params, x, init, layers)

    assert got.y.shape == (T, B, HIDDEN) and sorted(got.final) == sorted(init)
    np.testing.assert_allclose(got.y, want_y, rtol=1e-5, atol=1e-6)
    for s in init:
        np.testing.assert_allclose(got.final[s], want_final[s], rtol=1e-5, atol=1e-6)


def test_the_first_step_of_slstm_from_zero_states_has_a_positive_normaliser():
    """With n = m = 0 before the first step, n_1 = i' = exp(i~ - m_1), positive: h_1 = o c_1 / n_1 is never
    0/0, not even where i~ is far below log f (i' small, c_1 = i' z as small)."""
    cell = load_template("slstm")
    rng = np.random.default_rng(3)
    params = {k: (rng.standard_normal(shape) * 0.6).astype(np.float32)
              for k, shape in expected_params(cell, 1, INPUT, HIDDEN).items()}
    params["l0.b_i"] = np.full(HIDDEN, -30.0, np.float32)  # i~ about -30: i' = e^-30 at most
    x = rng.standard_normal((1, B, INPUT)).astype(np.float32)
    got = run_reference(cell, params, {"x": x})
    want_y, want_final = run_paper(slstm, params, x, initial_states("slstm", rng, 1, False), 1)
    assert np.all(got.final["n"] > 0.0) and np.all(got.final["n"] < 1e-10)
    np.testing.assert_allclose(got.final["n"], want_final["n"], rtol=1e-5)
    np.testing.assert_allclose(got.y, want_y, rtol=1e-4, atol=1e-7)
    # h_1 = o z: c_1 / n_1 = i' z / i'
    z = np.tanh(x[0] @ params["l0.W_z"] + params["l0.b_z"])
    o = sig(x[0] @ params["l0.W_o"] + params["l0.b_o"])
    np.testing.assert_allclose(got.y[0], o * z, rtol=1e-5, atol=1e-7)
