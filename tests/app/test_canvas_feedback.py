"""What the canvas tells a user who is wiring a cell: every problem at once (errors and the unused
nodes they leave), messages in the canvas's words, shapes on the ports, the Tab search by op name, the
last plan kept on the canvas while the cell has none, and a benchmark dock that fits a laptop."""

from __future__ import annotations

import pytest
from PySide6 import QtCore, QtWidgets

from cellfuse.app.plan_overlay import STALE_RGB, STALE_TAG


def problems_listed(window) -> dict[str, list[str]]:
    """The problems panel's rows: node -> the messages listed for it."""
    tree = window.problems.tree
    out: dict[str, list[str]] = {}
    for i in range(tree.topLevelItemCount()):
        item = tree.topLevelItem(i)
        out.setdefault(item.text(0), []).append(item.text(1))
    return out


def port(window, node_id: str, name: str, update: bool = False):
    node = window.adapter.update_node(node_id) if update else window.adapter.node(node_id)
    return next(p for p in [*node.input_ports(), *node.output_ports()] if p.name() == name)


def test_deleting_a_node_lists_its_error_and_the_nodes_it_leaves_unused(window):
    window.new_from_template("elman", ask=False)
    window.adapter.delete(["a"])  # the add of x @ W and h @ U
    listed = problems_listed(window)
    assert listed["a_b"] == ["port a of 'a_b' is not connected"]
    for matmul in ("xw", "hu"):
        assert listed[matmul] == ["no update or output depends on this node"]
        assert window.adapter.node(matmul).item.mark == "warning"
    assert window.adapter.node("a_b").item.mark == "error"
    summary = window.problems.summary.text()
    assert "error" in summary and "warning" in summary
    tree = window.problems.tree
    assert tree.topLevelItemCount() == len(window.info.problems)
    first, last = tree.topLevelItem(0), tree.topLevelItem(tree.topLevelItemCount() - 1)
    assert first.text(0) in ("a_b", "x") and last.text(1) == "no update or output depends on this node"


@pytest.mark.slow
def test_messages_name_the_ports_and_nodes_of_the_canvas(window):
    a = window.adapter
    window.new_from_template("elman", ask=False)
    a.connect("W", "xw", "a")  # the weight W into port a of the matmul, as well as into port W
    (message,) = problems_listed(window)["xw"]
    assert message == ("matmul 'xw': port a takes a [batch, input] value (the input, a state or one "
                       "computed from them); it gets 'W', a 2-D weight [input, hidden]")
    window.actions_.undo.trigger()

    a.disconnect("a", "a")  # port a empty, port b still wired: the message names port a
    assert problems_listed(window)["a"] == ["port a of 'a' is not connected"]
    window.show_node("a")
    rows = window.properties.inputs_label.text().split("<br/>")
    assert rows[0].startswith("a: ") and "not connected" in rows[0] and "hu" in rows[1]
    window.actions_.undo.trigger()

    a.update_node("h").input_ports()[0].clear_connections()
    (message,) = problems_listed(window)["h"]
    assert message.startswith("'h (next)' has no input: connect the update of state 'h'")
    assert "'updates'" not in message
    assert message in a.update_node("h").item.toolTip()


@pytest.mark.slow
def test_ports_show_the_shape_of_their_value(window):
    a = window.adapter
    window.new_from_template("elman", ask=False)
    assert port(window, "h", "out").view.toolTip() == "h: [batch, hidden]"
    assert port(window, "W", "out").view.toolTip() == "W: [input, hidden]"
    assert port(window, "xw", "a").view.toolTip() == "a: [batch, input] from 'x'"
    assert port(window, "xw", "W").view.toolTip() == "W: [input, hidden] from 'W'"
    assert port(window, "h", "value", update=True).view.toolTip() == "value: [batch, hidden] from 'h_new'"
    assert port(window, "h_new", "a").view.toolTip() == "a: [batch, hidden] from 'a_b'"
    for node in a.graph.all_nodes():
        for p in [*node.input_ports(), *node.output_ports()]:
            assert "multi" not in p.view.toolTip() and "single" not in p.view.toolTip()

    a.disconnect("xw", "a")
    assert port(window, "xw", "a").view.toolTip() == "a: not connected"
    # A node with an error has no shape; the rest of the cell keeps its shapes.
    assert port(window, "xw", "out").view.toolTip() == "xw: shape not known: see Problems"
    assert port(window, "hu", "out").view.toolTip() == "hu: [batch, hidden]"
    window.actions_.undo.trigger()
    a.set_weight_shape("W", ["hidden", "hidden"])
    assert port(window, "W", "out").view.toolTip() == "W: [hidden, hidden]"
    assert port(window, "xw", "W").view.toolTip() == "W: [hidden, hidden] from 'W'"


@pytest.mark.slow
def test_tab_search_lists_the_ops_by_their_names_only(window, monkeypatch):
    menu = window.adapter.graph.search_menu
    monkeypatch.setattr(menu, "exec_", lambda *_: None)  # it would wait for a click
    window.open_node_search()
    names = menu.names()
    assert sorted(names) == sorted(window.palette.ops())  # what the palette lists, in the op table's order
    assert names[-1] == "output" and "update" not in names
    assert not [a for a in menu.actions() if a.menu() is not None]  # no submenus
    assert not [a.text() for a in menu.actions() if "cellfuse" in a.text() or "." in a.text()]
    menu._on_text_changed("sigm")
    assert menu.names() == ["sigmoid"]
    menu._on_text_changed("")
    assert menu.names() == names
    window.open_node_search()  # again: the same list
    assert menu.names() == names
    # Picking a name adds that op, whether it was typed or picked from the whole list.
    menu._on_text_changed("tanh")
    menu._searched_actions[0].trigger()
    assert window.cell.has("tanh")
    window.open_node_search()
    next(a for a in menu.actions() if a.text() == "relu").trigger()
    assert window.cell.has("relu") and not window.cell.has("tanh1")


