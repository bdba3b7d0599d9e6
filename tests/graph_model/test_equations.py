"""The cell as equations: every template as a paper prints it, the conventions (primes, products,
precedence, which values are named), the terms that carry their nodes, and cells no paper would print
(broken, cyclic, very deep) that must still come out."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.mathtext import MathTextParser
from random_cells import random_cell
from tiers import slow_beyond

from cellfuse.graph_model import (
    OPS,
    Cell,
    CellBuilder,
    Node,
    OpSpec,
    analyze,
    equations,
    equations_latex,
    equations_text,
    load_template,
    template_names,
)
from cellfuse.graph_model import builder as builder_module
from cellfuse.graph_model.builder import sigmoid, tanh
from cellfuse.graph_model.equations import MAX_INLINE_DEPTH, name_tex, number_text
from cellfuse.graph_model.ops import OpKind

TEMPLATE_EQUATIONS = {
    "elman": """\
h' = tanh(x @ W + h @ U + b)
y  = h'
""",
    "lstm": """\
i  = sigmoid(x @ W_i + h @ U_i + b_i)
f  = sigmoid(x @ W_f + h @ U_f + b_f)
o  = sigmoid(x @ W_o + h @ U_o + b_o)
g  = tanh(x @ W_g + h @ U_g + b_g)
c' = f * c + i * g
h' = o * tanh(c')
y  = h'
""",
    "peephole_lstm": """\
i  = sigmoid(x @ W_i + h @ U_i + p_i * c + b_i)
f  = sigmoid(x @ W_f + h @ U_f + p_f * c + b_f)
g  = tanh(x @ W_g + h @ U_g + b_g)
c' = f * c + i * g
o  = sigmoid(x @ W_o + h @ U_o + p_o * c' + b_o)
h' = o * tanh(c')
y  = h'
""",
    "cifg_lstm": """\
i  = sigmoid(x @ W_i + h @ U_i + b_i)
o  = sigmoid(x @ W_o + h @ U_o + b_o)
g  = tanh(x @ W_g + h @ U_g + b_g)
c' = (1 - i) * c + i * g
h' = o * tanh(c')
y  = h'
""",
    # As torch.nn.GRU computes it: each bias added to its own product, the reset gate on h's whole term.
    "gru": """\
r  = sigmoid(x @ W_ir + b_ir + (h @ W_hr + b_hr))
z  = sigmoid(x @ W_iz + b_iz + (h @ W_hz + b_hz))
n  = tanh(x @ W_in + b_in + r * (h @ W_hn + b_hn))
h' = (1 - z) * n + z * h
y  = h'
""",
    "gru_cho": """\
r  = sigmoid(x @ W_r + h @ U_r + b_r)
z  = sigmoid(x @ W_z + h @ U_z + b_z)
n  = tanh(x @ W_n + (r * h) @ U_n + b_n)
h' = z * h + (1 - z) * n
y  = h'
""",
    "mgu": """\
f       = sigmoid(x @ W_f + h @ U_f + b_f)
h_tilde = tanh(x @ W_h + (f * h) @ U_h + b_h)
h'      = (1 - f) * h + f * h_tilde
y       = h'
""",
    "indrnn": """\
h' = relu(x @ W + u * h + b)
y  = h'
""",
    # No matmul of the state; the output is no state's update, so it is y, and x~ = x @ W is written out.
    "sru": """\
f  = sigmoid(x @ W_f + v_f * c + b_f)
r  = sigmoid(x @ W_r + v_r * c + b_r)
c' = f * c + (1 - f) * (x @ W)
y  = r * c' + (1 - r) * x
""",
    "residual_lstm": """\
i  = sigmoid(x @ W_i + h @ U_i + b_i)
f  = sigmoid(x @ W_f + h @ U_f + b_f)
o  = sigmoid(x @ W_o + h @ U_o + b_o)
g  = tanh(x @ W_g + h @ U_g + b_g)
c' = f * c + i * g
h' = o * tanh(c')
y  = h' + x
""",
    # log sigmoid(f~) written as -softplus(-f~); the stabiliser m and the normaliser n are states.
    "slstm": """\
