"""Writes the built-in templates (cellfuse/resources/templates/*.cell.json) with the cell builder.

Run from the project root after changing a template:  python scripts/make_templates.py
The tests check that the shipped files are what this script writes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from cellfuse.graph_model import Cell, CellBuilder, relu, save_cell, sigmoid, tanh
from cellfuse.graph_model.builder import apply, exp, row_mean, rsqrt, softplus, square

OUT = Path(__file__).resolve().parent.parent / "cellfuse" / "resources" / "templates"


# The names the editor shows a gate's group under, by the gate's letter.
GATE_NAMES = {"i": "input gate", "f": "forget gate", "o": "output gate", "g": "candidate",
              "r": "reset gate", "z": "update gate", "n": "candidate"}


def _gate(b: CellBuilder, x, h, name: str, act, extra=None):
    """act(x @ W_name + h @ U_name [+ extra] + b_name), its nodes named after the gate and grouped under
    the gate's name."""
    with b.group(GATE_NAMES[name]):
        W = b.weight(f"W_{name}", "input", "hidden")
        U = b.weight(f"U_{name}", "hidden", "hidden")
        bias = b.weight(f"b_{name}", "hidden")
        pre = ((x @ W).named(f"x{name}") + (h @ U).named(f"h{name}")).named(f"a{name}")
        if extra is not None:
            pre = (pre + extra).named(f"a{name}_p")
        return act((pre + bias).named(f"a{name}_b")).named(name)


def lstm() -> Cell:
    b = CellBuilder("LSTM", "Hochreiter & Schmidhuber 1997, forget gate of Gers 2000, no peepholes")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    i, f, o = (_gate(b, x, h, g, sigmoid) for g in "ifo")
    g = _gate(b, x, h, "g", tanh)
    c_new = ((f * c).named("fc") + (i * g).named("ig")).named("c_new")
    h_new = (o * tanh(c_new).named("tc")).named("h_new")
    b.update(h, h_new)
    b.update(c, c_new)
    b.output(h_new)
    return b.build()


def peephole_lstm() -> Cell:
    b = CellBuilder("Peephole LSTM",
                    "Vanilla LSTM of Greff et al. 2015 (Gers & Schmidhuber 2000): peepholes p_i, p_f "
                    "on c(t-1), p_o on c(t)")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    p_i, p_f, p_o = (b.weight(f"p_{g}", "hidden") for g in "ifo")
    i = _gate(b, x, h, "i", sigmoid, (p_i * c).named("pc_i"))
    f = _gate(b, x, h, "f", sigmoid, (p_f * c).named("pc_f"))
    g = _gate(b, x, h, "g", tanh)
    c_new = ((f * c).named("fc") + (i * g).named("ig")).named("c_new")
    o = _gate(b, x, h, "o", sigmoid, (p_o * c_new).named("pc_o"))
    h_new = (o * tanh(c_new).named("tc")).named("h_new")
    b.update(h, h_new)
    b.update(c, c_new)
    b.output(h_new)
    return b.build()


def cifg_lstm() -> Cell:
    b = CellBuilder("CIFG-LSTM", "LSTM with coupled input and forget gate (f = 1 - i, Greff et al. 2015), "
                    "no peepholes")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    i = _gate(b, x, h, "i", sigmoid)
    o = _gate(b, x, h, "o", sigmoid)
    g = _gate(b, x, h, "g", tanh)
    f = (b.const(1.0, "one") - i).named("f")
    c_new = ((f * c).named("fc") + (i * g).named("ig")).named("c_new")
    h_new = (o * tanh(c_new).named("tc")).named("h_new")
    b.update(h, h_new)
    b.update(c, c_new)
    b.output(h_new)
    return b.build()


