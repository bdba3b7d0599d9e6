"""Validation and shape inference: one test per kind of bad cell, each checking that the problem
names the node at fault (and the shapes, where shapes are the problem)."""

from __future__ import annotations

import math

import pytest
from random_cells import random_cell

from cellfuse.graph_model import CellError, Node, analyze, require_valid, shape_str

B_HIDDEN = "[batch, hidden]"


def errors_of(cell):
    info = analyze(cell)
    return info.errors


def only_error(cell):
    errs = errors_of(cell)
    assert len(errs) == 1, [str(e) for e in errs]
    return errs[0]


def replace(nodes, nid, *spec):
    """The nodes with node `nid` replaced by `spec` (a compact tuple's fields, or one Node)."""
    new = spec[0] if len(spec) == 1 and isinstance(spec[0], Node) else spec
    return [new if n[0] == nid else n for n in nodes]


def test_the_base_cell_is_valid(make_cell):
    info = analyze(make_cell())
    assert info.ok and info.problems == []
    assert info.shapes["x"] == ("B", "input")
    assert info.shapes["h"] == info.shapes["xw"] == info.shapes["h_new"] == ("B", "hidden")
    assert info.shapes["W"] == ("input", "hidden") and info.shapes["b"] == ("hidden",)
    assert set(info.order) == {n.id for n in make_cell().nodes}
    pos = {nid: i for i, nid in enumerate(info.order)}
    for n in make_cell().nodes:
        for a in n.args:
            assert pos[a] < pos[n.id], f"{a} must come before {n.id}"
    assert info.dead == set()


def test_broadcasting_rows_and_scalars(make_cell, elman_nodes_list):
    nodes = elman_nodes_list + [
        ("half", "const", None, None, 0.5),
        ("p", "weight", None, ["hidden"]),
        ("pp", "mul", ["p", "p"]),          # [hidden] * [hidden]
        ("sp", "mul", ["half", "pp"]),      # [] * [hidden]
        ("s", "add", ["h_new", "sp"]),      # [B, hidden] + [hidden]
        ("s2", "sub", ["half", "s"]),       # [] - [B, hidden]
    ]
    info = analyze(make_cell(nodes, updates={"h": "s2"}, output="s2"))
    assert info.ok, [str(p) for p in info.problems]
    assert info.shapes["pp"] == ("hidden",) and info.shapes["sp"] == ("hidden",)
    assert info.shapes["half"] == ()
    assert info.shapes["s"] == info.shapes["s2"] == ("B", "hidden")


def test_unknown_op(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "a_b", "a_b", "addd", ["a", "b"])))
    assert p.node == "a_b"
    assert "'a_b'" in str(p) and "unknown op 'addd'" in p.message


def test_too_many_args(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "h_new", "h_new", "tanh", ["a_b", "a"])))
    assert p.node == "h_new" and "'h_new'" in str(p)
    assert "takes 1 arg (a)" in p.message and "got 2" in p.message


@pytest.mark.parametrize("args, ports", [(["a"], "port b of 'a_b' is not connected"),
                                         (["", "b"], "port a of 'a_b' is not connected"),
                                         ([], "ports a and b of 'a_b' are not connected"),
                                         (["", ""], "ports a and b of 'a_b' are not connected")])
def test_an_unconnected_port_is_named_as_on_the_canvas(make_cell, elman_nodes_list, args, ports):
    # The editor reads a port with no wire as the empty id, so that the ports after it keep their place.
    errs = errors_of(make_cell(replace(elman_nodes_list, "a_b", "a_b", "add", args)))
    assert [(e.node, e.message) for e in errs if e.node == "a_b"] == [("a_b", ports)]


def test_wrong_arity_of_a_source(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "h", "h", "state", ["x"])))
    assert p.node == "h" and "takes 0 args, got 1" in p.message


def test_arg_that_names_no_node(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "a", "a", "add", ["xw", "nope"])))
    assert p.node == "a" and "'nope'" in p.message and "no node" in p.message


