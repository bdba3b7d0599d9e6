"""Formulas typed into a cell: what they add, what names become, the round trip from equations to
formulas and back, and every malformed or hostile formula refused with its column, changing nothing."""

from __future__ import annotations

import numpy as np
import pytest
from random_cells import random_cell

from cellfuse.graph_model import (
    OPS,
    Cell,
    CellBuilder,
    CellError,
    FormulaError,
    Node,
    OpSpec,
    analyze,
    apply_formula,
    equations,
    equations_text,
    init_params,
    load_template,
    plan_formula,
    require_valid,
    run_reference,
    template_names,
)
from cellfuse.graph_model.ops import OpKind

INPUT, HIDDEN = 3, 4


def empty_cell() -> Cell:
    """What the editor's New Cell holds: the input alone."""
    return Cell("typed", nodes=[Node("x", "input")], sizes={"input": INPUT, "hidden": HIDDEN})


def run(cell: Cell, params: dict[str, np.ndarray], seed: int = 0, width: int = INPUT):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((5, 2, width))}
    for s in sorted(cell.updates):
        inputs[s] = rng.standard_normal((1, 2, HIDDEN))
    return run_reference(cell, params, inputs, layers=1)


def test_the_three_formulas_of_an_elman_rnn():
    cell = empty_cell()
    for formula in ["pre = x @ W_x + h @ W_h + bias", "h' = tanh(pre)", "y = h'"]:
        apply_formula(cell, formula)
    require_valid(cell)
    weights = {n.id: n.shape for n in cell.of_op("weight")}
    assert weights == {"W_x": ["input", "hidden"], "W_h": ["hidden", "hidden"], "bias": ["hidden"]}
    assert [n.id for n in cell.of_op("state")] == ["h"] and cell.updates == {"h": "h_new"}
    assert cell.output == "h_new" and cell.node("h_new").op == "tanh"

    elman = load_template("elman")
    params = init_params(elman, 1, INPUT, HIDDEN, seed=1)
    renamed = {"l0.W_x": params["l0.W"], "l0.W_h": params["l0.U"], "l0.bias": params["l0.b"]}
    expected, got = run(elman, params), run(cell, renamed)
    np.testing.assert_array_equal(got.y, expected.y)
    np.testing.assert_array_equal(got.final["h"], expected.final["h"])


def test_a_formula_may_tie_the_input_width_to_the_hidden_width():
    """As validation allows: x + h is hidden-wide, and the cell runs where the two sizes are equal."""
    cell = load_template("elman")
    apply_formula(cell, "y = h' + x")
    info = analyze(cell)
    assert info.ok and info.shapes[cell.output] == ("B", "hidden")
    assert [(t.node, t.reason) for t in info.ties] == [(cell.output, "adds 'x' [batch, input] to 'h_new' "
                                                                     "[batch, hidden]")]


@pytest.mark.parametrize("name", template_names())
def test_the_equations_of_a_template_typed_back(name):
    """Each line of `cellfuse show` is a formula: typed into an empty cell, they make the template again."""
    template = load_template(name)
    cell = empty_cell()
    for s in template.updates:  # a state read only elementwise (peepholes) must be declared
        apply_formula(cell, f"{s} = state()")
    for eq in equations(template):
        apply_formula(cell, eq.text)
    require_valid(cell)
    assert equations_text(cell) == equations_text(template)
    width = HIDDEN if analyze(template).ties else INPUT  # a cell that ties the widths runs only where equal
    params = init_params(template, 1, width, HIDDEN, seed=2)
    expected, got = run(template, params, width=width), run(cell, params, width=width)
    np.testing.assert_array_equal(got.y, expected.y)
    for s in template.updates:
        np.testing.assert_array_equal(got.final[s], expected.final[s])


