"""Writes the built-in templates (cellfuse/resources/templates/*.cell.json) with the cell builder.

Run from the project root after changing a template:  python scripts/make_templates.py
The tests check that the shipped files are what this script writes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from cellfuse.graph_model import Cell, CellBuilder, relu, save_cell, sigmoid, tanh

OUT = Path(__file__).resolve().parent.parent / "cellfuse" / "resources" / "templates"


def _gate(b: CellBuilder, x, h, name: str, act, extra=None):
    """act(x @ W_name + h @ U_name [+ extra] + b_name), its nodes named after the gate."""
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
        W, U = b.weight(f"W_i{g}", "input", "hidden"), b.weight(f"W_h{g}", "hidden", "hidden")
        bi, bh = b.weight(f"b_i{g}", "hidden"), b.weight(f"b_h{g}", "hidden")
        xg = ((x @ W).named(f"x{g}") + bi).named(f"x{g}_b")
        hg = ((h @ U).named(f"h{g}") + bh).named(f"h{g}_b")
        gates[g] = sigmoid((xg + hg).named(f"a{g}")).named(g)
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


TEMPLATES: dict[str, Callable[[], Cell]] = {
    "lstm": lstm, "peephole_lstm": peephole_lstm, "cifg_lstm": cifg_lstm, "gru": gru,
    "gru_cho": gru_cho, "mgu": mgu, "indrnn": indrnn, "elman": elman, "sru": sru,
    "residual_lstm": residual_lstm,
}


def write_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for key, make in TEMPLATES.items():
        save_cell(make(), out / f"{key}.cell.json")


if __name__ == "__main__":
    write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