def test_duplicate_ids(make_cell, elman_nodes_list):
    nodes = elman_nodes_list + [("a", "sigmoid", ["xw"])]
    p = only_error(make_cell(nodes))
    assert p.node == "a" and "duplicate id 'a'" in p.message


@pytest.mark.parametrize("bad", ["1a", "a-b", "a b", "", "é", "a.b"])
def test_invalid_id(make_cell, elman_nodes_list, bad):
    nodes = [*elman_nodes_list, (bad, "sigmoid", ["h_new"])]
    errs = errors_of(make_cell(nodes))
    assert [e.node for e in errs] == [bad]
    assert f"'{bad}'" in errs[0].message and "not a valid name" in errs[0].message


def test_valid_ids_are_accepted(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("_A9_b", "sigmoid", ["h_new"])]
    assert analyze(make_cell(nodes)).ok


def test_elementwise_shape_mismatch_names_both_shapes(make_cell, elman_nodes_list):
    nodes = [*replace(elman_nodes_list, "a_b", "a_b", "add", ["a", "bi"]),
             ("bi", "weight", None, ["input"])]
    p = only_error(make_cell(nodes))
    assert p.node == "a_b" and "shape mismatch" in p.message
    assert B_HIDDEN in p.message and "[input]" in p.message
    assert "'a'" in p.message and "'bi'" in p.message


def test_an_input_wide_row_weight_does_not_meet_a_hidden_wide_value(make_cell, elman_nodes_list):
    # Only values with a batch dimension tie the widths: a weight's dimension is what it declares.
    nodes = [*elman_nodes_list, ("v", "weight", None, ["input"]), ("vh", "mul", ["v", "h_new"])]
    p = only_error(make_cell(nodes, output="vh"))
    assert p.node == "vh" and "shape mismatch" in p.message and "[input]" in p.message


# -- width ties: [batch, input] meets [batch, hidden] -----------------------------------------------

def test_an_input_wide_and_a_hidden_wide_value_meet_where_the_sizes_are_equal(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("y", "add", ["h_new", "x"])]
    info = analyze(make_cell(nodes, output="y"))
    assert info.ok and info.problems == []
    assert info.shapes["y"] == ("B", "hidden")  # hidden-wide, so that it can be the output
    assert [(t.node, t.reason) for t in info.ties] == [
        ("y", "adds 'x' [batch, input] to 'h_new' [batch, hidden]")]
    [note] = info.notes
    assert note.severity == "info" and note.node == "y"
    assert str(note) == ("info: node 'y': adds 'x' [batch, input] to 'h_new' [batch, hidden], so the first "
                         "layer's input size must equal the hidden size; the result is [batch, hidden]")
    require_valid(make_cell(nodes, output="y"))


@pytest.mark.parametrize("op, args, reason", [
    ("sub", ["x", "h"], "subtracts 'h' [batch, hidden] from 'x' [batch, input]"),
    ("mul", ["h", "x"], "multiplies 'h' [batch, hidden] by 'x' [batch, input]"),
    ("div", ["x", "h"], "divides 'x' [batch, input] by 'h' [batch, hidden]"),
    ("max", ["x", "h"], "applies 'max' to 'x' [batch, input] and 'h' [batch, hidden]"),
])
def test_each_op_says_how_it_ties_the_widths(make_cell, elman_nodes_list, op, args, reason):
    nodes = [*elman_nodes_list, ("t", op, args), ("s", "add", ["h_new", "t"])]
    info = analyze(make_cell(nodes, updates={"h": "s"}, output="s"))
    assert info.ok and [(t.node, t.reason) for t in info.ties] == [("t", reason)]


