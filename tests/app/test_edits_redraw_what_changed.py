"""An edit draws again only what it changes: a move sets no node's marks, no port's tooltip and no wire's
colour again, a change of the selection styles only the wires lit and those of the nodes selected, and
the plan's outlines keep the shapes of the regions no node of which moved. These tests check that what
is drawn is still what the cell and the selection say after edits that change it."""

from __future__ import annotations

from PySide6 import QtCore

from cellfuse.app import node_marks, plan_overlay, theme
from cellfuse.app.canvas_wires import LIT_Z, CellPipe


def port(window, node_id: str, name: str):
    node = window.adapter.node(node_id)
    return next(p for p in [*node.input_ports(), *node.output_ports()] if p.name() == name)


def move(node, dx: float = 40.0) -> None:
    x, y = node.pos()
    node.set_pos(x + dx, y)


def lit(wire) -> bool:
    return wire.pen().color() == theme.qcolor(theme.SELECTED_COLOR) and wire.zValue() == LIT_Z


def test_marks_follow_the_edits_that_change_them_and_a_move_sets_none(window, monkeypatch):
    a = window.adapter
    window.new_from_template("elman", ask=False)
    a_b = a.node("a_b")
    assert a_b.item.mark is None and a_b.item.shape_text == "[batch, hidden]"
    assert port(window, "a_b", "a").view.toolTip() == "a: [batch, hidden] from 'a'"

    called: list[str] = []
    for name in ("show_problems", "show_port_shapes", "color_wires"):
        real = getattr(node_marks, name)
        monkeypatch.setattr(node_marks, name, lambda *args, real=real, name=name: (called.append(name),
                                                                                   real(*args)))
    move(a_b)
    assert called == []  # a move changes no mark, shape, tooltip or colour
    a.disconnect("a_b", "a")
    assert a.node("a_b").item.mark == "error" and a.node("a_b").item.shape_text == ""
    assert port(window, "a_b", "a").view.toolTip() == "a: not connected"
    assert a.node("xw").item.mark == "warning"  # left unused
    assert set(called) == {"show_problems", "show_port_shapes", "color_wires"}
    called.clear()
    move(a.node("a_b"))
    assert called == [] and a.node("a_b").item.mark == "error"

    # A group of nodes with a problem takes the gravest; it changes no wire's colour.
    a.select(["a_b", "xw"])
    assert window.group_selection("g")
    group = next(g for g in a.group_nodes() if g.name() == "g")
    assert group.item.mark == "error"
    assert "color_wires" not in called and "show_port_shapes" in called
    tips = [p.view.toolTip() for p in [*group.input_ports(), *group.output_ports()]]
    assert tips and all(": " in t and "multi" not in t and "single" not in t for t in tips)

    window.actions_.undo.trigger()  # the group
    window.actions_.undo.trigger()  # the move
    window.actions_.undo.trigger()  # the wire taken off
    assert a.node("a_b").item.mark is None and a.node("xw").item.mark is None
    assert a.node("a_b").item.shape_text == "[batch, hidden]"
    assert port(window, "a_b", "a").view.toolTip() == "a: [batch, hidden] from 'a'"


def test_a_new_wire_has_its_nodes_colour_and_a_new_cell_its_own_marks(window):
    a = window.adapter
    window.new_from_template("elman", ask=False)
    a.disconnect("a_b", "a")
    a.connect("a", "a_b", 0)
    pipes = [p for p in window.canvas.all_pipes() if isinstance(p, CellPipe)]
    rgb = a.node("a").item.kind_rgb
    into = next(p for p in pipes if p.input_port is port(window, "a_b", "a").view)
    assert tuple(into.color) == (int(rgb[0] * 0.8), int(rgb[1] * 0.8), int(rgb[2] * 0.8), 255)
    # The same cell opened again: its nodes are new ones, marked again.
    a.disconnect("a_b", "a")
    window.new_from_template("elman", ask=False)
    assert a.node("a_b").item.mark is None and a.node("xw").item.mark is None
    assert a.node("a_b").item.shape_text == "[batch, hidden]"


def test_an_edit_keeps_the_selected_nodes_wires_lit_and_no_other(qtbot, window, wires):
    a = window.adapter
    tc, c_new = a.node("tc"), a.node("c_new")
    a.select(["tc"])
    of_tc = [w for w, ends in wires(window) if tc.view in ends]
    qtbot.waitUntil(lambda: all(lit(w) for w in of_tc), timeout=2000)
    assert not any(lit(w) for w, ends in wires(window) if tc.view not in ends)
    move(c_new)  # an edit: the groups' wires are drawn anew
    qtbot.wait(10)
    shown = wires(window)
    assert all(lit(w) for w, ends in shown if tc.view in ends)
    assert not any(lit(w) for w, ends in shown if tc.view not in ends)
    a.select(["c_new"])
    qtbot.waitUntil(lambda: not any(lit(w) for w, ends in wires(window) if c_new.view not in ends),
                    timeout=2000)
    assert all(lit(w) for w, ends in wires(window) if c_new.view in ends)
    a.select([])
    qtbot.waitUntil(lambda: not any(lit(w) for w, _ in wires(window)), timeout=2000)
    assert window.canvas.lit_wires == set()


def test_after_a_move_the_outlines_and_labels_are_those_drawn_from_scratch(window):
    a = window.adapter
    overlay = window.overlay
    region = next(r for r in overlay.regions if r.kind == "fused" and len(r.nodes) > 2)
    node = next(a.shown_nodes(i)[0] for i in region.nodes if a.shown_nodes(i))
    move(node, 90.0)
    moved = node.view.sceneBoundingRect()
    assert overlay.outline_of(region.name).path().intersects(moved)  # (a group's node: a slice of it)
    kept = ([o.path() for o in map(overlay.outline_of, (r.name for r in overlay.regions)) if o is not None],
            [(lbl.region, lbl.text, lbl.rect, lbl.shown) for lbl in overlay.labels])
    overlay._shape_cache.clear()
    overlay.refresh()
    fresh = ([o.path() for o in map(overlay.outline_of, (r.name for r in overlay.regions)) if o is not None],
             [(lbl.region, lbl.text, lbl.rect, lbl.shown) for lbl in overlay.labels])
    assert kept == fresh


def test_labels_keep_clear_of_nodes_however_far_the_view_is_zoomed_out():
    boxes = plan_overlay._Boxes([QtCore.QRectF(0, 0, 100, 50), QtCore.QRectF(5000, 0, 100, 50)], grid=4000.0)
    assert boxes.meets(QtCore.QRectF(90, 40, 20, 20))
    assert boxes.meets(QtCore.QRectF(-3000, -10, 3200, 20))
    assert not boxes.meets(QtCore.QRectF(200, 0, 4700, 50))
    boxes.add(QtCore.QRectF(300, 0, 100, 50), "label")
    assert boxes.owners(QtCore.QRectF(0, 0, 5200, 10)) == {None, "label"}
    assert boxes.owners(QtCore.QRectF(0, 0, 5200, 10), skip="label") == {None}
    boxes.remove("label")
    assert not boxes.meets(QtCore.QRectF(200, 0, 300, 50))