def gru() -> Cell:
    b = CellBuilder("GRU", "GRU exactly as torch.nn.GRU computes it: the reset gate multiplies "
                    "(W_hn h + b_hn), after the recurrent matmul")
    x, h = b.input("x"), b.state("h")
    gates = {}
    for g in "rz":
        with b.group(GATE_NAMES[g]):
            W, U = b.weight(f"W_i{g}", "input", "hidden"), b.weight(f"W_h{g}", "hidden", "hidden")
            bi, bh = b.weight(f"b_i{g}", "hidden"), b.weight(f"b_h{g}", "hidden")
            xg = ((x @ W).named(f"x{g}") + bi).named(f"x{g}_b")
            hg = ((h @ U).named(f"h{g}") + bh).named(f"h{g}_b")
            gates[g] = sigmoid((xg + hg).named(f"a{g}")).named(g)
    with b.group(GATE_NAMES["n"]):
        W_in, W_hn = b.weight("W_in", "input", "hidden"), b.weight("W_hn", "hidden", "hidden")
        b_in, b_hn = b.weight("b_in", "hidden"), b.weight("b_hn", "hidden")
        xn = ((x @ W_in).named("xn") + b_in).named("xn_b")
        hn = ((h @ W_hn).named("hn") + b_hn).named("hn_b")
        n = tanh((xn + (gates["r"] * hn).named("rhn")).named("an")).named("n")
    one_minus_z = (b.const(1.0, "one") - gates["z"]).named("one_minus_z")
    h_new = ((one_minus_z * n).named("zn") + (gates["z"] * h).named("zh")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


def gru_cho() -> Cell:
    b = CellBuilder("GRU (Cho)", "GRU of Cho et al. 2014: the reset gate multiplies h before U_n")
    x, h = b.input("x"), b.state("h")
    r = _gate(b, x, h, "r", sigmoid)
    z = _gate(b, x, h, "z", sigmoid)
    with b.group(GATE_NAMES["n"]):
        W_n, U_n, b_n = (b.weight("W_n", "input", "hidden"), b.weight("U_n", "hidden", "hidden"),
                         b.weight("b_n", "hidden"))
        rh = (r * h).named("rh")
        pre = ((x @ W_n).named("xn") + (rh @ U_n).named("hn")).named("an")
        n = tanh((pre + b_n).named("an_b")).named("n")
    one_minus_z = (b.const(1.0, "one") - z).named("one_minus_z")
    h_new = ((z * h).named("zh") + (one_minus_z * n).named("zn")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


def mgu() -> Cell:
    b = CellBuilder("MGU", "Minimal gated unit of Zhou et al. 2016")
    x, h = b.input("x"), b.state("h")
    f = _gate(b, x, h, "f", sigmoid)
    with b.group(GATE_NAMES["n"]):
        W_h, U_h, b_h = (b.weight("W_h", "input", "hidden"), b.weight("U_h", "hidden", "hidden"),
                         b.weight("b_h", "hidden"))
        fh = (f * h).named("fh")
        pre = ((x @ W_h).named("xh") + (fh @ U_h).named("hh")).named("ah")
        h_tilde = tanh((pre + b_h).named("ah_b")).named("h_tilde")
    one_minus_f = (b.const(1.0, "one") - f).named("one_minus_f")
    h_new = ((one_minus_f * h).named("keep") + (f * h_tilde).named("new")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


def indrnn() -> Cell:
    b = CellBuilder("IndRNN", "Independently recurrent network of Li et al. 2018: h = relu(W x + u * h + b)")
    x, h = b.input("x"), b.state("h")
    W, u, bias = b.weight("W", "input", "hidden"), b.weight("u", "hidden"), b.weight("b", "hidden")
    pre = ((x @ W).named("xw") + (u * h).named("uh")).named("a")
    h_new = relu((pre + bias).named("a_b")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


def elman() -> Cell:
    b = CellBuilder("Elman RNN", "Elman 1990, as torch.nn.RNN with tanh: h = tanh(W x + U h + b)")
    x, h = b.input("x"), b.state("h")
    W, U, bias = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("b", "hidden")
    pre = ((x @ W).named("xw") + (h @ U).named("hu")).named("a")
    h_new = tanh((pre + bias).named("a_b")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


def sru() -> Cell:
    b = CellBuilder("SRU", "Simple recurrent unit of Lei et al. 2017, Simple Recurrent Units for Highly "
                    "Parallelizable Recurrence, with v_f, v_r on c(t-1): no recurrent matmul, and the "
                    "highway term (1 - r) * x needs input size = hidden size")
    x, c = b.input("x"), b.state("c")
    x_tilde = (x @ b.weight("W", "input", "hidden")).named("x_tilde")
    one = b.const(1.0, "one")
    gates = {}
    for g in "fr":
        with b.group(GATE_NAMES[g]):
            W, v = b.weight(f"W_{g}", "input", "hidden"), b.weight(f"v_{g}", "hidden")
            pre = ((x @ W).named(f"x{g}") + (v * c).named(f"vc_{g}")).named(f"a{g}")
            gates[g] = sigmoid((pre + b.weight(f"b_{g}", "hidden")).named(f"a{g}_b")).named(g)
    f, r = gates["f"], gates["r"]
    c_new = ((f * c).named("fc") + ((one - f).named("one_minus_f") * x_tilde).named("fx")).named("c_new")
    h = ((r * c_new).named("rc") + ((one - r).named("one_minus_r") * x).named("highway")).named("h")
    b.update(c, c_new)
    b.output(h)
    return b.build()


def residual_lstm() -> Cell:
    b = CellBuilder("Residual LSTM", "LSTM with a residual connection around the layer, as between the "
                    "stacked layers of Wu et al. 2016 (GNMT): the output is h + x, while the recurrent state "
                    "h = o * tanh(c) has no residual; needs input size = hidden size")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    i, f, o = (_gate(b, x, h, g, sigmoid) for g in "ifo")
    g = _gate(b, x, h, "g", tanh)
    c_new = ((f * c).named("fc") + (i * g).named("ig")).named("c_new")
    h_new = (o * tanh(c_new).named("tc")).named("h_new")
    b.update(h, h_new)
    b.update(c, c_new)
    b.output((h_new + x).named("y"))
    return b.build()


def _preactivation(b: CellBuilder, x, h, name: str, group: str, out: str = ""):
    """x @ W_name + h @ U_name + b_name (named `out`, or a<name>_b), its nodes grouped under `group`."""
    with b.group(group):
        W, U = b.weight(f"W_{name}", "input", "hidden"), b.weight(f"U_{name}", "hidden", "hidden")
        pre = ((x @ W).named(f"x{name}") + (h @ U).named(f"h{name}")).named(f"a{name}")
        return (pre + b.weight(f"b_{name}", "hidden")).named(out or f"a{name}_b")


def slstm() -> Cell:
    b = CellBuilder("sLSTM", "Scalar-memory LSTM of xLSTM (Beck et al. 2024), one head: exponential input "
                    "gate, sigmoid forget gate, stabiliser state m and normaliser state n; all states start "
                    "at 0, so that the first step's n is its i' = exp(i~ - m), never 0")
    x, h, c, n, m = b.input("x"), b.state("h"), b.state("c"), b.state("n"), b.state("m")
    i_tilde = _preactivation(b, x, h, "i", "input gate", "i_tilde")  # log i: the input gate is exp(i~)
    f_tilde = _preactivation(b, x, h, "f", "forget gate", "f_tilde")
    z = tanh(_preactivation(b, x, h, "z", "cell input")).named("z")
    o = sigmoid(_preactivation(b, x, h, "o", "output gate")).named("o")
    with b.group("stabiliser"):
        # log sigmoid(f~) = -softplus(-f~), which never overflows
        log_f = (-softplus((-f_tilde).named("neg_f")).named("sp_f")).named("log_f")
        log_f_m = (log_f + m).named("log_f_m")
        m_new = apply("max", log_f_m, i_tilde).named("m_new")
        i_s = exp((i_tilde - m_new).named("i_m")).named("i_s")
        f_s = exp((log_f_m - m_new).named("f_m")).named("f_s")
    c_new = ((f_s * c).named("fc") + (i_s * z).named("iz")).named("c_new")
    n_new = ((f_s * n).named("fn") + i_s).named("n_new")
    h_new = (o * (c_new / n_new).named("h_tilde")).named("h_new")
    for state, value in ((h, h_new), (c, c_new), (n, n_new), (m, m_new)):
        b.update(state, value)
    b.output(h_new)
    return b.build()


def _mean_of_four(quarter, values: list, name: str):
    """The mean of four [batch, 1] values: a row's mean from the means of its four equal parts."""
    total = values[0]
    for k, v in enumerate(values[1:], 1):
        total = (total + v).named(f"{name}_sum{k}")
    return (total * quarter).named(name)


def _layer_norm_of_gates(b: CellBuilder, parts: dict, side: str, eps, quarter) -> dict:
    """The layer norm of the four gates' values as one row of 4 x hidden, as Ba et al. 2016 (and Haste)
    normalise x W and h U: the row's mean and variance from each gate's part of it, then per gate a gain
    alpha and a bias beta."""
    with b.group(f"layer norm of {side} W" if side == "x" else f"layer norm of {side} U"):
        mean = _mean_of_four(quarter, [row_mean(p).named(f"mean_{side}{g}") for g, p in parts.items()],
                             f"mu_{side}")
        centred = {g: (p - mean).named(f"d_{side}{g}") for g, p in parts.items()}
        var = _mean_of_four(quarter, [row_mean(square(d).named(f"sq_{side}{g}")).named(f"var_{side}{g}")
                                      for g, d in centred.items()], f"var_{side}")
        rstd = rsqrt((var + eps).named(f"var_eps_{side}")).named(f"rstd_{side}")
        out = {}
        for g, d in centred.items():
            scaled = ((d * rstd).named(f"nrm_{side}{g}") * b.weight(f"alpha_{side}_{g}", "hidden"))
            out[g] = (scaled.named(f"scaled_{side}{g}") + b.weight(f"beta_{side}_{g}", "hidden")).named(
                f"ln_{side}{g}")
        return out


def layernorm_lstm() -> Cell:
    b = CellBuilder("Layer-normalised LSTM", "LSTM with layer normalisation of Ba et al. 2016 (Haste's "
                    "LayerNormLSTM): x W and h U of the four gates each normalised as one row of 4 x hidden, "
                    "and the cell before its tanh, each with a gain alpha and a bias beta; variance over the "
                    "row (divided by its width), epsilon 1e-5")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    eps, quarter = b.const(1e-5, "eps"), b.const(0.25, "quarter")
    xw = {g: (x @ b.weight(f"W_{g}", "input", "hidden")).named(f"x{g}") for g in "ifog"}
    hu = {g: (h @ b.weight(f"U_{g}", "hidden", "hidden")).named(f"h{g}") for g in "ifog"}
    ln_x = _layer_norm_of_gates(b, xw, "x", eps, quarter)
    ln_h = _layer_norm_of_gates(b, hu, "h", eps, quarter)
    gates = {}
    for g in "ifog":
        with b.group(GATE_NAMES[g]):
            pre = ((ln_x[g] + ln_h[g]).named(f"a{g}") + b.weight(f"b_{g}", "hidden")).named(f"a{g}_b")
            gates[g] = (tanh if g == "g" else sigmoid)(pre).named(g)
    c_new = ((gates["f"] * c).named("fc") + (gates["i"] * gates["g"]).named("ig")).named("c_new")
    with b.group("layer norm of c"):
        mu_c = row_mean(c_new).named("mu_c")
        d_c = (c_new - mu_c).named("d_c")
        var_c = row_mean(square(d_c).named("sq_c")).named("var_c")
        rstd_c = rsqrt((var_c + eps).named("var_eps_c")).named("rstd_c")
        ln_c = (((d_c * rstd_c).named("nrm_c") * b.weight("alpha_c", "hidden")).named("scaled_c")
                + b.weight("beta_c", "hidden")).named("ln_c")
    h_new = (gates["o"] * tanh(ln_c).named("tc")).named("h_new")
    b.update(h, h_new)
    b.update(c, c_new)
    b.output(h_new)
    return b.build()


TEMPLATES: dict[str, Callable[[], Cell]] = {
    "lstm": lstm, "peephole_lstm": peephole_lstm, "cifg_lstm": cifg_lstm, "gru": gru,
    "gru_cho": gru_cho, "mgu": mgu, "indrnn": indrnn, "elman": elman, "sru": sru,
    "residual_lstm": residual_lstm, "slstm": slstm, "layernorm_lstm": layernorm_lstm,
}


def write_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for key, make in TEMPLATES.items():
        save_cell(make(), out / f"{key}.cell.json")


if __name__ == "__main__":
    write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
