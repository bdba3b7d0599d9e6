"""Level of detail on the canvas: zoomed out below COMPACT_BELOW, every node draws as a compact block
with a large title, a group's node as well, and the plan's outlines and the problem marks stay visible."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6 import QtCore, QtGui

from cellfuse.app import theme
from cellfuse.app.node_item import COMPACT_BELOW, COMPACT_MIN_TITLE_PX, COMPACT_TITLE_PX
from cellfuse.graph_model import load_template


def shown_items(window) -> list:
    """The node items the canvas shows (not those inside closed groups)."""
    return [n.view for n in window.adapter.graph.all_nodes() if n.view.isVisible()]


def show_ungrouped(window) -> None:
    """The LSTM with no groups, laid out as the editor lays out a cell it opens: its nodes one by one."""
    window.adapter.load(replace(load_template("lstm"), groups=[]), relayout=True)
    window.adapter.fit()
    assert not window.adapter.group_nodes()


def draw_at(window, scale: float) -> QtGui.QImage:
    """Zooms the canvas to `scale`, centred on the cell, and paints it; returns what it shows."""
    viewer = window.canvas
    viewer.setTransform(QtGui.QTransform.fromScale(scale, scale))
    nodes = [item.sceneBoundingRect() for item in shown_items(window)]
    viewer.centerOn(sum((r.center() for r in nodes), QtCore.QPointF()) / len(nodes))
    return viewer.grab().toImage()


def pixels_near(image: QtGui.QImage, rgb: theme.RGB, area: QtCore.QRect, tolerance: int = 10) -> int:
    """How many pixels of `area` have the colour `rgb`, each channel within `tolerance`."""
    count = 0
    area = area.intersected(image.rect())
    for y in range(area.top(), area.bottom() + 1):
        for x in range(area.left(), area.right() + 1):
            c = image.pixelColor(x, y)
            if max(abs(c.red() - rgb[0]), abs(c.green() - rgb[1]), abs(c.blue() - rgb[2])) <= tolerance:
                count += 1
    return count


def on_screen(window, node_id: str) -> QtCore.QRect:
    viewer = window.canvas
    rect = window.adapter.node(node_id).view.sceneBoundingRect()
    return viewer.mapFromScene(rect).boundingRect()


def fitted_compact_and_readable(window, least: int) -> list:
    """Fits the cell to the canvas and checks that each of the (at least `least`) nodes shown is drawn
    compact, with a title of a size the eye reads; returns their items."""
    window.adapter.select([])
    window.adapter.fit(margin=30.0)
    assert window.canvas.transform().m11() < COMPACT_BELOW
    window.canvas.grab()
    items = shown_items(window)
    assert len(items) >= least
    for item in items:
        assert item.compact, item.name
        assert not item.text_item.isVisible()  # NodeGraphQt's small title gives way to the large one
        assert COMPACT_MIN_TITLE_PX <= item.compact_title_px <= COMPACT_TITLE_PX, item.name
    return items


@pytest.mark.slow
def test_the_lstm_fitted_to_a_1440x900_window_shows_every_node_compact_with_a_readable_title(window):
    window.resize(1440, 900)
    grouped = fitted_compact_and_readable(window, 15)  # as the editor opens it: the gates as groups
    assert {"input gate", "forget gate", "output gate", "candidate"} <= {item.name for item in grouped}
    show_ungrouped(window)
    items = fitted_compact_and_readable(window, 40)  # every node of the LSTM
    # Most names are short enough for the full size.
    assert sum(item.compact_title_px == COMPACT_TITLE_PX for item in items) >= len(items) * 0.8


def drawn(window) -> list:
    """The node items in sight: a node switches when it is painted, and the view paints only those."""
    viewer = window.canvas
    sight = viewer.mapToScene(viewer.viewport().rect()).boundingRect()
    return [item for item in shown_items(window) if item.sceneBoundingRect().intersects(sight)]


def test_nodes_switch_to_compact_just_below_the_threshold_and_back(window):
    show_ungrouped(window)  # enough nodes in sight at 1:1
    for scale, compact in [(COMPACT_BELOW + 0.01, False), (COMPACT_BELOW - 0.01, True),
                           (COMPACT_BELOW + 0.01, False), (1.0, False), (0.2, True)]:
        draw_at(window, scale)
        items = drawn(window)
        assert len(items) >= 10, scale
        assert {item.compact for item in items} == {compact}, scale
        assert {item.text_item.isVisible() for item in items} == {not compact}, scale
        assert not any(item._icon_item.isVisible() for item in items)  # no icon, zoomed in or out


@pytest.mark.slow
def test_outlines_and_problem_marks_stay_visible_when_compact(window):
    show_ungrouped(window)  # the gates' groups hold a node of most launches: their outlines would coincide
    scale = COMPACT_BELOW * 0.6
    image = draw_at(window, scale)
    assert all(item.compact for item in shown_items(window))
    # Each launch's outline, in its own colour, around its nodes.
    for region in window.overlay.regions:
        area = QtCore.QRect()
        for node_id in region.nodes:
            area = area.united(on_screen(window, node_id))
        assert pixels_near(image, region.rgb, area.adjusted(-12, -12, 12, 12)) >= 40, region.name

    window.adapter.disconnect("h_new", "b")  # h_new: an input not connected (error)
    window.refresh_plan()
    assert window.adapter.node("h_new").view.mark == "error"
    image = draw_at(window, scale)
    marked = on_screen(window, "h_new")
    assert pixels_near(image, theme.ERROR_COLOR, marked) >= 2 * (marked.width() + marked.height())
    clean = on_screen(window, "c_new")
    assert pixels_near(image, theme.ERROR_COLOR, clean) == 0
    # The out-of-date plan is still outlined, grey, around the nodes.
    assert window.overlay.out_of_date
    assert all(item.isVisible() and item.scene() is not None for item in window.overlay._items)
