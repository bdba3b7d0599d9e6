"""Getting around the canvas and adding to it as in other node editors: find a node by name (Ctrl+F),
the minimap, a wire dropped on empty canvas opening the search for what takes it, new nodes in free
space, and Auto Layout (Ctrl+L) laying the cell as it is now out again."""

from __future__ import annotations

import pytest
from PySide6 import QtCore

from cellfuse.app.node_item import CellNodeItem

LEFT = QtCore.Qt.MouseButton.LeftButton
CTRL = QtCore.Qt.KeyboardModifier.ControlModifier


def node_rects(window) -> list:
    return [i.sceneBoundingRect() for i in window.canvas.scene().items()
            if isinstance(i, CellNodeItem) and i.isVisible()]


def view_centre(window) -> QtCore.QPointF:
    return window.canvas.visible_scene_rect().center()


def test_ctrl_f_finds_a_node_by_part_of_its_name_and_goes_to_it(qtbot, window):
    finder = window.adapter.graph.finder
    window.actions_.find.trigger()
    assert finder.isVisible() and finder.edit.hasFocus()
    qtbot.keyClicks(finder.edit, "H_NE")  # any part, any case
    qtbot.keyClick(finder.edit, QtCore.Qt.Key.Key_Return)
    assert not finder.isVisible()
    assert window.adapter.selected_ids() == ["h_new"]
    node = window.adapter.node("h_new").view.sceneBoundingRect()
    assert (view_centre(window) - node.center()).manhattanLength() < 8.0  # whole pixels of the view
    # A node inside a group: the group opens on it.
    window.actions_.find.trigger()
    finder.edit.setText("xi")
    qtbot.keyClick(finder.edit, QtCore.Qt.Key.Key_Return)
    assert window.adapter.open_group == "input gate" and window.adapter.selected_ids() == ["xi"]
    # A name no node has: said, and the field stays.
    window.actions_.find.trigger()
    finder.edit.setText("nothing_like_it")
    qtbot.keyClick(finder.edit, QtCore.Qt.Key.Key_Return)
    assert finder.isVisible() and "nothing_like_it" in finder.message.text()
    qtbot.keyClick(finder.edit, QtCore.Qt.Key.Key_Escape)
    assert not finder.isVisible()


def test_the_minimap_shows_every_node_and_a_click_there_moves_the_canvas(qtbot, window):
    minimap = window.adapter.graph.minimap
    minimap.refresh()
    assert minimap.isVisible() and len(minimap._boxes) == len(node_rects(window))
    canvas = window.canvas
    assert canvas.rect().contains(minimap.geometry())  # in the canvas's corner
    window.adapter.node("x").view.setSelected(False)
    target = window.adapter.node("x").view.sceneBoundingRect().center()
    t = minimap._transform()
    qtbot.mouseClick(minimap, LEFT, pos=t.map(target).toPoint())
    assert (view_centre(window) - target).manhattanLength() < 12.0  # a minimap pixel is many of the scene's
    window.actions_.minimap.trigger()
    assert not minimap.isVisible()


def free_point(window) -> QtCore.QPoint:
    """A point of the canvas's viewport with nothing under it, right of the cell."""
    canvas = window.canvas
    right = max(r.right() for r in node_rects(window))
    window.canvas.centre_at(QtCore.QPointF(right, view_centre(window).y()))
    scene = canvas.visible_scene_rect()
    for fraction in (0.8, 0.7, 0.9, 0.6):
        p = QtCore.QPointF(scene.left() + fraction * scene.width(), scene.center().y())
        if not canvas.scene().items(p):
            return canvas.mapFromScene(p)
    raise AssertionError("no free point")


def drop_wire(qtbot, window, port_view, monkeypatch, pick: str) -> list[str]:
    """Drags a wire from `port_view` to empty canvas and picks `pick` in the search that opens; returns
    the names the search offered."""
    canvas = window.canvas
    menu = window.adapter.graph.search_menu
    offered = []

    def exec_(*_args):
        offered.extend(menu.names())
        menu._actions[pick].trigger()

    monkeypatch.setattr(menu, "exec_", exec_)
    end = free_point(window)
    start = canvas.mapFromScene(port_view.sceneBoundingRect().center())
    qtbot.mousePress(canvas.viewport(), LEFT, pos=start)
    qtbot.mouseMove(canvas.viewport(), pos=end)
    qtbot.mouseRelease(canvas.viewport(), LEFT, pos=end)
    qtbot.waitUntil(lambda: bool(offered), timeout=2000)
    return offered


def test_a_wire_dropped_on_empty_canvas_offers_what_takes_it_and_wires_the_pick_in(qtbot, window,
                                                                                   monkeypatch):
    a = window.adapter
    before = {n.id for n in window.cell.nodes}
    steps = a.undo_stack().count()
    offered = drop_wire(qtbot, window, a.node("tc").output(0).view, monkeypatch, "sigmoid")
    assert "sigmoid" in offered and "output" in offered
    assert not {"input", "weight", "state", "const"} & set(offered)  # they take no value
    new = [n for n in window.cell.nodes if n.id not in before]
    assert [n.op for n in new] == ["sigmoid"] and new[0].args == ["tc"]
    rects = node_rects(window)
    assert not any(r.intersects(q) for i, r in enumerate(rects) for q in rects[i + 1:])
    assert a.undo_stack().count() == steps + 1  # one undo step
    window.actions_.undo.trigger()
    assert {n.id for n in window.cell.nodes} == before


@pytest.mark.slow
def test_a_wire_dropped_from_an_empty_input_offers_what_gives_a_value(qtbot, window, monkeypatch):
    a = window.adapter
    mul = window.add_node("mul")
    a.fit()
    offered = drop_wire(qtbot, window, a.node(mul).input_ports()[1].view, monkeypatch, "weight")
    assert "weight" in offered and "output" not in offered
    weight = window.cell.node(mul).args[1]
    assert window.cell.node(weight).op == "weight"


def test_a_node_asked_for_on_top_of_others_lands_beside_them_and_ctrl_l_lays_it_out(qtbot, window, crossings):
    a = window.adapter
    graph = a.graph
    tc = a.node("tc").view.sceneBoundingRect()
    graph._on_search_triggered(a.node_search_names()["tanh"][0], (tc.x() + 10.0, tc.y() + 10.0))
    rects = node_rects(window)
    assert not any(r.intersects(q) for i, r in enumerate(rects) for q in rects[i + 1:])
    a.connect("tc", "tanh", 0)
    window.canvas.setFocus()
    qtbot.keyClick(window.canvas, QtCore.Qt.Key.Key_L, CTRL)
    assert a.node("tanh").pos()[0] > a.node("tc").pos()[0]  # a column right of what feeds it
    rects = node_rects(window)
    assert not any(r.intersects(q) for i, r in enumerate(rects) for q in rects[i + 1:])
    assert crossings(window) == []
