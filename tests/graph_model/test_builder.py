"""The Python builder: operators make the right nodes, .named renames, and a built cell is valid,
laid out and survives the cell file."""

from __future__ import annotations

import textwrap

import pytest

from cellfuse.graph_model import (
    CellBuilder,
    CellError,
    analyze,
    auto_layout,
    cell_from_text,
    cell_to_text,
    exp,
    load_cell,
    load_template,
    relu,
    save_cell,
    sigmoid,
    tanh,
    template_names,
)


def parts():
    b = CellBuilder("t", input=3, hidden=4)
    x, h = b.input("x"), b.state("h")
    W, U, bias = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("b", "hidden")
    return b, x, h, W, U, bias


def node_of(v):
    return v.builder.cell.node(v.id)


def test_sources():
    b, x, h, W, U, bias = parts()
    assert node_of(x).op == "input" and node_of(h).op == "state"
    assert node_of(W).op == "weight" and node_of(W).shape == ["input", "hidden"]
    assert node_of(bias).shape == ["hidden"]
    k = b.const(2.5, "k")
    assert node_of(k).op == "const" and node_of(k).value == 2.5 and k.id == "k"
    assert b.cell.sizes == {"input": 3, "hidden": 4}


@pytest.mark.parametrize("make, op, order", [
    (lambda x, h, U: x @ U, "matmul", ["x", "U"]),
    (lambda x, h, U: x + h, "add", ["x", "h"]),
    (lambda x, h, U: x - h, "sub", ["x", "h"]),
    (lambda x, h, U: x * h, "mul", ["x", "h"]),
    (lambda x, h, U: x / h, "div", ["x", "h"]),
    (lambda x, h, U: -x, "neg", ["x"]),
    (lambda x, h, U: sigmoid(x), "sigmoid", ["x"]),
    (lambda x, h, U: tanh(x), "tanh", ["x"]),
    (lambda x, h, U: relu(x), "relu", ["x"]),
    (lambda x, h, U: exp(x), "exp", ["x"]),
])
def test_operators_make_the_right_ops(make, op, order):
    b, x, h, W, U, bias = parts()
    v = make(x, h, U)
    n = node_of(v)
    assert n.op == op and n.args == order
    assert n.id == op  # the first node of an op is named after it


@pytest.mark.parametrize("make, op, const_first", [
    (lambda h: h + 2, "add", False), (lambda h: 2 + h, "add", True),
    (lambda h: h - 2, "sub", False), (lambda h: 2 - h, "sub", True),
    (lambda h: h * 2, "mul", False), (lambda h: 2 * h, "mul", True),
    (lambda h: h / 2, "div", False), (lambda h: 2 / h, "div", True),
])
def test_numbers_become_consts_on_the_right_side(make, op, const_first):
    b, x, h, W, U, bias = parts()
    n = node_of(make(h))
    assert n.op == op
    const_id = n.args[0] if const_first else n.args[1]
    other = n.args[1] if const_first else n.args[0]
    c = b.cell.node(const_id)
    assert c.op == "const" and c.value == 2.0 and isinstance(c.value, float)
    assert other == "h"


def test_fresh_ids_do_not_clash():
    b, x, h, W, U, bias = parts()
    ids = [(h + h).id, (h + h).id, (h + h).id]
    assert ids == ["add", "add1", "add2"]


def test_named_renames_the_node_and_every_reference():
    b, x, h, W, U, bias = parts()
    a = x @ W
    s = a + bias
    assert node_of(s).args == ["matmul", "b"]
    assert a.named("xw") is a and a.id == "xw"
    assert b.cell.has("xw") and not b.cell.has("matmul")
    assert node_of(s).args == ["xw", "b"]
    h_new = tanh(s).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    h_new.named("h2")
    assert b.cell.updates == {"h": "h2"} and b.cell.output == "h2"


def test_named_with_a_taken_id_is_an_error():
    b, x, h, W, U, bias = parts()
    a = x @ W
    with pytest.raises(CellError, match="'h'"):
        a.named("h")
    assert a.id == "matmul" and b.cell.node("h").op == "state"
    assert a.named("matmul") is a  # its own name is fine


def elman():
    b, x, h, W, U, bias = parts()
    h_new = tanh(x @ W + h @ U + bias).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


def test_build_gives_a_valid_laid_out_cell():
    cell = elman()
    info = analyze(cell)
    assert info.ok and info.problems == []
    assert set(cell.layout) == {n.id for n in cell.nodes}
    positions = [tuple(p) for p in cell.layout.values()]
    assert len(set(positions)) == len(positions)
    assert [n.op for n in cell.nodes].count("matmul") == 2


def test_a_built_cell_round_trips_through_the_file(tmp_path):
    cell = elman()
    save_cell(cell, tmp_path / "e.cell.json")
    back = load_cell(tmp_path / "e.cell.json")
    assert back.to_json() == cell.to_json()
    assert cell_from_text(cell_to_text(back)).to_json() == cell.to_json()
    assert analyze(back).ok


def test_building_a_cell_without_output_raises():
    b, x, h, W, U, bias = parts()
    b.update(h, tanh(x @ W))
    with pytest.raises(CellError, match="no output"):
        b.build()