def test_random_cells_typed_back_compute_the_same():
    """Where the rules can tell what every name is (a weight only ever beside other weights and numbers
    cannot be told, and a matmul's weight is taken as [K, hidden]), the equations typed back compute the
    cell again."""
    compared = 0
    for seed in range(100):
        template = random_cell(seed)
        if any(len(w.shape or ()) == 2 and w.shape[1] != "hidden" for w in template.of_op("weight")):
            continue  # a matmul into the input's width
        cell = empty_cell()
        try:
            for s in template.updates:
                apply_formula(cell, f"{s} = state()")
            for eq in equations(template):
                apply_formula(cell, eq.text)
        except FormulaError as e:
            assert "no other operand" in e.reason or "nothing beside it" in e.reason, (seed, e)
            continue
        require_valid(cell)
        params = init_params(template, 1, INPUT, HIDDEN, seed=seed)
        live = {f"l0.{w.id}" for w in cell.of_op("weight")}
        expected = run(template, params, seed)
        got = run(cell, {k: v for k, v in params.items() if k in live}, seed)
        np.testing.assert_array_equal(got.y, expected.y, err_msg=f"seed {seed}")
        compared += 1
    assert compared >= 20


def test_a_formula_into_a_builder():
    b = CellBuilder("Typed", input=INPUT, hidden=HIDDEN)
    b.input("x")
    apply_formula(b, "h' = relu(x @ W + u * h + b)")
    apply_formula(b, "y = h'")
    cell = b.build()
    assert {n.id: n.shape for n in cell.of_op("weight")} == {"W": ["input", "hidden"], "u": ["hidden"],
                                                              "b": ["hidden"]}
    assert equations_text(cell) == equations_text(load_template("indrnn"))


# -- what the left side sets and what names become ---------------------------------------------------

def test_a_new_name_is_the_new_value():
    cell = load_template("elman")
    edit = apply_formula(cell, "g = sigmoid(x @ W_g + h @ U_g + b_g)")
    assert edit.target == "g" and edit.nodes[-1].id == "g" and cell.node("g").op == "sigmoid"
    assert [n.id for n in edit.nodes] == ["W_g", "matmul", "U_g", "matmul1", "add", "b_g", "add1", "g"]
    assert "added 8 nodes" in edit.describe()


def test_an_assignment_to_a_state_sets_its_update():
    cell = load_template("elman")
    edit = apply_formula(cell, "h = tanh(h)")
    assert edit.updates == {"h": "h_new1"} and cell.updates["h"] == "h_new1"
    assert cell.node("h_new1").args == ["h"]


def test_a_prime_reads_the_next_value():
    cell = load_template("lstm")
    apply_formula(cell, "y = h' + c'")
    assert cell.node(cell.output).args == ["h_new", "c_new"]


def test_a_declared_state_and_a_bias_of_the_inputs_width():
    cell = empty_cell()
    apply_formula(cell, "m = state()")
    assert cell.node("m").op == "state"
    apply_formula(cell, "s = tanh(x + b_x)")
    assert cell.node("b_x").shape == ["input"]


def test_the_input_is_added_where_there_is_none():
    cell = Cell("bare", sizes={"input": INPUT, "hidden": HIDDEN})
    apply_formula(cell, "h' = tanh(x @ W + h @ U)")
    apply_formula(cell, "y = h'")
    require_valid(cell)
    assert cell.node("x").op == "input"


def test_an_input_of_another_id_is_x():
    cell = Cell("t", nodes=[Node("inp", "input")], sizes={"input": INPUT, "hidden": HIDDEN})
    apply_formula(cell, "h' = tanh(x @ W)")
    assert cell.node("matmul").args == ["inp", "W"]


def test_a_name_read_before_it_is_made_a_weight_is_that_weight():
    cell = load_template("elman")
    edit = apply_formula(cell, "q = c0 * (h + c0)")
    assert [n.id for n in edit.nodes] == ["c0", "add", "q"] and cell.node("q").args == ["c0", "add"]


def test_numbers_are_constants():
    cell = load_template("elman")
    apply_formula(cell, "k = -0.5 * h - 2")
    consts = [n.value for n in cell.of_op("const")]
    assert consts == [-0.5, 2.0]