def test_a_tied_value_goes_on_hidden_wide(make_cell, elman_nodes_list):
    # into a state's update, and into a matmul by a [hidden, N] weight but not by an [input, N] one
    nodes = [*replace(elman_nodes_list, "a", "a", "add", ["xw", "x"]), ("m", "matmul", ["a", "U"])]
    info = analyze(make_cell(nodes, updates={"h": "a"}, output="m"))
    assert info.ok and info.shapes["a"] == info.shapes["m"] == ("B", "hidden")
    assert [t.node for t in info.ties] == ["a"]
    nodes = [*nodes[:-1], ("m", "matmul", ["a", "W"])]
    p = only_error(make_cell(nodes, updates={"h": "a"}, output="m"))
    assert p.node == "m" and "'a' [batch, hidden]" in p.message


def test_values_of_one_width_tie_nothing(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("xx", "mul", ["x", "x"]), ("xw2", "matmul", ["xx", "W"]),
             ("s", "add", ["h_new", "xw2"])]
    info = analyze(make_cell(nodes, updates={"h": "s"}, output="s"))
    assert info.ok and info.ties == [] and info.notes == []
    assert info.shapes["xx"] == ("B", "input")


def test_a_tie_nothing_computes_is_no_condition(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("spare", "add", ["x", "h"])]
    info = analyze(make_cell(nodes))
    assert info.ok and info.ties == [] and info.notes == []
    assert [(p.severity, p.node) for p in info.problems] == [("warning", "spare")]


def test_every_tie_is_listed_in_order(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("t1", "mul", ["x", "h"]), ("t2", "add", ["h_new", "x"]),
             ("s", "add", ["t2", "t1"])]
    info = analyze(make_cell(nodes, updates={"h": "s"}, output="s"))
    assert info.ok and {t.node for t in info.ties} == {"t1", "t2"}
    assert [n.node for n in info.notes] == [t.node for t in info.ties]
    pos = {nid: i for i, nid in enumerate(info.order)}
    assert [t.node for t in info.ties] == sorted(["t1", "t2"], key=pos.get)


def test_a_tie_is_listed_while_the_cell_has_errors(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("t", "add", ["x", "h"]), ("s", "add", ["h_new", "t"]), ("c", "state")]
    info = analyze(make_cell(nodes, updates={"h": "s"}, output="s"))
    assert [e.node for e in info.errors] == ["c"] and [t.node for t in info.ties] == ["t"]


@pytest.mark.parametrize("seed", range(30))
def test_random_cells_tie_no_widths(seed):
    """The random cells keep input-wide and hidden-wide values apart: they run at any sizes."""
    info = analyze(random_cell(seed))
    assert info.ok and info.ties == [] and info.notes == []


def test_matmul_shape_mismatch_names_both_shapes(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "xw", "xw", "matmul", ["x", "U"])))
    assert p.node == "xw" and "shape mismatch" in p.message
    assert "[batch, input]" in p.message and "[hidden, hidden]" in p.message


def test_matmul_shape_mismatch_names_the_ports(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "xw", "xw", "matmul", ["x", "U"])))
    assert p.message == ("shape mismatch in matmul 'xw': port a gets 'x' [batch, input], but port W holds "
                         "'U' [hidden, hidden], which expects [batch, hidden]")


def test_matmul_of_a_weight_on_the_left(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "hu", "hu", "matmul", ["U", "U"])))
    assert p.node == "hu" and "[hidden, hidden]" in p.message


def test_a_weight_wired_into_port_a_of_a_matmul_is_said_with_the_ports(make_cell, elman_nodes_list):
    # The weight W wired into both ports of xw: the message says which port takes what.
    (p,) = [e for e in errors_of(make_cell(replace(elman_nodes_list, "xw", "xw", "matmul", ["W", "W"])))
            if e.node == "xw"]
    assert p.message == ("matmul 'xw': port a takes a [batch, input] value (the input, a state or one "
                         "computed from them); it gets 'W', a 2-D weight [input, hidden]")


