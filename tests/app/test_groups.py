"""Groups on the canvas: nodes shown as one node under a name, opened with a double-click and left by
the path above the canvas; grouping and ungrouping are undo steps, groups go with copy and paste and
into the file, and nothing the compiler sees changes with them."""

from __future__ import annotations

import json

import pytest
from PySide6 import QtCore

from cellfuse.app import dialogs
from cellfuse.codegen import make_plan
from cellfuse.codegen.plan_text import describe
from cellfuse.graph_model import analyze, load_cell, load_template, template_names

GATES = ["input gate", "forget gate", "output gate", "candidate"]
FORGET = ["W_f", "U_f", "b_f", "xf", "hf", "af", "af_b", "f"]
CTRL, SHIFT = QtCore.Qt.KeyboardModifier.ControlModifier, QtCore.Qt.KeyboardModifier.ShiftModifier


def group_node(window, name: str):
    found = [g for g in window.adapter.group_nodes() if g.name() == name]
    assert len(found) == 1, [g.name() for g in window.adapter.group_nodes()]
    return found[0]


def shown_ids(window) -> set[str]:
    """The names of the canvas nodes shown now."""
    return {n.name() for n in window.adapter.graph.all_nodes() if n.view.isVisible()}


def press(qtbot, window, key, modifiers) -> None:
    window.canvas.setFocus()
    qtbot.waitUntil(window.canvas.hasFocus, timeout=2000)
    qtbot.keyClick(window.canvas, key, modifiers)


def test_the_lstm_shows_its_gates_as_four_nodes_with_their_inputs_and_outputs_as_ports(window):
    assert [g.name for g in window.cell.groups] == GATES
    assert window.cell.groups[1].nodes == FORGET
    forget = group_node(window, "forget gate")
    assert [p.name() for p in forget.input_ports()] == ["x", "h"]
    assert [p.name() for p in forget.output_ports()] == ["f"]
    assert {"x", "h", "c", "fc", "h_new", *GATES} <= shown_ids(window)
    assert not shown_ids(window) & set(FORGET)
    # What shows a node inside a closed group is its group's node; the port says what it carries.
    assert window.adapter.shown_nodes("xf") == [forget]
    assert forget.output_ports()[0].view.toolTip() == "f: [batch, hidden]"


def test_group_and_ungroup_the_gates_by_keyboard_and_undo_both(qtbot, window, monkeypatch):
    a = window.adapter
    before = window.cell.copy()
    a.select_canvas([group_node(window, "forget gate")])
    press(qtbot, window, QtCore.Qt.Key.Key_G, CTRL | SHIFT)
    assert [g.name for g in window.cell.groups] == ["input gate", "output gate", "candidate"]
    assert set(FORGET) <= shown_ids(window) and "forget gate" not in shown_ids(window)
    assert sorted(a.selected_ids()) == sorted(FORGET)  # the ungrouped nodes, selected
    assert window.is_modified()

    asked = []
    monkeypatch.setattr(dialogs, "ask_group_name", lambda parent, suggested: asked.append(suggested)
                        or "the forget gate")
    press(qtbot, window, QtCore.Qt.Key.Key_G, CTRL)
    assert asked and window.cell.groups[-1].name == "the forget gate"
    assert window.cell.groups[-1].nodes == FORGET
    assert "the forget gate" in shown_ids(window) and not shown_ids(window) & set(FORGET)

    window.actions_.undo.trigger()  # the grouping
    assert [g.name for g in window.cell.groups] == ["input gate", "output gate", "candidate"]
    assert set(FORGET) <= shown_ids(window)
    window.actions_.undo.trigger()  # the ungrouping
    assert window.cell.groups == before.groups and window.cell.to_json() == before.to_json()
    assert not window.is_modified()
    window.actions_.redo.trigger()
    window.actions_.redo.trigger()
    assert window.cell.groups[-1].name == "the forget gate"


def overlapping_nodes(window) -> list[tuple[str, str]]:
    """The pairs of canvas nodes shown now whose bodies overlap."""
    shown = [n for n in window.adapter.graph.all_nodes() if n.view.isVisible()]
    return [(a.name(), b.name()) for i, a in enumerate(shown) for b in shown[i + 1:]
            if a.view.sceneBoundingRect().intersects(b.view.sceneBoundingRect())]


