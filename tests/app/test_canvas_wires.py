"""Wires on the canvas: none passes under a node it does not join (it would read as feeding that node),
the wires of the selected nodes are lit, and every panel follows the selection a click leaves."""

from __future__ import annotations

import pytest
from PySide6 import QtCore
from tiers import slow_beyond

from cellfuse.app import theme, wire_routing
from cellfuse.app.canvas_wires import LIT_Z

LEFT = QtCore.Qt.MouseButton.LeftButton


def lit(wire) -> bool:
    return wire.pen().color() == theme.qcolor(theme.SELECTED_COLOR) and wire.zValue() == LIT_Z


def test_a_route_leaves_the_ports_level_and_keeps_clear_of_the_nodes_in_its_way():
    a, b = (0.0, 200.0), (600.0, 0.0)
    box = (380.0, -40.0, 520.0, 40.0)  # just left of b, at its height: the curve runs through it
    assert wire_routing.curve_crossings(wire_routing.curve(a, b, 150.0), [box])
    corners = wire_routing.route(a, b, [box], 150.0)
    assert corners is not None and corners[0] == a and corners[-1] == b
    assert corners[1][1] == a[1] and corners[-2][1] == b[1]  # level out of a, level into b
    assert not wire_routing.polyline_crossings(corners, [box])
    assert wire_routing.route(a, b, [(700.0, 0.0, 800.0, 50.0)], 150.0) is None  # nothing in the way


def test_no_wire_of_the_lstm_runs_under_a_node_it_does_not_join(window, crossings):
    # The output gate's value went to h_new under tc, as if tc fed h_new twice.
    assert crossings(window) == []
    window.adapter.select_all()
    window.ungroup_selection()
    window.adapter.auto_layout()
    assert crossings(window) == []


@pytest.mark.parametrize("name", slow_beyond(["gru", "layernorm_lstm", "peephole_lstm", "indrnn", "sru"], 1))
def test_auto_layout_leaves_no_wire_under_a_node(window, name, crossings):
    """The layout keeps a lane for a wire in each column it crosses; the wire takes it."""
    window.new_from_template(name, ask=False)
    window.adapter.select_all()
    window.ungroup_selection()
    window.actions_.auto_layout.trigger()
    assert crossings(window) == []


def test_the_wires_of_the_selected_nodes_are_lit_and_stay_lit_while_an_end_is_selected(qtbot, window, wires):
    a = window.adapter
    tc, c_new = a.node("tc"), a.node("c_new")
    into_tc = [w for w, ends in wires(window) if ends == {c_new.view, tc.view}]
    c_new_only = [w for w, ends in wires(window) if c_new.view in ends and tc.view not in ends]
    assert into_tc and c_new_only
    a.select(["c_new", "tc"])
    qtbot.waitUntil(lambda: all(lit(w) for w in into_tc + c_new_only), timeout=2000)
    # A click on tc, one of the two selected, leaves it alone selected: c_new's other wires go dark, the
    # wire between them stays lit (NodeGraphQt darkened it with c_new).
    viewer = window.canvas
    qtbot.mouseClick(viewer.viewport(), LEFT, pos=viewer.mapFromScene(tc.view.sceneBoundingRect().center()))
    qtbot.waitUntil(lambda: not any(lit(w) for w in c_new_only), timeout=2000)
    assert all(lit(w) for w in into_tc)
    lit_now = [w for w, _ in wires(window) if lit(w)]
    assert lit_now and all(tc.view in ends for w, ends in wires(window) if w in lit_now)


@pytest.mark.parametrize("how", ["term", pytest.param("plan", marks=pytest.mark.slow)])
def test_every_panel_follows_the_selection_a_click_on_the_canvas_leaves(qtbot, window, how, monkeypatch):
    a = window.adapter
    shown = []  # what the equations panel was told last
    monkeypatch.setattr(window.equations_panel, "show_selection", lambda ids: shown.append(list(ids)))
    if how == "term":  # the forget gate's sigmoid term: the gate's nodes, shown by their group's node
        forget = next(eq for eq in window.equations_panel.equations if eq.name == "f")
        window.equations_panel.nodes_activated.emit(list(forget.rhs[0].nodes))
    else:
        item = window.plan_panel.tree.topLevelItem(2)  # the fused kernel: ten nodes and more
        window.plan_panel.tree.itemClicked.emit(item, 0)
    assert len(a.selected_ids()) > 5
    one = a.graph.selected_nodes()[0]
    viewer = window.canvas
    qtbot.mouseClick(viewer.viewport(), LEFT, pos=viewer.mapFromScene(one.view.sceneBoundingRect().center()))
    assert [n.id for n in a.graph.selected_nodes()] == [one.id]
    ids = a.selected_ids()
    props = window.properties
    if len(ids) == 1:
        assert props.stack.currentWidget() is props.node_page and props.id_edit.text() == ids[0]
    else:  # a group's node stands for its members
        assert props.multi_label.text().startswith(f"{len(ids)} nodes selected")
    assert shown[-1] == ids