@pytest.mark.parametrize("w, what", [("b", "1-D weight"), ("h", "state"), ("xw", "matmul")])
def test_matmul_second_arg_must_be_a_2d_weight(make_cell, elman_nodes_list, w, what):
    nodes = replace(elman_nodes_list, "hu", "hu", "matmul", ["h", w])
    errs = errors_of(make_cell(nodes))
    assert errs, "expected an error"
    p = errs[0]
    assert p.node == "hu" and "2-D weight" in p.message and f"'{w}'" in p.message and what in p.message


def test_2d_weight_in_an_elementwise_op(make_cell, elman_nodes_list):
    p = only_error(make_cell(replace(elman_nodes_list, "a_b", "a_b", "add", ["a", "U"])))
    assert p.node == "a_b" and "'U'" in p.message and "[hidden, hidden]" in p.message
    assert p.message.startswith("add 'a_b': port b gets 'U'") and "port W of a matmul" in p.message


def test_cycle_through_no_state_names_its_nodes(make_cell, elman_nodes_list):
    nodes = replace(elman_nodes_list, "a", "a", "add", ["xw", "h_new"])
    p = only_error(make_cell(nodes))
    assert "cycle" in p.message
    assert p.node in {"a", "a_b", "h_new"}
    for nid in ("a", "a_b", "h_new"):
        assert f"{nid} ->" in p.message or f"-> {nid}" in p.message
    assert "xw" not in p.message and "hu" not in p.message


def test_self_loop_is_a_cycle(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("loop", "sigmoid", ["loop"])]
    p = only_error(make_cell(nodes))
    assert p.node == "loop" and "cycle" in p.message and "loop -> loop" in p.message


def test_a_loop_through_a_state_is_fine(make_cell):
    # h feeds itself through the update, not through an arg: that is the recurrence, no cycle.
    assert analyze(make_cell()).ok


def test_state_without_update_names_the_update_node_of_the_canvas(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("c", "state")]
    p = only_error(make_cell(nodes))
    assert p.node == "c"
    assert p.message.startswith("'c (next)' has no input: connect the update of state 'c'")
    assert "'updates'" not in p.message


def test_a_state_called_x_would_clash_with_the_input_sequence(make_cell):
    from cellfuse.graph_model import load_template

    cell = load_template("elman")
    cell.rename("x", "inp")
    cell.rename("h", "x")
    p = only_error(cell)
    assert p.node == "x" and "cannot be called 'x'" in p.message


def test_update_of_a_non_state(make_cell):
    p = only_error(make_cell(updates={"h": "h_new", "a": "h_new"}))
    assert p.node == "a" and "not a state" in p.message and "'add'" in p.message


def test_update_of_no_node(make_cell):
    p = only_error(make_cell(updates={"h": "h_new", "ghost": "h_new"}))
    assert "'ghost'" in p.message


def test_update_to_no_node(make_cell):
    p = only_error(make_cell(updates={"h": "ghost"}))
    assert p.node == "h" and "'ghost'" in p.message


def test_update_that_is_not_hidden_sized(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("c", "state")]
    p = only_error(make_cell(nodes, updates={"h": "h_new", "c": "x"}))
    assert p.node == "c" and "'x'" in p.message and "[batch, input]" in p.message
    assert B_HIDDEN in p.message


@pytest.mark.parametrize("output, shape", [("x", "[batch, input]"), ("b", "[hidden]"),
                                           ("W", "[input, hidden]")])
def test_output_that_is_not_hidden_sized(make_cell, output, shape):
    errs = errors_of(make_cell(output=output))
    p = [e for e in errs if "output" in e.message]
    assert len(p) == 1, [str(e) for e in errs]
    assert p[0].node == output and shape in p[0].message and B_HIDDEN in p[0].message


def test_output_const_is_not_hidden_sized(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("k", "const", None, None, 1.0)]
    p = only_error(make_cell(nodes, output="k"))
    assert p.node == "k" and "[]" in p.message


def test_missing_output(make_cell):
    p = only_error(make_cell(output=None))
    assert "no output" in p.message