@pytest.mark.parametrize("template", template_names())
def test_ungrouping_every_group_lays_the_members_out_clear_of_each_other(qtbot, window, template):
    window.new_from_template(template, ask=False)
    a = window.adapter
    assert not overlapping_nodes(window)
    inside = {g.name(): a.members(g) for g in a.group_nodes()}
    before = {name: [m.pos() for m in members] for name, members in inside.items()}
    window.actions_.select_all.trigger()
    press(qtbot, window, QtCore.Qt.Key.Key_G, CTRL | SHIFT)
    assert not window.cell.groups
    assert not overlapping_nodes(window)
    for name, members in inside.items():  # each group's members as they were laid out inside it
        dx, dy = members[0].pos()[0] - before[name][0][0], members[0].pos()[1] - before[name][0][1]
        moved = [c for x, y in before[name] for c in (x + dx, y + dy)]
        assert [c for m in members for c in m.pos()] == pytest.approx(moved), name
    window.actions_.undo.trigger()
    assert [g.name for g in window.cell.groups] == list(inside)
    assert not overlapping_nodes(window)


@pytest.mark.slow
def test_grouping_a_group_with_more_nodes_merges_them_and_names_are_checked(window):
    a = window.adapter
    a.select_canvas([group_node(window, "forget gate"), a.node("fc")])
    assert window.group_selection("forget path")
    assert [g.name for g in window.cell.groups] == ["input gate", "output gate", "candidate", "forget path"]
    assert window.cell.groups[-1].nodes == [*FORGET, "fc"]
    for bad in ("", "   ", "two\nlines", "x" * 81):
        a.select(["c_new"])
        assert not window.group_selection(bad)
        assert "name" in window.statusBar().currentMessage()
    assert len(window.cell.groups) == 4


def test_the_plan_and_the_cuda_are_byte_identical_with_and_without_groups(window, tmp_path):
    grouped = window.cell.copy()
    assert window.export_cuda(tmp_path / "grouped.cu")
    window.actions_.select_all.trigger()
    window.actions_.ungroup.trigger()
    flat = window.cell.copy()
    assert grouped.groups and not flat.groups
    assert window.export_cuda(tmp_path / "flat.cu")
    assert (tmp_path / "grouped.cu").read_bytes() == (tmp_path / "flat.cu").read_bytes()
    sizes = window.sizes()
    for schedule in ("naive", "hoisted", "persistent"):
        assert describe(make_plan(grouped, sizes, schedule)) == describe(make_plan(flat, sizes, schedule))
    assert analyze(grouped).problems == analyze(flat).problems
    assert grouped.structure_hash() == flat.structure_hash()


@pytest.mark.slow
def test_groups_survive_save_and_reopen(make_window, window, tmp_path, same):
    a = window.adapter
    a.select_canvas([group_node(window, "candidate")])
    window.ungroup_selection()
    a.select(["fc", "ig", "c_new"])
    assert window.group_selection("cell state")
    group_node(window, "cell state").set_pos(900.0, -200.0)
    path = tmp_path / "grouped.cell.json"
    assert window.save_as(path)
    data = json.loads(path.read_text())
    assert data["groups"] == {"version": 1, "list": [g.to_json() for g in window.cell.groups]}
    assert load_cell(path).groups == window.cell.groups

    other = make_window(path)
    assert other.cell.groups == window.cell.groups
    assert [p.name() for p in group_node(other, "cell state").input_ports()] == ["c", "i", "f", "g"]
    assert group_node(other, "cell state").pos() == [900.0, -200.0]
    assert same(other.cell, window.cell) and not other.is_modified()


@pytest.mark.slow
def test_copy_paste_of_a_group(window):
    a = window.adapter
    a.select_canvas([group_node(window, "forget gate")])
    window.actions_.copy.trigger()
    n = len(window.cell.nodes)
    window.actions_.paste.trigger()
    cell = window.cell
    assert len(cell.nodes) == n + len(FORGET)
    pasted = cell.groups[-1]
    assert pasted.name == "forget gate" and pasted.nodes == [f"{i}1" for i in FORGET]
    assert cell.node("xf1").args == ["", "W_f1"]  # the wire from x, outside the copy, is not kept
    assert a.selected_ids() == pasted.nodes  # the pasted group's node is selected
    assert len([g for g in a.group_nodes() if g.name() == "forget gate"]) == 2
    window.actions_.undo.trigger()
    assert len(window.cell.nodes) == n and [g.name for g in window.cell.groups] == GATES

    # Pasted into an open group, the nodes join it: groups do not nest.
    a.open_group_of("i")
    window.actions_.paste.trigger()
    assert [g.name for g in window.cell.groups] == GATES
    assert window.cell.groups[0].nodes[-len(FORGET):] == [f"{i}1" for i in FORGET]


