"""The equations panel: the LSTM as a paper prints it, kept in step with every edit, terms that select
their nodes when clicked, and the formula entry, whose formula is one undo step or a pointed error."""

from __future__ import annotations

import pytest
from PySide6 import QtCore, QtGui, QtWidgets

from cellfuse.app.equations_panel import SELECTED_COLOR, UNUSED_COLOR
from cellfuse.graph_model import equations, load_template

FORMULA = "q = sigmoid(x @ W_q + h @ U_q + b_q)"


def equations_shown(qtbot, window):
    """The panel on show, its equations drawn."""
    window.equations_dock.show()
    window.equations_dock.raise_()
    return drawn_all(qtbot, window.equations_panel)


def drawn_all(qtbot, panel):
    """The panel once it has drawn the equations it shows (terms it has not seen before are rendered
    between events)."""
    qtbot.waitUntil(panel.up_to_date, timeout=10_000)
    return panel


def shown_text(panel) -> str:
    return "".join(f"{e.text}\n" for e in panel.equations)


def template_text(name: str) -> str:
    return "".join(f"{e.text}\n" for e in equations(load_template(name)))


def drawn(panel, text: str):
    """The drawn term of that plain text (the first one), and its term."""
    return next((item, item.term) for item in panel.items if item.term.text == text)


def click(qtbot, panel, item) -> None:
    """A left click in the middle of a drawn term, as a user's mouse gives it."""
    qtbot.mouseClick(panel.view, QtCore.Qt.MouseButton.LeftButton, pos=item.rect.center().toPoint())


def type_formula(qtbot, panel, formula: str) -> None:
    panel.entry.clear()
    qtbot.keyClicks(panel.entry, formula)
    qtbot.keyClick(panel.entry, QtCore.Qt.Key.Key_Return)


@pytest.mark.slow
def test_the_panel_shows_the_lstm(qtbot, qapp, window):
    panel = equations_shown(qtbot, window)
    assert window.equations_dock in window.panel_docks
    assert shown_text(panel) == template_text("lstm")
    shown = [item.image.shown for item in panel.items]
    assert shown[:3] == ["$i$", "$=$", r"$\sigma($"] and "$c'$" in shown and r"$f \odot c$" in shown
    assert panel.view.width() > 200 and not panel.message.isVisible()


@pytest.mark.slow
def test_the_panel_is_drawn_when_it_is_first_shown(qtbot, qapp, window):
    window.problems_dock.raise_()
    qapp.processEvents()
    window.adapter.rename("g", "cand")
    panel = window.equations_panel
    assert "cand = tanh(x @ W_g + h @ U_g + b_g)" in shown_text(panel)  # known at once, drawn later
    equations_shown(qtbot, window)
    assert any(item.term.text == "cand" for item in panel.items)


def test_the_panel_follows_every_edit_and_undo(qtbot, qapp, window, user):
    panel = equations_shown(qtbot, window)
    user.rename("f", "forget")
    assert "forget = sigmoid(x @ W_f + h @ U_f + b_f)" in shown_text(panel)
    assert "c' = forget * c + i * g" in shown_text(panel)
    drawn_all(qtbot, panel)
    assert any(item.term.text == "forget * c" for item in panel.items)
    window.adapter.disconnect("c_new", "b")
    assert "c' = forget * c + ?" in shown_text(panel)
    window.actions_.undo.trigger()
    window.actions_.undo.trigger()
    assert shown_text(panel) == template_text("lstm")


def selected_stubs(window) -> list[str]:
    return [item.text for item in window.adapter._group_items if getattr(item, "selected", False)]


@pytest.mark.slow
def test_clicking_a_term_selects_its_nodes(qtbot, qapp, window):
    a = window.adapter
    panel = equations_shown(qtbot, window)
    item, term = drawn(panel, "x @ W_f")
    click(qtbot, panel, item)
    assert set(a.selected_ids()) == {"xf", "x", "W_f"} == set(term.nodes)
    assert window.central_tabs.currentWidget() is window.canvas
    assert panel.color_of(item) == SELECTED_COLOR  # the term takes the selection's colour
    # The group that holds the product opens on it; x, outside, is the stub of the value entering it.
    assert a.open_group == "forget gate"
    assert {n.name() for n in a.graph.selected_nodes()} == {"xf", "W_f"}
    assert selected_stubs(window) == ["x"]
    head, term = drawn(panel, "tanh(")  # the candidate's head: the whole candidate
    click(qtbot, panel, head)
    assert set(a.selected_ids()) == set(term.nodes) >= {"g", "ag_b", "ag", "xg", "hg"}
    assert a.open_group == "candidate" and sorted(selected_stubs(window)) == ["h", "x"]
    # A term over nodes of a group and nodes outside it that the group's stubs do not show: the whole
    # cell, the group's node selected for the one member the term names.
    item, term = drawn(panel, "f * c")
    click(qtbot, panel, item)
    assert set(a.selected_ids()) == {"fc", "f", "c"} == set(term.nodes)
    assert a.open_group is None
    assert {n.name() for n in a.graph.selected_nodes()} == {"fc", "forget gate", "c"}
    assert panel.color_of(item) == SELECTED_COLOR
    # A click on the group's node on the canvas picks the whole group.
    forget = next(g for g in a.group_nodes() if g.name() == "forget gate")
    view = window.canvas
    centre = view.mapFromScene(forget.view.sceneBoundingRect().center() + QtCore.QPointF(0.0, 12.0))
    qtbot.mouseClick(view.viewport(), QtCore.Qt.MouseButton.LeftButton, pos=centre)
    assert set(a.selected_ids()) == {m.name() for m in a.members(forget)}