def test_output_that_names_no_node(make_cell):
    p = only_error(make_cell(output="ghost"))
    assert "'ghost'" in p.message


def test_no_input(make_cell):
    nodes = [("h", "state"), ("U", "weight", None, ["hidden", "hidden"]), ("hu", "matmul", ["h", "U"]),
             ("h_new", "tanh", ["hu"])]
    p = only_error(make_cell(nodes))
    assert "no input" in p.message


def test_two_inputs(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("x2", "input"), ("W2", "weight", None, ["input", "hidden"]),
             ("xw2", "matmul", ["x2", "W2"]), ("out", "add", ["h_new", "xw2"])]
    p = only_error(make_cell(nodes, updates={"h": "out"}, output="out"))
    assert p.node == "x2" and "one input" in p.message


def test_unused_input_is_an_error(make_cell):
    nodes = [("x", "input"), ("h", "state"), ("U", "weight", None, ["hidden", "hidden"]),
             ("hu", "matmul", ["h", "U"]), ("h_new", "tanh", ["hu"])]
    p = only_error(make_cell(nodes))
    assert p.node == "x" and "not used" in p.message


def test_input_used_only_by_a_dead_node_is_an_error(make_cell):
    nodes = [("x", "input"), ("h", "state"), ("U", "weight", None, ["hidden", "hidden"]),
             ("W", "weight", None, ["input", "hidden"]), ("xw", "matmul", ["x", "W"]),
             ("hu", "matmul", ["h", "U"]), ("h_new", "tanh", ["hu"])]
    info = analyze(make_cell(nodes))
    assert [e.node for e in info.errors] == ["x"]
    assert {w.node for w in info.problems if w.severity == "warning"} == {"W", "xw"}


def test_unused_nodes_are_listed_while_the_cell_has_errors(make_cell, elman_nodes_list):
    # The add 'a' deleted on the canvas: port a of a_b is left unconnected, and the matmuls that fed
    # 'a' (with their weights, and the input) are used by nothing.
    nodes = [n for n in replace(elman_nodes_list, "a_b", "a_b", "add", ["", "b"]) if n[0] != "a"]
    info = analyze(make_cell(nodes))
    assert [(e.node, e.message) for e in info.errors] == [
        ("a_b", "port a of 'a_b' is not connected"),
        ("x", "the input is not used by any update or the output")]
    assert {w.node for w in info.problems if w.severity == "warning"} == {"xw", "hu", "W", "U"}
    assert info.dead == {"x", "xw", "hu", "W", "U"}


def test_shapes_are_known_and_checked_where_an_error_does_not_reach(make_cell, elman_nodes_list):
    # a_b has an unconnected port: it and h_new get no shape. The rest is inferred, and checked: the
    # matmul wired wrong elsewhere is reported at once, not after the first error is fixed.
    nodes = replace(replace(elman_nodes_list, "a_b", "a_b", "add", ["a", ""]), "hu", "hu", "matmul",
                    ["h", "W"])
    info = analyze(make_cell(nodes))
    assert {e.node for e in info.errors} == {"a_b", "hu"}
    assert "shape mismatch in matmul 'hu'" in next(e.message for e in info.errors if e.node == "hu")
    assert info.shapes["xw"] == ("B", "hidden") and info.shapes["h"] == ("B", "hidden")
    assert "a_b" not in info.shapes and "h_new" not in info.shapes and "a" not in info.shapes
    assert info.order == []  # no order for a cell with a structural error


def test_without_an_output_no_node_is_called_unused(make_cell, elman_nodes_list):
    # Everything would be unused; the missing output is the one thing to say.
    info = analyze(make_cell([*elman_nodes_list, ("c", "state")], output=None))
    assert not [p for p in info.problems if p.severity == "warning"]
    assert all("not used" not in p.message for p in info.problems)