def test_a_function_added_to_the_op_table_can_be_typed(monkeypatch):
    monkeypatch.setitem(OPS, "sinh", OpSpec("sinh", 1, OpKind.ELEMENTWISE, "sinh(a)", ("a",), np.sinh))
    cell = load_template("elman")
    apply_formula(cell, "s = sinh(h)")
    assert cell.node("s").op == "sinh"


def test_planning_changes_nothing():
    cell = load_template("lstm")
    before = cell.to_json()
    edit = plan_formula(cell, "q = sigmoid(x @ W_q + h @ U_q + b_q)")
    assert cell.to_json() == before and len(edit.nodes) == 8


# -- formulas refused --------------------------------------------------------------------------------

# (formula, the column of the error counted from 1, words of the message)
BAD = [
    ("f = sigmoid(x @", 12, ["never closed"]),
    ("f = x @ W +* 2", 12, ["invalid syntax", "NAME = expression"]),
    ("import os", 1, ["imports", "NAME = expression"]),
    ("__import__('os')", 1, ["give the value a name"]),
    ("f = __import__('os')", 5, ["'__import__' is not a function", "sigmoid()"]),
    ("f = eval('1')", 5, ["'eval' is not a function"]),
    ("f = exec('import os')", 5, ["'exec' is not a function"]),
    ("f = frobnicate(h)", 5, ["'frobnicate' is not a function"]),
    ("f = h.T", 5, ["attribute access"]),
    ("f = os.system('ls')", 5, ["attribute access"]),
    ("f = h[0]", 5, ["subscripts"]),
    ("f = lambda: h", 5, ["lambda"]),
    ("f = (lambda: h)()", 6, ["only the op table's functions"]),
    ("f = 'h'", 5, ["strings"]),
    ("f = h if h else x", 5, ["'if ... else'"]),
    ("f = [h]", 5, ["lists"]),
    ("f = h < 1", 5, ["comparisons"]),
    ("f = (g := h)", 6, ["':='"]),
    ("f = tanh(h, h)", 5, ["'tanh' takes 1 arg, got 2"]),
    ("f = tanh(a=h)", 12, ["by position"]),
    ("f = tanh", 5, ["'tanh' is a function"]),
    ("f = add(h, h)", 5, ["not a function", "use the operator +"]),
    ("f = h ** 2", 5, ["'**' is no binary operator"]),
    ("f = ~h", 5, ["'~' is no unary operator"]),
    ("f = True", 5, ["the constant True"]),
    ("f = 1e999", 5, ["1e999", "finite"]),
    ("f = h; g = h", 8, ["one formula at a time"]),
    ("f = h\ng = h", 6, ["one formula at a time"]),
    ("f = h\x00", 6, ["control character"]),
    ("f += h", 1, ["'+='"]),
    ("a, b = h, h", 1, ["tuples"]),
    ("f = g = h", 5, ["one name on the left"]),
    ("h @ U", 1, ["give the value a name"]),
    ("", 1, ["empty"]),
    ("   ", 1, ["empty"]),
    ("a = tanh(h)", 1, ["the cell has a node 'a'", "rename or delete"]),
    ("x = tanh(h)", 1, ["the cell has a node 'x'"]),
    ("é = tanh(h)", 1, ["not a valid id"]),
    ("f = W", 5, ["computes nothing"]),
    ("f = a_b", 5, ["computes nothing"]),
    ("f = sigmoid(q)", 13, ["unknown name 'q'", "NAME = state()"]),
    ("f = q * r", 5, ["unknown name 'q'"]),
    ("f = x + b", 5, ["'add' of 'x' [batch, input] and 'b' [hidden]"]),
    ("f = W @ h", 5, ["left operand of @"]),
    ("f = h @ b", 9, ["2-D weight"]),
    ("f = h @ W", 5, ["first dim must be hidden"]),
    ("f = W + h", 5, ["2-D weight", "right operand of @"]),
    ("y = x", 5, ["the output must be [batch, hidden]"]),
    ("h' = 1", 6, ["the update of 'h' must be [batch, hidden]"]),
    ("W' = h", 1, ["'W' is a 'weight' node, not a state"]),
    ("x' = h", 1, ["'x' is a 'input' node, not a state"]),
    ("h'' = h", 1, ["one prime"]),
    ("f = k' + h", 5, ["no state 'k'"]),
    ("  f = sigmoid(x @ @)", 19, ["invalid syntax"]),
    ("h = state()", 1, ["the cell has a node 'h'"]),
    ("w = weight()", 5, ["'weight()' cannot be typed"]),
    ("s = state(1)", 5, ["takes no args"]),
    ("f = " + "(" * 300 + "h" + ")" * 300, 1, []),
    ("f = " + "h+" * 990 + "h", 1, ["nests too deeply"]),
]