@pytest.mark.slow
def test_the_wheel_is_left_to_the_scroll_area(qtbot, qapp, window):
    """The drawn equations ignore the wheel: Qt hands it on to the scroll area around."""
    panel = equations_shown(qtbot, window)
    centre = QtCore.QPointF(panel.view.width() / 2, 20)
    down = QtCore.QPoint(0, -120)  # one notch of the wheel, towards the user
    wheel = QtGui.QWheelEvent(centre, panel.view.mapToGlobal(centre), QtCore.QPoint(0, 0), down,
                              QtCore.Qt.MouseButton.NoButton, QtCore.Qt.KeyboardModifier.NoModifier,
                              QtCore.Qt.ScrollPhase.NoScrollPhase, False)
    QtWidgets.QApplication.sendEvent(panel.view, wheel)
    assert not wheel.isAccepted()


@pytest.mark.slow
def test_a_click_between_terms_selects_nothing(qtbot, qapp, window):
    panel = equations_shown(qtbot, window)
    window.adapter.select(["xf"])
    qtbot.mouseClick(panel.view, QtCore.Qt.MouseButton.LeftButton, pos=QtCore.QPoint(2, 2))
    assert window.adapter.selected_ids() == ["xf"]


def test_a_typed_formula_is_one_undo_step(qtbot, qapp, window, same):
    panel = equations_shown(qtbot, window)
    stack = window.adapter.undo_stack()
    before, steps = window.cell.copy(), stack.index()
    type_formula(qtbot, panel, FORMULA)
    assert stack.index() == steps + 1
    assert window.cell.node("q").op == "sigmoid" and window.cell.node("W_q").shape == ["input", "hidden"]
    assert panel.entry.text() == "" and not panel.error.isVisible()
    assert f"{FORMULA}\n" in shown_text(panel)
    assert next(eq for eq in panel.equations if eq.name == "q").kind == "unused"  # nothing uses q yet
    drawn_all(qtbot, panel)
    assert panel.color_of(drawn(panel, "q")[0]) in (UNUSED_COLOR, SELECTED_COLOR)
    # named from the formula: what each computes, or, too long for a title, the left side and the op
    added = {"W_q", "xW_q", "U_q", "hU_q", "xW_q_plus_hU_q", "b_q", "q_plus", "q"}
    assert set(window.adapter.selected_ids()) == added
    every = [n for n in window.adapter.graph.all_nodes() if n.view.isVisible()]  # not those in closed groups
    for a in (n for i in added for n in window.adapter.canvas_nodes(i)):  # nothing lands on another node
        assert not any(b is not a and a.view.sceneBoundingRect().intersects(b.view.sceneBoundingRect())
                       for b in every), a.name()
    window.actions_.undo.trigger()
    assert same(window.cell, before)
    window.actions_.redo.trigger()
    assert window.cell.node("q").args == ["q_plus"]


@pytest.mark.slow
def test_an_elman_rnn_typed_into_a_new_cell(qtbot, qapp, window):
    window.new_cell(ask=False)
    panel = equations_shown(qtbot, window)
    steps = window.adapter.undo_stack().index()
    for formula in ["a = x @ W + h @ U + b", "h' = tanh(a)", "y = h'"]:
        type_formula(qtbot, panel, formula)
        assert not panel.error.isVisible(), panel.error.text()
    assert window.adapter.undo_stack().index() == steps + 3
    assert window.info.ok, window.info.problems
    assert shown_text(panel) == template_text("elman")


@pytest.mark.slow
def test_a_bad_formula_is_pointed_at_and_adds_nothing(qtbot, qapp, window, same):
    panel = equations_shown(qtbot, window)
    stack = window.adapter.undo_stack()
    before, steps = window.cell.copy(), stack.index()
    type_formula(qtbot, panel, "q = sigmoid(x @")
    assert panel.error.isVisible() and panel.error.text().startswith("Column 12: ")
    assert panel.pointer.text() == "q = sigmoid(x @\n           ^"
    assert panel.entry.text() == "q = sigmoid(x @" and panel.entry.cursorPosition() == 11
    assert stack.index() == steps and same(window.cell, before)
    qtbot.keyClicks(panel.entry, " W_q)")
    assert not panel.error.isVisible()  # typing on clears it
    type_formula(qtbot, panel, "q = eval('1')")
    assert "'eval' is not a function" in panel.error.text()
    assert stack.index() == steps and same(window.cell, before)


@pytest.mark.slow
def test_the_shortcut_opens_the_formula_entry(qtbot, qapp, window):
    window.problems_dock.raise_()
    window.activateWindow()
    qapp.processEvents()
    assert window.actions_.formula.shortcut().toString() == "Ctrl+Shift+F"
    window.actions_.formula.trigger()
    qapp.processEvents()
    assert not window.equations_dock.visibleRegion().isEmpty()
    assert QtWidgets.QApplication.focusWidget() is window.equations_panel.entry
