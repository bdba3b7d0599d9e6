"""The window at the sizes of common screens: where it opens, that its panels keep their room, and that
a finished benchmark can be read without touching the layout."""

from __future__ import annotations

import warnings

import pytest
from PySide6 import QtCore, QtWidgets
from tiers import slow_beyond

from cellfuse.app.bench_runs import BenchRun
from cellfuse.app.window_geometry import PALETTE_MIN_WIDTH, PREFERRED_SIZE, initial_geometry

TIMEOUT_MS = 60_000
TINY = {"seq": 4, "batch": 2, "input": 8, "hidden": 8, "layers": 1}
SCREENS = [(1366, 768), (1280, 720), (1920, 1080)]


def settle(qapp, window, size):
    window.resize(*size)
    window.arrange_docks()
    for _ in range(3):
        qapp.processEvents()


@pytest.mark.parametrize("available", [QtCore.QRect(0, 0, 1366, 728), QtCore.QRect(0, 27, 1280, 693),
                                       QtCore.QRect(1920, 0, 1366, 768), QtCore.QRect(0, 0, 1024, 600)])
def test_the_first_window_fits_the_available_screen(available):
    rect = initial_geometry(available)
    assert available.contains(rect)
    # The title bar above the client area fits too.
    assert rect.top() - available.top() >= 24


def test_the_first_window_has_its_preferred_size_where_there_is_room():
    rect = initial_geometry(QtCore.QRect(0, 0, 1920, 1040))
    assert (rect.width(), rect.height()) == PREFERRED_SIZE
    assert QtCore.QRect(0, 0, 1920, 1040).contains(rect)


def visible_docks(window) -> list[QtWidgets.QDockWidget]:
    # Of docks in one tab group only the raised one is drawn; the others share its geometry.
    return [d for d in window.panel_docks if d.isVisible() and not d.visibleRegion().isEmpty()]


@pytest.mark.parametrize("size", slow_beyond(SCREENS, 1))
def test_panels_do_not_overlap_and_keep_their_room(qapp, window, size):
    settle(qapp, window, size)
    docks = visible_docks(window)
    assert {window.palette_dock, window.properties_dock, window.plan_dock} <= set(docks)
    inside = window.rect()
    central = window.centralWidget().geometry()
    for i, a in enumerate(docks):
        assert inside.contains(a.geometry()), (a.objectName(), a.geometry(), inside)
        assert not a.geometry().intersects(central), a.objectName()
        for b in docks[i + 1:]:
            assert not a.geometry().intersects(b.geometry()), (a.objectName(), b.objectName())
    assert window.palette_dock.width() >= PALETTE_MIN_WIDTH
    assert window.plan_dock.height() >= 150
    window.bench_dock.raise_()
    qapp.processEvents()
    assert not window.bench_dock.geometry().intersects(window.plan_dock.geometry())


@pytest.mark.slow
def test_the_palette_keeps_its_width_when_the_window_shrinks_and_grows(qapp, window):
    settle(qapp, window, (1280, 720))
    window.resize(900, 600)
    qapp.processEvents()
    window.resize(1920, 1080)
    qapp.processEvents()
    assert window.palette_dock.width() >= PALETTE_MIN_WIDTH


def run_to_end(qtbot, window):
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    return blocker.args[0]


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1366, 768), (1280, 720)])
def test_a_finished_run_is_readable_in_the_default_layout(qtbot, qapp, window, size, chart_problems):
    window.new_from_template("elman", ask=False)
    settle(qapp, window, size)
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = run_to_end(qtbot, window)
        qapp.processEvents()
        panel.results.canvas.draw()  # the layout runs when the figure is drawn
    ours = [w for w in caught if "NodeGraphQt" not in w.filename]
    assert not ours, [str(w.message) for w in ours]
    assert run is not None

    # The results open where there is room, without the user touching the layout.
    assert window.central_tabs.currentWidget() is panel.results
    chart = panel.results.canvas
    assert chart.width() >= 600 and chart.height() >= 280, chart.size()
    table = panel.table
    assert table.viewport().width() >= 400
    last = 3  # Implementation, Kind, Median ms, Min ms: whole, without scrolling
    assert table.columnViewportPosition(last) + table.columnWidth(last) <= table.viewport().width()

    fig = panel.figure
    assert [ax for ax in fig.axes if ax.axison]
    assert fig._suptitle is not None
    assert fig._supxlabel is not None and "numpy backend" in fig._supxlabel.get_text()
    assert not chart_problems(fig)


def lines_shown(editor: QtWidgets.QPlainTextEdit) -> float:
    return editor.viewport().height() / editor.fontMetrics().lineSpacing()


def test_the_canvas_has_the_room_and_the_bottom_panels_grow_for_code_and_equations(qtbot, qapp, window):
    settle(qapp, window, (1366, 768))
    problems = window.problems_dock
    assert window.bottom_docks.raised() is problems
    assert problems.height() <= 0.2 * 768 and window.canvas.height() >= 500  # it had 190 and 468 pixels
    cuda = window.cuda_view.findChild(QtWidgets.QPlainTextEdit)
    window.cuda_dock.raise_()
    qtbot.waitUntil(lambda: lines_shown(cuda) >= 12, timeout=2000)  # it showed 6 to 8
    window.equations_dock.raise_()
    qtbot.waitUntil(lambda: window.equations_dock.height() >= 0.33 * 768, timeout=2000)
    problems.raise_()
    qtbot.waitUntil(lambda: problems.height() <= 0.2 * 768, timeout=2000)  # the canvas has it back
    # A height set by hand stays.
    window.resizeDocks([problems], [250], QtCore.Qt.Orientation.Vertical)
    qapp.processEvents()
    by_hand = problems.height()
    assert 0.2 * 768 < by_hand < 0.33 * 768
    window.cuda_dock.raise_()
    qtbot.wait(50)
    assert window.cuda_dock.height() == by_hand


def test_a_run_shown_at_1280x720_has_a_chart_280_pixels_high(qapp, window):
    from cellfuse.gpu_runtime.bench import BenchResult, BenchRow
    from cellfuse.graph_model import Sizes

    settle(qapp, window, (1280, 720))
    rows = [BenchRow(name, "schedule", True, 1.0 + i, 0.9 + i, 1.1 + i) for i, name in
            enumerate(window.bench_panel.schedules())]
    window.bench_dock.raise_()  # as F5 does
    result = BenchResult("LSTM", "", Sizes(4, 2, 8, 8, 1), "numpy", "CPU", "", {}, rows)
    window.bench_panel.add_run(BenchRun(1, result))
    window.show_bench_results()
    for _ in range(3):
        qapp.processEvents()
    assert window.bench_panel.results.canvas.height() >= 280
    scroll = window.bench_panel.settings_scroll  # and the settings still show whole
    assert scroll.widget().sizeHint().height() <= scroll.viewport().height()