i_tilde = x @ W_i + h @ U_i + b_i
z       = tanh(x @ W_z + h @ U_z + b_z)
o       = sigmoid(x @ W_o + h @ U_o + b_o)
sp_f    = softplus(-(x @ W_f + h @ U_f + b_f))
log_f_m = -sp_f + m
m'      = max(log_f_m, i_tilde)
i_s     = exp(i_tilde - m')
f_s     = exp(log_f_m - m')
c'      = f_s * c + i_s * z
n'      = f_s * n + i_s
h'      = o * (c' / n')
y       = h'
""",
    # The layer norm of x W (and of h U) over the four gates' values as one row: its mean and variance
    # from each gate's.
    "layernorm_lstm": "".join([
        'xi      = x @ W_i\n',
        'xf      = x @ W_f\n',
        'xo      = x @ W_o\n',
        'xg      = x @ W_g\n',
        'hi      = h @ U_i\n',
        'hf      = h @ U_f\n',
        'ho      = h @ U_o\n',
        'hg      = h @ U_g\n',
        'mean_xi = row_mean(xi)\n',
        'mean_xf = row_mean(xf)\n',
        'mean_xo = row_mean(xo)\n',
        'mean_xg = row_mean(xg)\n',
        'mu_x    = (mean_xi + mean_xf + mean_xo + mean_xg) * 0.25\n',
        'd_xi    = xi - mu_x\n',
        'd_xf    = xf - mu_x\n',
        'd_xo    = xo - mu_x\n',
        'd_xg    = xg - mu_x\n',
        'rstd_x  = rsqrt((row_mean(square(d_xi)) + row_mean(square(d_xf)) +'
        ' row_mean(square(d_xo)) + row_mean(square(d_xg))) * 0.25 + 1e-05)\n',
        'mean_hi = row_mean(hi)\n',
        'mean_hf = row_mean(hf)\n',
        'mean_ho = row_mean(ho)\n',
        'mean_hg = row_mean(hg)\n',
        'mu_h    = (mean_hi + mean_hf + mean_ho + mean_hg) * 0.25\n',
        'd_hi    = hi - mu_h\n',
        'd_hf    = hf - mu_h\n',
        'd_ho    = ho - mu_h\n',
        'd_hg    = hg - mu_h\n',
        'rstd_h  = rsqrt((row_mean(square(d_hi)) + row_mean(square(d_hf)) +'
        ' row_mean(square(d_ho)) + row_mean(square(d_hg))) * 0.25 + 1e-05)\n',
        "c'      = sigmoid(d_xf * rstd_x * alpha_x_f + beta_x_f + (d_hf * rstd_h * alpha_h_f +"
        ' beta_h_f) + b_f) * c + sigmoid(d_xi * rstd_x * alpha_x_i + beta_x_i + (d_hi * rstd_h *'
        ' alpha_h_i + beta_h_i) + b_i) * tanh(d_xg * rstd_x * alpha_x_g + beta_x_g + (d_hg *'
        ' rstd_h * alpha_h_g + beta_h_g) + b_g)\n',
        "d_c     = c' - row_mean(c')\n",
        "h'      = sigmoid(d_xo * rstd_x * alpha_x_o + beta_x_o + (d_ho * rstd_h * alpha_h_o +"
        ' beta_h_o) + b_o) * tanh(d_c * rsqrt(row_mean(square(d_c)) + 1e-05) * alpha_c + beta_c)\n',
        "y       = h'\n",
    ]),
}

LSTM_LATEX = r"""\begin{align*}
  i &= \sigma(x \, W_i + h \, U_i + b_i) \\
  f &= \sigma(x \, W_f + h \, U_f + b_f) \\
  o &= \sigma(x \, W_o + h \, U_o + b_o) \\
  g &= \tanh(x \, W_g + h \, U_g + b_g) \\
  c' &= f \odot c + i \odot g \\
  h' &= o \odot \tanh(c') \\
  y &= h'
\end{align*}
"""


def test_every_template_has_its_equations_here():
    assert sorted(TEMPLATE_EQUATIONS) == template_names()


@pytest.mark.parametrize("name", sorted(TEMPLATE_EQUATIONS))
def test_the_equations_of_a_template(name):
    assert equations_text(load_template(name)) == TEMPLATE_EQUATIONS[name]


def test_the_lstm_in_latex():
    assert equations_latex(load_template("lstm")) == LSTM_LATEX


@pytest.mark.parametrize("name", sorted(TEMPLATE_EQUATIONS))
def test_mathtext_draws_every_equation(name):
    parser = MathTextParser("path")
    for eq in equations(load_template(name)):
        parser.parse(eq.mathtext, dpi=72)


def test_the_kinds_of_equations():
    eqs = equations(load_template("lstm"))
    assert [(e.kind, e.name) for e in eqs] == [("value", "i"), ("value", "f"), ("value", "o"),
                                               ("value", "g"), ("update", "c'"), ("update", "h'"),
                                               ("output", "y")]
    assert eqs[-1].text == "y = h'" and eqs[-1].lhs.nodes == ("h_new",)


# -- terms and their nodes ----------------------------------------------------------------------------

def test_each_term_carries_the_nodes_it_stands_for():
    f = equations(load_template("lstm"))[1]
    terms = {t.text: t.nodes for t in f.terms}
    assert terms["f"] == ("f",)
    assert set(terms["x @ W_f"]) == {"xf", "x", "W_f"}
    assert set(terms["h @ U_f"]) == {"hf", "h", "U_f"}
    assert terms["b_f"] == ("b_f",)
    assert [t.nodes for t in f.terms if t.text == " + "] == [("af",), ("af_b",)]
    # the function's head and its closing parenthesis stand for the whole of what it is applied to
    assert set(terms["sigmoid("]) == {"f", "af_b", "af", "xf", "hf", "x", "h", "W_f", "U_f", "b_f"}
    assert terms[")"] == terms["sigmoid("]
    c = equations(load_template("lstm"))[4]
    assert [(t.text, set(t.nodes)) for t in c.rhs] == [("f * c", {"fc", "f", "c"}), (" + ", {"c_new"}),
                                                       ("i * g", {"ig", "i", "g"})]


def test_parentheses_stand_for_what_they_hold():
    h = equations(load_template("gru"))[3]
    opening = next(t for t in h.rhs if t.text == "(")
    assert set(opening.nodes) == {"one_minus_z", "one", "z"}


@pytest.mark.parametrize("name", sorted(TEMPLATE_EQUATIONS))
def test_the_terms_cover_every_node_the_cell_computes_with(name):
    cell = load_template(name)
    covered = {n for eq in equations(cell) for n in eq.nodes}
    assert covered == set(analyze(cell).order)


@pytest.mark.parametrize("seed", slow_beyond(range(40), 10))
def test_the_terms_of_random_cells_cover_their_nodes(seed):
    """Every node an update or the output uses, and every node that a value nothing uses is computed
    from, stands in some term: all but a state whose old value nothing reads."""
    cell = random_cell(seed)
    eqs = equations(cell)
    nodes = cell.by_id()
    consumed = {a for n in cell.nodes for a in n.args}
    roots = [*cell.updates.values(), cell.output]
    roots += [n.id for n in cell.nodes if n.args and n.id not in consumed]
    shown: set[str] = set()
    while roots:
        nid = roots.pop()
        if nid not in shown:
            shown.add(nid)
            roots.extend(nodes[nid].args)
    assert {n for eq in eqs for n in eq.nodes} == shown
    parser = MathTextParser("path")
    for eq in eqs:
        parser.parse(eq.mathtext, dpi=72)


# -- conventions ------------------------------------------------------------------------------------

def build(body, states=("h",)) -> Cell:
    """A cell whose one state's update is body(builder, x, states...); x [batch, hidden] so that every
    value may meet every other."""
    b = CellBuilder("t", input=4, hidden=4)
    x = b.input("x")
    ss = [b.state(s) for s in states]
    value = body(b, x, *ss)
    for s in ss:
        b.update(s, value)
    b.output(value)
    return b.cell


def rhs(cell: Cell, name: str = "h'") -> str:
    eq = next(e for e in equations(cell) if e.name == name)
    return "".join(t.text for t in eq.rhs)


@pytest.mark.parametrize("body, text", [
    (lambda b, x, h: h - (h - h * 2), "h - (h - h * 2)"),
    (lambda b, x, h: (h - h) - h, "h - h - h"),
    (lambda b, x, h: -(h + 1), "-(h + 1)"),
    (lambda b, x, h: -builder_module.apply("neg", h), "-(-h)"),
    (lambda b, x, h: h * -1, "h * -1"),
    (lambda b, x, h: h / (h * h), "h / (h * h)"),
    (lambda b, x, h: (h / h) * h, "(h / h) * h"),
    (lambda b, x, h: h * h * h, "h * h * h"),
    (lambda b, x, h: h + h * h, "h + h * h"),
    (lambda b, x, h: (h + h) * h, "(h + h) * h"),
    (lambda b, x, h: 0.5 * h + 1e-8, "0.5 * h + 1e-08"),
])
def test_operators_and_parentheses(body, text):
    assert rhs(build(body)) == text


def test_a_matmul_of_a_product_keeps_its_parentheses():
    def body(b, x, h):
        return tanh((sigmoid(x @ b.weight("W", "hidden", "hidden")) * h) @ b.weight("U", "hidden", "hidden"))

    assert rhs(build(body)) == "tanh((sigmoid(x @ W) * h) @ U)"


def test_a_value_used_twice_is_named():
    def body(b, x, h):
        a = (x @ b.weight("W", "input", "hidden")).named("a")
        return a * a

    cell = build(body)
    assert equations_text(cell) == "a  = x @ W\nh' = a * a\ny  = h'\n"


def test_a_gate_with_the_id_of_its_op_is_written_out():
    """A node nobody named (the builder calls it after its op) is no gate of a paper."""
    def body(b, x, h):
        return tanh(h) * sigmoid(x @ b.weight("W", "input", "hidden"))

    assert equations_text(build(body)) == "h' = tanh(h) * sigmoid(x @ W)\ny  = h'\n"


def test_an_update_shared_by_two_states_and_an_update_to_a_source():
    b = CellBuilder("t", input=4, hidden=4)
    x, h, c, m = b.input("x"), b.state("h"), b.state("c"), b.state("m")
    new = tanh(x @ b.weight("W", "input", "hidden") + h).named("new")
    b.update(h, new)
    b.update(c, new)
    b.update(m, c)  # m takes c's old value
    b.output(new)
    assert equations_text(b.build()) == "h' = tanh(x @ W + h)\nc' = h'\nm' = c\ny  = h'\n"


def test_an_output_that_is_no_update_is_written_out():
    b = CellBuilder("t", input=4, hidden=4)
    x, h = b.input("x"), b.state("h")
    new = tanh(x @ b.weight("W", "input", "hidden") + h).named("new")
    b.update(h, new)
    b.output(sigmoid(new) * 2)
    assert equations_text(b.build()) == "h' = tanh(x @ W + h)\ny  = sigmoid(h') * 2\n"


def test_ops_added_to_the_table_are_written_as_functions(monkeypatch):
    monkeypatch.setitem(OPS, "sinh", OpSpec("sinh", 1, OpKind.ELEMENTWISE, "sinh(a)", ("a",), np.sinh))
    monkeypatch.setitem(OPS, "hypot", OpSpec("hypot", 2, OpKind.ELEMENTWISE, "hypot(a, b)", ("a", "b"),
                                             np.hypot))
    cell = build(lambda b, x, h: builder_module.apply("hypot", builder_module.apply("sinh", h), 2))
    eq = equations(cell)[0]
    assert eq.text == "h' = hypot(sinh(h), 2)"
    assert eq.tex == r"h' = \operatorname{hypot}(\operatorname{sinh}(h), 2)"
    assert [t.text for t in eq.rhs] == ["hypot(", "sinh(", "h", ")", ", ", "2", ")"]


@pytest.mark.parametrize("name, tex", [
    ("x", "x"), ("W_f", "W_f"), ("W_ir", "W_{ir}"), ("b0", "b_0"), ("W1_f", "W_{1,f}"),
    ("h_tilde", r"\tilde{h}"), ("c_hat", r"\hat{c}"), ("alpha", r"\alpha"), ("h_new", r"h_{\mathrm{new}}"),
    ("keep", r"\mathrm{keep}"), ("one_minus_z", r"\mathrm{one\_minus\_z}"), ("h'", "h'"),
    ("W_a_b", "W_{a,b}"),
])
def test_names_in_latex(name, tex):
    assert name_tex(name) == tex


@pytest.mark.parametrize("value, text", [(1.0, "1"), (-2.0, "-2"), (0.5, "0.5"), (1e-8, "1e-08"),
                                         (0.1, "0.1"), (1e20, "1e+20"), (None, "?")])
def test_numbers(value, text):
    assert number_text(value) == text


# -- cells no paper would print ----------------------------------------------------------------------

def test_a_value_nothing_uses_has_its_equation():
    cell = load_template("elman")
    cell.add(Node("spare", "sigmoid", ["a"]))
    cell.add(Node("spare2", "neg", ["spare"]))
    eqs = equations(cell)
    assert [(e.kind, e.text) for e in eqs] == [("value", "a = x @ W + h @ U"), ("update", "h' = tanh(a + b)"),
                                               ("unused", "spare2 = -sigmoid(a)"), ("output", "y = h'")]


def test_a_half_drawn_cell():
    cell = Cell("t", nodes=[Node("x", "input"), Node("h", "state"), Node("a", "add", ["x", ""]),
                            Node("t", "tanh", ["a"]), Node("u", "mul", ["t", "gone"])],
                updates={"h": "u"}, output=None)
    assert equations_text(cell) == "h' = tanh(x + ?) * ?\n"


def test_a_cycle_is_cut_by_a_name():
    cell = Cell("t", nodes=[Node("x", "input"), Node("h", "state"), Node("a", "add", ["x", "b"]),
                            Node("b", "tanh", ["a"])], updates={"h": "b"}, output="b")
    assert equations_text(cell) == "h' = tanh(x + h')\ny  = h'\n"


def test_unknown_ops_and_duplicate_ids_come_out():
    cell = Cell("t", nodes=[Node("x", "input"), Node("h", "state"), Node("a", "frob", ["x", "h"]),
                            Node("a", "tanh", ["x"]), Node("n", "neg", ["x", "h"])],
                updates={"h": "a"}, output="n")
    assert equations_text(cell) == "h' = frob(x, h)\ny  = neg(x, h)\n"


def test_odd_ids_of_a_broken_file_still_draw():
    cell = Cell("t", nodes=[Node("x", "input"), Node("h$\\{", "state"), Node("a}", "tanh", ["h$\\{"])],
                updates={"h$\\{": "a}"}, output="a}")
    parser = MathTextParser("path")
    for eq in equations(cell):
        parser.parse(eq.mathtext, dpi=72)


def test_the_equations_of_an_empty_cell():
    assert equations(Cell("t")) == []
    assert equations_text(Cell("t")) == ""


def test_a_very_long_chain_is_cut_into_equations():
    n = 5000
    nodes = [Node("x", "input"), Node("h", "state"), Node("v0", "tanh", ["h"])]
    nodes += [Node(f"v{i}", "tanh", [f"v{i - 1}"]) for i in range(1, n)]
    cell = Cell("t", nodes=nodes, updates={"h": f"v{n - 1}"}, output=f"v{n - 1}")
    eqs = equations(cell)
    assert len(eqs) > n // (MAX_INLINE_DEPTH + 1)
    assert all(eq.text.count("tanh(") <= MAX_INLINE_DEPTH + 1 for eq in eqs)
    assert {node for eq in eqs for node in eq.nodes} == {n.id for n in nodes if n.op != "input"}