def test_dead_node_is_a_warning_not_an_error(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("dead", "sigmoid", ["a"])]
    info = analyze(make_cell(nodes))
    assert info.ok and info.errors == []
    assert len(info.problems) == 1
    w = info.problems[0]
    assert w.severity == "warning" and w.node == "dead" and str(w).startswith("warning: node 'dead'")
    assert info.dead == {"dead"} and "dead" not in info.order
    require_valid(make_cell(nodes))  # warnings do not stop a run


@pytest.mark.parametrize("shape", [["input", "hidden", "hidden"], ["batch"], [], ["hidden", 3], None,
                                   "hidden"])
def test_bad_weight_shape(make_cell, elman_nodes_list, shape):
    nodes = replace(elman_nodes_list, "b", Node("b", "weight", shape=shape))
    p = only_error(make_cell(nodes))
    assert p.node == "b" and "weight shape" in p.message and repr(shape) in p.message


def test_shape_on_a_non_weight(make_cell, elman_nodes_list):
    nodes = replace(elman_nodes_list, "a", Node("a", "add", ["xw", "hu"], shape=["hidden"]))
    p = only_error(make_cell(nodes))
    assert p.node == "a" and "only weights have a shape" in p.message


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf, True, "1.0"])
def test_const_without_a_finite_value(make_cell, elman_nodes_list, value):
    nodes = [*elman_nodes_list, Node("k", "const", value=value), ("s", "mul", ["k", "h_new"])]
    p = only_error(make_cell(nodes, updates={"h": "s"}, output="s"))
    assert p.node == "k" and "finite number" in p.message and repr(value) in p.message


def test_huge_integer_const_is_an_error_not_an_exception(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, Node("k", "const", value=10**400), ("s", "mul", ["k", "h_new"])]
    p = only_error(make_cell(nodes, updates={"h": "s"}, output="s"))
    assert p.node == "k" and "finite number" in p.message


def test_value_on_a_non_const(make_cell, elman_nodes_list):
    nodes = replace(elman_nodes_list, "h", Node("h", "state", value=1.0))
    p = only_error(make_cell(nodes))
    assert p.node == "h" and "only consts have a value" in p.message


def test_every_error_is_reported_at_once(make_cell, elman_nodes_list):
    nodes = [*replace(elman_nodes_list, "a", "a", "frob", ["xw", "hu"]), ("c", "state"),
             ("1x", "sigmoid", ["h_new"])]
    errs = errors_of(make_cell(nodes, output=None))
    assert {e.node for e in errs} >= {"a", "c", "1x"}
    assert any("no output" in e.message for e in errs)


def test_require_valid_raises_cell_error_listing_the_errors(make_cell, elman_nodes_list):
    cell = make_cell([*elman_nodes_list, ("c", "state")], output="ghost")
    with pytest.raises(CellError) as e:
        require_valid(cell)
    assert "2 error(s)" in str(e.value) and "'c'" in str(e.value) and "'ghost'" in str(e.value)
    assert len(e.value.problems) == 2


def test_shape_str():
    assert shape_str(("B", "hidden")) == B_HIDDEN
    assert shape_str(()) == "[]"
    assert shape_str(None) == "?"


def test_long_chains_do_not_hit_the_recursion_limit(make_cell, elman_nodes_list):
    nodes = list(elman_nodes_list)
    prev = "h_new"
    for i in range(3000):
        nodes.append((f"n{i}", "tanh", [prev]))
        prev = f"n{i}"
    info = analyze(make_cell(nodes, updates={"h": prev}, output=prev))
    assert info.ok and info.order[-1] == prev


# -- row reductions: [batch, 1] ----------------------------------------------------------------------------