@pytest.mark.slow
def test_double_click_opens_a_group_and_the_path_returns(qtbot, window):
    a = window.adapter
    forget = group_node(window, "forget gate")
    view = window.canvas
    centre = forget.view.sceneBoundingRect().center() + QtCore.QPointF(0.0, 12.0)  # below the title
    qtbot.mouseDClick(view.viewport(), QtCore.Qt.MouseButton.LeftButton, pos=view.mapFromScene(centre))
    assert a.open_group == "forget gate"
    assert window.breadcrumb.path() == ["LSTM", "forget gate"]
    assert window.statusBar().currentMessage().startswith("Group 'forget gate'")
    assert shown_ids(window) == set(FORGET)
    stubs = sorted(item.text for item in a._group_items if hasattr(item, "text"))
    assert stubs == ["f", "h", "x"]  # what enters the group and what leaves it
    # Every node shown is in view.
    port = view.mapToScene(view.viewport().rect()).boundingRect()
    assert all(port.contains(n.view.sceneBoundingRect()) for n in a.members(forget))

    # A node added inside joins the group; it goes with the undo.
    added = window.add_node("tanh")
    assert window.cell.groups[1].nodes == [*FORGET, added]
    window.actions_.undo.trigger()
    assert window.cell.groups[1].nodes == FORGET

    qtbot.mouseClick(window.breadcrumb.cell_button, QtCore.Qt.MouseButton.LeftButton)
    assert a.open_group is None and window.breadcrumb.path() == []
    assert not window.statusBar().currentMessage()  # the group's hint went with it
    assert forget.view.isVisible() and forget.view.isSelected()
    assert not shown_ids(window) & set(FORGET)


@pytest.mark.slow
def test_a_problem_inside_a_closed_group_marks_its_node_and_showing_the_node_opens_it(window):
    a = window.adapter
    a.disconnect("af_b", "b")
    forget = group_node(window, "forget gate")
    assert forget.item.mark == "error" and any("af_b" in line for line in forget.item.mark_lines)
    assert group_node(window, "input gate").item.mark is None
    window.show_node("af_b")  # as a click in the Problems list does
    assert a.open_group == "forget gate" and a.selected_ids() == ["af_b"]
    window.actions_.undo.trigger()
    assert a.open_group == "forget gate" and forget.item.mark is None
    window.show_node("fc")  # outside the open group: back to the whole cell
    assert a.open_group is None and a.selected_ids() == ["fc"]


@pytest.mark.slow
def test_undoing_the_grouping_of_the_open_group_goes_back_to_the_whole_cell(window):
    a = window.adapter
    a.select(["fc", "ig"])
    assert window.group_selection("products")
    a.open_group_of("fc")
    assert window.breadcrumb.path() == ["LSTM", "products"]
    window.actions_.undo.trigger()
    assert a.open_group is None and window.breadcrumb.path() == []
    assert {"fc", "ig"} <= shown_ids(window)


def test_a_file_without_groups_loads_as_before(make_window, tmp_path):
    cell = load_template("elman")
    assert not cell.groups
    path = tmp_path / "elman.cell.json"
    path.write_text(json.dumps(cell.to_json()))
    w = make_window(path)
    assert w.cell.groups == [] and not w.adapter.group_nodes()
    assert "groups" not in w.cell.to_json()