@pytest.mark.parametrize("formula, column, words", BAD, ids=[b[0][:40] for b in BAD])
def test_a_bad_formula_says_where_and_changes_nothing(formula, column, words):
    cell = load_template("elman")
    before = cell.to_json()
    with pytest.raises(FormulaError) as e:
        apply_formula(cell, formula)
    assert cell.to_json() == before
    if words:
        assert e.value.column == column - 1, str(e.value)
        assert str(e.value).startswith(f"column {column}: ")
    for w in words:
        assert w in str(e.value), str(e.value)
    assert isinstance(e.value, CellError)
    assert e.value.pointed().splitlines()[-1] == " " * e.value.column + "^"


def test_a_formula_that_is_too_long():
    with pytest.raises(FormulaError, match="at most"):
        apply_formula(load_template("elman"), "f = " + "h + " * 1000 + "h")


def test_columns_count_characters_not_bytes():
    cell = load_template("elman")
    with pytest.raises(FormulaError) as e:
        apply_formula(cell, "f = tanh(h) + ü + h.T")
    assert e.value.column == len("f = tanh(h) + ")
    with pytest.raises(FormulaError) as e:
        apply_formula(cell, "f = tanh(h) + h.T  # ü")
    assert e.value.column == len("f = tanh(h) + ")
    with pytest.raises(FormulaError) as e:
        apply_formula(cell, "f = 'ü' + h.T")
    assert e.value.column == len("f = ")


def test_a_long_sum_is_fine():
    cell = load_template("elman")
    apply_formula(cell, "f = " + " + ".join(["h"] * 200))
    assert sum(n.op == "add" for n in cell.nodes) == 2 + 199


def test_a_row_reduction_typed_in_a_formula():
    """A layer norm as formulas: row_mean of a [batch, hidden] value is [batch, 1], and a gain beside the
    normalised value is a weight [hidden]."""
    cell = load_template("elman")
    apply_formula(cell, "d = h' - row_mean(h')")
    apply_formula(cell, "y = d * rsqrt(row_mean(square(d)) + 0.00001) * gain + bias")
    info = analyze(cell)
    assert info.ok, [str(p) for p in info.problems]
    assert info.shapes["row_mean"] == ("B", "1") and info.shapes[cell.output] == ("B", "hidden")
    weights = {n.id: n.shape for n in cell.of_op("weight")}
    assert weights["gain"] == weights["bias"] == ["hidden"]
    params = init_params(cell, 1, INPUT, HIDDEN, seed=2)
    elman = {k: v for k, v in params.items() if k in ("l0.W", "l0.U", "l0.b")}
    y, h = run(cell, params).y, run(load_template("elman"), elman).y
    d = h - h.mean(axis=-1, keepdims=True)
    norm = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5) * params["l0.gain"] + params["l0.bias"]
    np.testing.assert_allclose(y, norm, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("formula, column, words", [
    ("m = row_mean(x)", 13, "'row_mean' reduces a [batch, hidden] value; 'x' is [batch, input]"),
    ("m = row_sum(q)", 12, "unknown name 'q'"),
    ("m = row_mean(h_new) * g", 22, "unknown name 'g'"),
    ("m = row_mean(h_new) @ U", 4, "the left operand of @ must be a [batch, D] value"),
])
def test_a_row_reduction_that_cannot_be_typed(formula, column, words):
    cell = load_template("elman")
    with pytest.raises(FormulaError) as e:
        apply_formula(cell, formula)
    assert e.value.column == column and words in e.value.reason, (e.value.column, e.value.reason)