def test_a_row_reduction_gives_one_column_that_spreads_over_a_row(make_cell, elman_nodes_list):
    # a layer norm without gain: (a - mean(a)) * rsqrt(mean((a - mean(a))^2) + eps)
    nodes = [*elman_nodes_list, ("eps", "const", None, None, 1e-5), ("b2", "weight", None, ["hidden"]),
             ("mu", "row_mean", ["a_b"]), ("d", "sub", ["a_b", "mu"]), ("sq", "square", ["d"]),
             ("var", "row_mean", ["sq"]), ("ve", "add", ["var", "eps"]), ("r", "rsqrt", ["ve"]),
             ("n", "mul", ["d", "r"]), ("total", "row_sum", ["h"]), ("rb", "add", ["total", "b2"]),
             ("y", "add", ["n", "rb"])]
    info = analyze(make_cell(nodes, output="y"))
    assert info.ok and info.problems == [], [str(p) for p in info.problems]
    for nid in ("mu", "var", "ve", "r", "total"):
        assert info.shapes[nid] == ("B", "1") and shape_str(info.shapes[nid]) == "[batch, 1]"
    assert info.shapes["d"] == info.shapes["n"] == info.shapes["y"] == ("B", "hidden")
    assert info.shapes["rb"] == ("B", "hidden")  # [batch, 1] + [hidden]: every row's number over the row
    assert info.ties == []


def test_a_row_reduction_of_an_input_wide_value_is_refused_naming_the_node(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("m", "row_mean", ["x"]), ("y", "add", ["h_new", "m"])]
    p = only_error(make_cell(nodes, output="y"))
    assert p.node == "m"
    assert p.message == ("row_mean 'm': port a gets 'x' [batch, input]; a row reduction takes a "
                         "[batch, hidden] value")


@pytest.mark.parametrize("arg, described", [("b", "'b', a 1-D weight [hidden]"), ("k", "'k', a const []")])
def test_a_row_reduction_of_a_weight_or_a_const_is_refused(make_cell, elman_nodes_list, arg, described):
    nodes = [*elman_nodes_list, ("k", "const", None, None, 2.0), ("s", "row_sum", [arg]),
             ("y", "add", ["h_new", "s"])]
    p = only_error(make_cell(nodes, output="y"))
    assert p.node == "s" and described in p.message and "a row reduction takes a [batch, hidden]" in p.message


def test_a_row_reduction_of_a_row_reduction_is_refused(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("m", "row_mean", ["h_new"]), ("mm", "row_sum", ["m"]),
             ("y", "add", ["h_new", "mm"])]
    p = only_error(make_cell(nodes, output="y"))
    assert p.node == "mm" and "'m' [batch, 1]" in p.message


def test_a_one_column_value_is_no_gemm_operand(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("m", "row_mean", ["h_new"]), ("mu", "matmul", ["m", "U"]),
             ("y", "add", ["h_new", "mu"])]
    p = only_error(make_cell(nodes, output="y"))
    assert p.node == "mu"
    assert p.message == ("matmul 'mu': port a gets 'm' [batch, 1], one number per row (a row reduction's "
                         "result), which is no GEMM operand; a matmul takes a [batch, hidden] value")


def test_a_one_column_value_is_no_update_nor_output(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("m", "row_mean", ["h_new"])]
    errors = errors_of(make_cell(nodes, updates={"h": "h_new"}, output="m"))
    assert [p.node for p in errors] == ["m"] and "[batch, 1]" in errors[0].message
    errors = errors_of(make_cell(nodes, updates={"h": "m"}, output="h_new"))
    assert [p.node for p in errors] == ["h"] and "[batch, 1]" in errors[0].message


def test_one_column_values_combine_with_input_wide_ones_without_a_tie(make_cell, elman_nodes_list):
    nodes = [*elman_nodes_list, ("m", "row_mean", ["h"]), ("xm", "mul", ["x", "m"]),
             ("W2", "weight", None, ["input", "hidden"]), ("xmw", "matmul", ["xm", "W2"]),
             ("y", "add", ["h_new", "xmw"])]
    info = analyze(make_cell(nodes, output="y"))
    assert info.ok and info.shapes["xm"] == ("B", "input") and info.ties == []
