"""Editing a cell on the canvas, as a user would: palette, connections, undo and redo, clipboard."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.app import theme
from cellfuse.app.node_types import OP_NODE_CLASSES, node_type_of
from cellfuse.graph_model import OPS, analyze, init_params, run_reference
from cellfuse.graph_model.ops import OpKind


def test_a_node_class_per_op_with_ports_named_after_its_args():
    assert set(OP_NODE_CLASSES) == set(OPS)
    assert len({node_type_of(c) for c in OP_NODE_CLASSES.values()}) == len(OPS)
    for op, cls in OP_NODE_CLASSES.items():
        assert cls.OP == op and cls.NODE_NAME == op


# The palette's group of each kind of op of the table; the sources (input, state, weight, const) are
# filed by what they are to the compiler, each under a group of its own.
KIND_GROUPS = {OpKind.MATMUL: "GEMM", OpKind.ELEMENTWISE: "Elementwise", OpKind.REDUCTION: "Reduction"}
SOURCE_GROUPS = {"input": "Data", "const": "Data", "state": "State", "weight": "Weight"}


def test_the_palette_lists_every_op_of_the_table(window, qtbot):
    palette = window.palette
    assert sorted(palette.ops()) == sorted([*OPS, "output"])
    assert set(OpKind) == {OpKind.SOURCE, *KIND_GROUPS}  # a new kind needs a group of its own
    group_of = {}
    for op, spec in OPS.items():
        palette.search.clear()
        qtbot.keyClicks(palette.search, op)
        assert palette.current_op() == op, palette.ops()  # Enter adds it
        group_of[op] = palette.tree.currentItem().parent().text(0)
        wanted = SOURCE_GROUPS[op] if spec.kind is OpKind.SOURCE else KIND_GROUPS[spec.kind]
        assert group_of[op] == wanted == theme.KIND_LABELS[theme.op_kind(op)], (op, spec.kind)
    palette.search.clear()
    # grouped by kind; in a group, in the table's order
    for group in set(group_of.values()):
        assert [op for op in palette.ops() if group_of.get(op) == group] == [
            op for op in OPS if group_of[op] == group], group
    assert {"row_sum", "row_mean"} <= {op for op, group in group_of.items() if group == "Reduction"}


@pytest.mark.slow
def test_ports_are_the_op_args(window):
    for op, spec in OPS.items():
        node_id = window.adapter.add_node(op)
        node = window.adapter.node(node_id)
        assert [p.name() for p in node.input_ports()] == list(spec.args)
        assert len(node.output_ports()) == 1


@pytest.mark.slow
def test_build_an_lstm_from_the_palette(window, user):
    window.actions_.new.trigger()
    a = window.adapter
    assert [n.id for n in window.cell.nodes] == ["x"]
    assert window.problems.problem_count() > 0  # no output yet

    h = user.add("state")
    user.rename(h, "h")
    c = user.add("state")
    user.rename(c, "c")
    assert [n.id for n in window.cell.of_op("state")] == ["h", "c"]

    gate = {}
    for g, act in [("i", "sigmoid"), ("f", "sigmoid"), ("o", "sigmoid"), ("g", "tanh")]:
        W = user.add("weight")
        a.set_weight_shape(W, ["input", "hidden"])
        U = user.add("weight")  # hidden x hidden by default
        b = user.add("weight")
        window.show_node(b)
        window.properties.dims_combo.setCurrentIndex(0)  # 1-D: a bias
        assert window.cell.node(b).shape == ["hidden"]
        xw = user.add("matmul")
        a.connect("x", xw, "a")
        a.connect(W, xw, "W")
        hu = user.add("matmul")
        a.connect("h", hu, "a")
        a.connect(U, hu, 1)
        s = user.add("add")
        a.connect(xw, s, "a")
        a.connect(hu, s, "b")
        sb = user.add("add")
        a.connect(s, sb, "a")
        a.connect(b, sb, "b")
        gate[g] = user.add(act)
        a.connect(sb, gate[g], "a")

    fc = user.add("mul")
    a.connect(gate["f"], fc, "a")
    a.connect("c", fc, "b")
    ig = user.add("mul")
    a.connect(gate["i"], ig, "a")
    a.connect(gate["g"], ig, "b")
    c_new = user.add("add")
    a.connect(fc, c_new, "a")
    a.connect(ig, c_new, "b")
    tc = user.add("tanh")
    a.connect(c_new, tc, "a")
    h_new = user.add("mul")
    a.connect(gate["o"], h_new, "a")
    a.connect(tc, h_new, "b")
    assert window.problems.problem_count() > 0  # no updates and no output yet

    a.set_update("h", h_new)
    a.set_update("c", c_new)
    a.set_output(h_new)

    cell = window.cell
    assert cell.updates == {"h": h_new, "c": c_new} and cell.output == h_new
    assert analyze(cell).problems == []
    assert window.problems.problem_count() == 0
    assert "No problems" in window.problems.summary.text()
    assert "valid" in window.validity_label.text()

    # It is an LSTM: the scheduler finds two GEMM groups, and it runs.
    window.refresh_plan()
    assert window.plan_panel.stat_values["launches_per_step"].text() == "2"
    params = init_params(cell, 1, 8, 8)
    x = np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)
    out = run_reference(cell, params, {"x": x})
    assert out.y.shape == (3, 2, 8)


@pytest.mark.slow
def test_a_state_is_two_nodes_and_its_update_node_sets_the_update(window, user):
    a = window.adapter
    h = user.add("state")
    update = a.update_node(h)
    assert update.name() == f"{h} (next)"
    assert h not in window.cell.updates
    update.input_ports()[0].connect_to(a.node("h_new").output(0))  # as a drag does
    assert window.cell.updates[h] == "h_new"
    user.rename(h, "mem")
    assert window.cell.updates["mem"] == "h_new" and a.update_node("mem").name() == "mem (next)"
    a.delete(["mem"])  # the update goes with its state
    assert not window.cell.has("mem") and "mem" not in window.cell.updates
    assert all(n.name() != "mem (next)" for n in a.graph.all_nodes())


def test_undo_and_redo_move_the_cell_with_the_canvas(window, user, same):
    start = window.cell.copy()
    node = user.add("relu")
    window.adapter.connect("h_new", node, "a")
    assert window.cell.node(node).args == ["h_new"]
    window.actions_.undo.trigger()
    assert window.cell.node(node).args == [""]  # its port a, not connected
    window.actions_.undo.trigger()
    assert same(window.cell, start)
    assert not window.is_modified()
    window.actions_.redo.trigger()
    window.actions_.redo.trigger()
    assert window.cell.node(node).args == ["h_new"]
    assert window.is_modified() and window.isWindowModified()

    user.rename("h_new", "hidden_out")
    assert window.cell.output == "hidden_out" and window.cell.updates["h"] == "hidden_out"
    window.actions_.undo.trigger()
    assert window.cell.output == "h_new" and window.cell.updates["h"] == "h_new"
    assert window.cell.node(node).args == ["h_new"]
    window.actions_.redo.trigger()
    assert window.cell.output == "hidden_out"


def test_delete_and_undo(window):
    a = window.adapter
    a.select(["c"])
    window.actions_.delete.trigger()
    assert not window.cell.has("c") and "c" not in window.cell.updates
    assert window.cell.node("fc").args == ["f", ""]
    assert window.problems.problem_count() > 0
    window.actions_.undo.trigger()
    assert window.cell.node("fc").args == ["f", "c"] and window.cell.updates["c"] == "c_new"
    assert window.problems.problem_count() == 0


@pytest.mark.slow
def test_refused_rename_is_said_and_changes_nothing(window, user, same):
    before = window.cell.copy()
    user.rename("xi", "hi")  # taken
    assert "taken" in window.properties.error_label.text()
    assert window.properties.id_edit.text() == "xi"
    assert same(window.cell, before)
    # The title of a node edited on the canvas goes through the same check.
    window.adapter.graph.rename_requested.emit(window.adapter.node("xi").id, "not an id")
    assert window.cell.has("xi")
    window.adapter.graph.rename_requested.emit(window.adapter.node("xi").id, "x_gate_i")
    assert window.cell.has("x_gate_i") and window.cell.node("ai").args[0] == "x_gate_i"


def test_copy_paste_keeps_inner_links_and_takes_fresh_ids(window):
    a = window.adapter
    window.actions_.select_all.trigger()
    window.actions_.ungroup.trigger()  # nodes one by one, not the input gate's group
    a.select(["h", "hi", "U_i"])
    assert window.actions_.copy.isEnabled()
    window.actions_.copy.trigger()
    n = len(window.cell.nodes)
    window.actions_.paste.trigger()
    cell = window.cell
    assert len(cell.nodes) == n + 3
    new = sorted(a.selected_ids())
    assert new == ["U_i1", "h1", "hi1"]
    assert cell.node("hi1").args == ["h1", "U_i1"]
    assert cell.node("U_i1").shape == ["hidden", "hidden"]
    a.update_node("h1")  # the pasted state has its update node
    window.actions_.undo.trigger()
    assert len(window.cell.nodes) == n

    a.select(["ai"])
    window.actions_.cut.trigger()
    assert not window.cell.has("ai")
    window.actions_.paste.trigger()
    assert window.cell.has("ai") and window.cell.node("ai").args == ["", ""]  # links to outside are not kept


@pytest.mark.slow
def test_node_search_and_drop_add_through_the_adapter(window):
    graph = window.adapter.graph
    names = window.adapter.node_search_names()
    assert "sigmoid" in names and "output" in names and "update" not in names
    graph._on_search_triggered(names["sigmoid"][0], (100.0, 100.0))
    assert window.cell.has("sigmoid")
    graph.op_dropped.emit("state", (0.0, 400.0))
    assert window.cell.has("state") and window.adapter.update_node("state") is not None
    # The cell has one output node: asking for another selects it.
    graph._on_search_triggered(names["output"][0], (0.0, 0.0))
    assert len([n for n in graph.all_nodes() if n.ROLE == "output"]) == 1


def shown_rects(window) -> list:
    return [n.view.sceneBoundingRect() for n in window.adapter.graph.all_nodes() if n.view.isVisible()]


@pytest.mark.slow
def test_select_all_and_auto_layout(window):
    window.actions_.select_all.trigger()
    assert set(window.adapter.selected_ids()) == {n.id for n in window.cell.nodes}
    before = dict(window.cell.layout)
    window.adapter.graph.viewer().scene().clearSelection()
    for node in window.adapter.graph.all_nodes():
        node.set_pos(0, 0)
    window.actions_.auto_layout.trigger()
    layout = window.cell.layout
    rects = shown_rects(window)
    assert not any(r.intersects(q) for i, r in enumerate(rects) for q in rects[i + 1:])
    for group in window.adapter.group_nodes():  # and the nodes of each group, opened
        window.adapter.open_group_of(window.adapter.members(group)[0].name())
        rects = shown_rects(window)
        assert len(rects) >= 2
        assert not any(r.intersects(q) for i, r in enumerate(rects) for q in rects[i + 1:])
    window.adapter.close_group()
    assert set(layout) == set(before)  # a place for every node of the cell
    window.actions_.undo.trigger()
    assert all(p == [0.0, 0.0] for p in window.cell.layout.values())
    window.actions_.redo.trigger()
    assert window.cell.layout == layout
    # The layout is the graph's, not the nodes' places before: from other places, the same one.
    window.actions_.undo.trigger()
    for i, node in enumerate(window.adapter.graph.all_nodes()):
        node.set_pos(37.0 * i, -11.0 * i)
    assert window.cell.layout != layout
    window.actions_.auto_layout.trigger()
    assert window.cell.layout == layout


@pytest.mark.parametrize("op", ["add", pytest.param("matmul", marks=pytest.mark.slow)])
def test_wrong_connections_show_on_the_node(window, op):
    a = window.adapter
    node = a.add_node(op)
    a.connect("W_i", node, 0)
    a.connect("x", node, 1)
    a.set_output(node)
    problems = [p for p in window.info.problems if p.node is not None]
    assert problems
    marked = a.node(problems[0].node).item
    assert marked.mark == "error" and problems[0].message in marked.toolTip()


@pytest.mark.slow
def test_canvas_shortcuts(qtbot, window, monkeypatch):
    from PySide6 import QtCore

    searched = []
    monkeypatch.setattr(window.adapter.graph, "open_node_search", lambda names: searched.append(names))
    window.activateWindow()
    window.canvas.setFocus()
    qtbot.waitUntil(window.canvas.hasFocus, timeout=2000)
    qtbot.keyClick(window.canvas, QtCore.Qt.Key.Key_Tab)
    assert searched and "sigmoid" in searched[0]
    window.adapter.select(["ai"])
    qtbot.keyClick(window.canvas, QtCore.Qt.Key.Key_Delete)
    assert not window.cell.has("ai")
    qtbot.keyClick(window.canvas, QtCore.Qt.Key.Key_Z, QtCore.Qt.KeyboardModifier.ControlModifier)
    assert window.cell.has("ai")
    qtbot.keyClick(window.canvas, QtCore.Qt.Key.Key_Y, QtCore.Qt.KeyboardModifier.ControlModifier)
    assert not window.cell.has("ai")
    qtbot.keyClick(window.canvas, QtCore.Qt.Key.Key_Z, QtCore.Qt.KeyboardModifier.ControlModifier)
    # Typing in a text field does not trigger the canvas's one-key shortcuts.
    window.palette.search.setFocus()
    qtbot.keyClicks(window.palette.search, "f")
    assert window.palette.search.text() == "f"


@pytest.mark.slow
def test_a_new_node_comes_last_though_it_takes_a_freed_nodes_canvas_id(window):
    # NodeGraphQt names a node by its memory address, which Python hands to a new node once a deleted
    # one is freed: the cell's order must follow the nodes themselves, not those names.
    a = window.adapter
    first = next(n.id for n in window.cell.nodes if n.op not in ("input", "state", "weight", "const"))
    freed = a.canvas_nodes(first)[0].id
    a.delete([first])
    kept = window.add_node("tanh")
    a.canvas_nodes(kept)[0].model.id = freed  # what the allocator may do
    assert [n.id for n in a._read().nodes][-1] == kept


def test_paste_lands_in_free_space_where_the_place_below_the_originals_is_taken(window):
    a = window.adapter
    window.new_from_template("elman", ask=False)
    pasted = []
    for _ in range(3):  # the second lands where the first did, below a_b, unless it looks for room
        a.select(["a_b"])
        window.copy_selection()
        pasted += window.paste()
    assert len(pasted) == 3 and all(window.cell.has(i) for i in pasted)
    shown = [n for n in a.graph.all_nodes() if n.view.isVisible()]
    for new in pasted:
        rect = a.node(new).view.sceneBoundingRect()
        hit = [n.name() for n in shown if n.name() != new and n.view.sceneBoundingRect().intersects(rect)]
        assert not hit, (new, hit)