@pytest.mark.slow
def test_rename_a_group_by_f2_undo_redo_and_save(qtbot, make_window, window, monkeypatch, tmp_path):
    a = window.adapter
    asked: list[str] = []
    answer = ["forget"]
    monkeypatch.setattr(dialogs, "ask_group_name", lambda parent, suggested: asked.append(suggested)
                        or answer[0])
    a.select_canvas([group_node(window, "forget gate")])
    press(qtbot, window, QtCore.Qt.Key.Key_F2, QtCore.Qt.KeyboardModifier.NoModifier)
    assert asked == ["forget gate"]  # the dialog offers the name it has
    assert [g.name for g in window.cell.groups] == ["input gate", "forget", "output gate", "candidate"]
    assert window.cell.groups[1].nodes == FORGET and window.is_modified()
    assert group_node(window, "forget").view.isVisible()

    answer[0] = "  "  # the rules of Ctrl+G: a name cannot be blank
    assert not window.rename_group_selection()
    assert "empty" in window.statusBar().currentMessage()
    assert window.cell.groups[1].name == "forget"

    window.actions_.undo.trigger()  # the rename is one step
    assert [g.name for g in window.cell.groups] == GATES and not window.is_modified()
    window.actions_.redo.trigger()
    assert window.cell.groups[1].name == "forget"

    # In an open group, the rename acts on it and the path above the canvas follows, undo included.
    a.open_group_of("f")
    assert window.breadcrumb.path() == ["LSTM", "forget"]
    assert window.rename_group_selection("forget gate (f)")
    assert window.breadcrumb.path() == ["LSTM", "forget gate (f)"]
    window.actions_.undo.trigger()
    assert window.breadcrumb.path() == ["LSTM", "forget"] and a.open_group == "forget"
    window.actions_.redo.trigger()
    a.close_group()

    edit = next(m.menu() for m in window.menuBar().actions() if m.text() == "&Edit")
    assert window.actions_.rename_group in edit.actions()
    assert window.actions_.rename_group in a.graph.get_context_menu("graph").qmenu.actions()

    path = tmp_path / "renamed.cell.json"
    assert window.save_as(path)
    other = make_window(path)
    assert [g.name for g in other.cell.groups] == ["input gate", "forget gate (f)", *GATES[2:]]
    assert other.cell.groups[1].nodes == FORGET and not other.is_modified()


@pytest.mark.slow
def test_f2_with_no_group_selected_says_what_to_select(window):
    window.adapter.select(["fc"])
    assert not window.rename_group_selection("anything")
    assert window.statusBar().currentMessage() == "Select one group to rename"
    assert [g.name for g in window.cell.groups] == GATES


@pytest.mark.slow
def test_the_output_node_added_in_an_open_group_goes_to_the_whole_cell_and_shows_it(window):
    a = window.adapter
    a.select_canvas([a.output_node()])
    a.delete_selected()
    assert a.output_node() is None
    a.open_group_of("f")
    window.add_node("output")
    sink = a.output_node()
    assert sink is not None and a.open_group is None and window.breadcrumb.path() == []
    assert sink.view.isVisible() and a.graph.selected_nodes() == [sink]
    assert "whole cell" in window.statusBar().currentMessage()
    view = window.canvas
    assert view.mapToScene(view.viewport().rect()).boundingRect().contains(sink.view.sceneBoundingRect())
    assert [g.name for g in window.cell.groups] == GATES
    assert window.cell.groups[1].nodes == FORGET
    window.actions_.undo.trigger()
    assert a.output_node() is None

    window.actions_.undo.trigger()  # the deletion: the cell has its output node again
    # Asked for from inside a group, the output node the cell has is shown, selected.
    a.open_group_of("f")
    window.add_node("output")
    assert a.open_group is None and a.output_node().view.isVisible()
    assert a.graph.selected_nodes() == [a.output_node()]
    assert "one output node" in window.statusBar().currentMessage()


def test_a_new_group_does_not_land_on_another_node(window):
    """Grouping two nodes with a third between them: the group's node, where they were, would cover the
    third; it goes below, into free space."""
    a = window.adapter
    ids = [n.id for n in window.cell.nodes if any(c.view.isVisible() for c in a.canvas_nodes(n.id))]
    first, middle, last = ids[:3]
    a.node(first).set_pos(0.0, 0.0)
    height = a.node(first).view.sceneBoundingRect().height()
    a.node(middle).set_pos(0.0, height + 8.0)  # just below it: under the group's node, taller than a node
    a.node(last).set_pos(0.0, 300.0)
    others = [n.name() for n in a.graph.all_nodes() if n.view.isVisible() and n.name() not in ids[:3]]
    for i, name in enumerate(others):  # the rest out of the way
        a.node(name).set_pos(2000.0 + 300.0 * i, 0.0) if a.canvas_nodes(name) else None
    assert not overlapping_nodes(window)
    window.adapter.group([first, last], "ends")
    assert not overlapping_nodes(window), overlapping_nodes(window)