def outlines(window) -> list[QtWidgets.QGraphicsPathItem]:
    return [i for i in window.overlay._items if isinstance(i, QtWidgets.QGraphicsPathItem)]


def tag_of_xi(window) -> str:
    """The plan's tag on xi, seen with the input gate's group open; back to the whole cell after."""
    window.adapter.open_group_of("xi")
    tag = window.adapter.node("xi").item.plan_tag
    window.adapter.close_group()
    return tag


def test_the_last_plan_stays_outlined_marked_out_of_date_while_the_cell_has_an_error(window):
    window.plan_panel.set_schedule("hoisted")
    before = [r.name for r in window.overlay.regions]
    assert tag_of_xi(window) == "hoisted" and not window.overlay.out_of_date
    window.adapter.disconnect("h_new", "b")
    window.refresh_plan()
    overlay = window.overlay
    assert overlay.out_of_date and window.plan_panel.out_of_date and window.cuda_view.out_of_date
    assert [r.name for r in overlay.regions] == before
    drawn = outlines(window)
    assert len(drawn) == len(before)
    for item in drawn:
        c = item.pen().color()
        assert (c.red(), c.green(), c.blue()) == STALE_RGB
        assert item.pen().style() == QtCore.Qt.PenStyle.DotLine
        assert item.toolTip().startswith("<qt><b>Out of date")
    assert overlay.labels and all(lab.text.startswith(f"{STALE_TAG} · ") for lab in overlay.labels)
    assert tag_of_xi(window) == ""  # no tag that claims to be current

    window.adapter.delete(["ai_b"])  # a node deleted since drops out of the outlines
    window.refresh_plan()
    assert window.overlay.out_of_date
    assert all("ai_b" not in lab.nodes for lab in overlay.labels)

    window.actions_.undo.trigger()
    window.actions_.undo.trigger()
    window.refresh_plan()
    assert not overlay.out_of_date and not window.plan_panel.out_of_date
    for region in overlay.regions:
        c = overlay.outline_of(region.name).pen().color()
        assert (c.red(), c.green(), c.blue()) == region.rgb
    assert tag_of_xi(window) == "hoisted"


@pytest.mark.slow
def test_another_cell_does_not_inherit_the_outlines_of_the_last(window):
    window.new_cell(ask=False)  # no plan: the LSTM's outlines are not this cell's, out of date or not
    assert not window.overlay.regions and not window.overlay._items


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1366, 768), (1280, 720)])
def test_the_benchmark_settings_fit_their_dock_without_scrolling(qapp, window, size):
    window.resize(*size)
    window.arrange_docks()
    window.bench_dock.raise_()
    for _ in range(3):
        qapp.processEvents()
    scroll = window.bench_panel.settings_scroll
    hint = scroll.widget().sizeHint()
    room = scroll.viewport().size()
    assert hint.width() <= room.width() and hint.height() <= room.height(), (hint, room)
    assert not scroll.horizontalScrollBar().isVisible() and not scroll.verticalScrollBar().isVisible()


@pytest.mark.slow
def test_schedules_and_baselines_are_ticked_in_lists_that_say_what_is_ticked(window):
    panel = window.bench_panel
    button = panel.schedules_button
    n = len(panel.schedule_checks)
    assert button.text() == f"all {n}"
    panel.schedule_checks["naive"].setChecked(False)
    assert button.text() == f"{n - 1} of {n}" and "naive" not in panel.schedules()
    assert "naive" not in button.toolTip() and "fused" in button.toolTip()
    for check in panel.baseline_checks.values():
        check.setChecked(False)
    assert panel.baselines_button.text() == "none" and panel.baselines() == []
    # Each box is in the button's drop-down list.
    listed = [a.defaultWidget() for a in button.menu().actions() if isinstance(a, QtWidgets.QWidgetAction)]
    assert listed == list(panel.schedule_checks.values())


@pytest.mark.slow
def test_a_half_wired_node_is_saved_and_reopened_with_the_same_port_empty(window, tmp_path):
    window.new_from_template("elman", ask=False)
    window.adapter.disconnect("a", "a")
    assert window.cell.node("a").args == ["", "hu"]
    path = tmp_path / "half.cell.json"
    assert window.save_as(path)
    messages = []
    window.adapter.message.connect(messages.append)
    assert window.open_file(path, ask=False)
    assert window.cell.node("a").args == ["", "hu"]
    assert [p.name() for p in window.adapter.node("a").input_ports() if p.connected_ports()] == ["b"]
    assert problems_listed(window)["a"] == ["port a of 'a' is not connected"]
    assert not [m for m in messages if "Not shown" in m]


def test_tab_search_opens_at_the_cursor(window, monkeypatch):
    """NodeGraphQt moves the search to the cursor in the canvas's coordinates; the menu is a window of its
    own, so the place is mapped to the screen's (it opened at the screen's top left)."""
    menu = window.adapter.graph.search_menu
    viewer = window.adapter.graph.viewer()
    monkeypatch.setattr(menu, "exec_", lambda *_: None)
    cursor = QtCore.QPoint(300, 200)
    menu.move(cursor)
    assert menu.pos() == viewer.mapToGlobal(cursor)