def test_building_a_cell_with_a_shape_mismatch_raises():
    b, x, h, W, U, bias = parts()
    bad = (x + bias).named("bad")
    b.update(h, tanh(bad @ U))
    b.output(h)
    with pytest.raises(CellError) as e:
        b.build()
    assert "'bad'" in str(e.value) and "[batch, input]" in str(e.value) and "[hidden]" in str(e.value)


def test_building_a_cell_that_ties_the_widths():
    """x + h builds: the cell runs where the input size equals the hidden size."""
    b, x, h, W, U, bias = parts()
    mixed = (x + h).named("mixed")
    b.update(h, tanh(mixed @ U))
    b.output(h)
    info = analyze(b.build())
    assert info.ok and [t.node for t in info.ties] == ["mixed"]


def test_building_a_cell_with_a_state_without_update_raises():
    b, x, h, W, U, bias = parts()
    c = b.state("c")
    h_new = tanh(x @ W + c)
    b.update(h, h_new)
    b.output(h_new)
    with pytest.raises(CellError, match="'c \\(next\\)' has no input: connect the update of state 'c'"):
        b.build()


def test_building_a_cell_with_a_bad_id_raises():
    b, x, h, W, U, bias = parts()
    h_new = tanh(x @ W).named("h new")
    b.update(h, h_new)
    b.output(h_new)
    with pytest.raises(CellError, match="'h new'"):
        b.build()


def test_the_module_docstring_example_works():
    import cellfuse.graph_model.builder as builder_module

    code = textwrap.dedent(builder_module.__doc__.split("\n\n", 1)[1])
    scope = {"CellBuilder": CellBuilder, "tanh": tanh}
    exec(code, scope)
    cell = scope["cell"]
    assert analyze(cell).ok and cell.name == "Elman" and cell.output == "h_new"


def test_auto_layout_survives_cycles_and_missing_args():
    b, x, h, W, U, bias = parts()
    a = x @ W
    s = (a + bias).named("s")
    b.cell.node("matmul").args = ["s", "ghost"]  # a cycle, and an arg that names no node
    layout = auto_layout(b.cell)
    assert set(layout) == {n.id for n in b.cell.nodes}
    assert s.id in layout


@pytest.mark.slow  # 3000 nodes
def test_auto_layout_of_a_long_chain():
    b, x, h, W, U, bias = parts()
    v = x @ W
    for _ in range(3000):
        v = tanh(v)
    b.update(h, v)
    b.output(v)
    cell = b.build()
    assert len(cell.layout) == len(cell.nodes)
    assert cell.layout[v.id][0] > cell.layout["x"][0]
    cell.nodes.reverse()  # a file need not list its nodes in order; the columns stay the same
    assert {k: p[0] for k, p in auto_layout(cell).items()} == {k: p[0] for k, p in cell.layout.items()}


def test_a_cell_refuses_to_rename_a_node_onto_another():
    b, x, h, W, U, bias = parts()
    a = x @ W
    before = b.cell.to_json()
    with pytest.raises(ValueError, match="to 'h': that id is taken"):
        b.cell.rename(a.id, "h")
    assert b.cell.to_json() == before
    b.cell.rename(a.id, a.id)  # to itself: nothing to do
    assert b.cell.to_json() == before


@pytest.mark.parametrize("name", template_names())
def test_auto_layout_keeps_the_matmuls_of_a_gemm_group_together(name):
    # Matmuls that share their left operand are one GEMM once scheduled: one block in their column,
    # no other node between them; the weights they multiply likewise. The shipped layouts are these.
    cell = load_template(name)
    layout = auto_layout(cell)
    assert cell.layout == layout
    groups: dict[tuple[str, str], list[str]] = {}
    for n in cell.nodes:
        if n.op == "matmul":
            groups.setdefault(("matmuls", n.args[0]), []).append(n.id)
            groups.setdefault(("weights", n.args[0]), []).append(n.args[1])
    assert any(len(members) > 1 for members in groups.values()) or name in ("elman", "indrnn")
    for what, members in groups.items():
        xs = {layout[m][0] for m in members}
        assert len(xs) == 1, (name, what, members)
        rows = sorted(layout[m][1] for m in members)
        column = sorted(p[1] for p in layout.values() if p[0] in xs)
        block = column[column.index(rows[0]):column.index(rows[-1]) + 1]
        assert block == rows, (name, what, members)


def test_a_with_block_groups_the_nodes_added_in_it():
    from cellfuse.graph_model import Group

    b = CellBuilder("Elman")
    x, h = b.input("x"), b.state("h")
    with b.group("pre-activation"):
        W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
        pre = (x @ W + h @ U).named("a")
    h_new = tanh(pre).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    assert cell.groups == [Group("pre-activation", ["W", "U", "matmul", "matmul1", "a"])]
    with pytest.raises(CellError, match="groups do not nest"):
        with b.group("outer"):
            with b.group("inner"):
                pass
    with pytest.raises(CellError, match="holds no node"):
        with b.group("empty"):
            pass
    with pytest.raises(CellError, match="cannot be empty"):
        with b.group(" "):
            pass
