"""Fixtures for the editor's tests: Qt offscreen, settings and autosaves in a temporary folder, and
every dialog answered by the test instead of a person.

A test that opens a window takes about a quarter of a second on a machine of two cores (most of it
building the window's panels and the LSTM's nodes and wires on the canvas; the equations' terms are
rendered with matplotlib's mathtext once for the whole test run, between events, once the panel is
painted), and a test drives it through many edits: the default tier keeps a few of them in each file, a
test of each part of the editor, and the others are marked slow (see tests/conftest.py)."""

from __future__ import annotations

import gc
import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before anything imports Qt

from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from PySide6 import QtCore  # noqa: E402

from cellfuse.graph_model import Cell  # noqa: E402

TINY = {"seq": 4, "batch": 2, "input": 8, "hidden": 8, "layers": 1}


@dataclass
class Answers:
    """What the dialogs answer, and what they were asked."""

    save_changes: str = "discard"
    restore_autosave: bool = False
    open_path: Path | None = None
    save_path: Path | None = None
    asked: list[tuple[str, Any]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """QSettings, the autosave folder and cellfuse's caches (what an export compiles) under tmp_path, for
    every test."""
    config, data = tmp_path / "config", tmp_path / "data"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    monkeypatch.setenv("CELLFUSE_CACHE_DIR", str(tmp_path / "cache"))
    for fmt in (QtCore.QSettings.Format.NativeFormat, QtCore.QSettings.Format.IniFormat):
        QtCore.QSettings.setPath(fmt, QtCore.QSettings.Scope.UserScope, str(config))
    yield tmp_path


@pytest.fixture(autouse=True)
def answers(monkeypatch) -> Answers:
    from cellfuse.app import dialogs

    a = Answers()

    def ask_save_changes(parent, name):
        a.asked.append(("save_changes", name))
        return a.save_changes

    def ask_restore_autosave(parent, name, when):
        a.asked.append(("restore_autosave", name))
        return a.restore_autosave

    def show_error(parent, title, text):
        a.errors.append((title, text))

    def ask_open_path(parent, directory=""):
        a.asked.append(("open_path", directory))
        return a.open_path

    def ask_save_path(parent, title, suggested, filters):
        a.asked.append(("save_path", suggested))
        return a.save_path

    for name, fn in [("ask_save_changes", ask_save_changes), ("ask_restore_autosave", ask_restore_autosave),
                     ("show_error", show_error), ("ask_open_path", ask_open_path),
                     ("ask_save_path", ask_save_path)]:
        monkeypatch.setattr(dialogs, name, fn)
    return a


@pytest.fixture
def make_window(qtbot, qapp):
    """Opens a real editor window: make_window(path=None) -> MainWindow."""
    from cellfuse.app.main import configure_application
    from cellfuse.app.main_window import MainWindow

    configure_application(qapp)
    made: list[MainWindow] = []

    def make(path: str | Path | None = None, sizes: dict[str, int] | None = None) -> MainWindow:
        w = MainWindow()
        made.append(w)
        w.resize(1400, 900)
        w.show()
        w.start(path)
        w.bench_panel.set_sizes(**(sizes or TINY))
        w.refresh_plan()
        return w

    yield make
    # Close and delete the windows now, not while the interpreter shuts down.
    for w in made:
        if w.worker is not None:
            w.worker.cancel()
            w.worker.wait(30_000)
        w.close()
        w.deleteLater()
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    qapp.processEvents()
    gc.collect()


@pytest.fixture
def window(make_window):
    return make_window()


# -- what a user does -------------------------------------------------------------------------------

def add_from_palette(qtbot, window, op: str) -> str:
    """Types the op's name in the palette's search and presses Enter; returns the new node's id."""
    search = window.palette.search
    search.clear()
    qtbot.keyClicks(search, op)
    assert window.palette.current_op() == op, window.palette.ops()
    before = {n.id for n in window.cell.nodes}
    qtbot.keyClick(search, QtCore.Qt.Key.Key_Return)
    added = [n.id for n in window.cell.nodes if n.id not in before]
    if op == "output":
        return ""
    assert len(added) == 1, added
    assert window.adapter.selected_ids() == added
    return added[0]


def rename_in_properties(qtbot, window, node_id: str, new: str) -> None:
    """Selects the node, types a new id in the properties panel and presses Enter."""
    window.show_node(node_id)
    edit = window.properties.id_edit
    assert edit.text() == node_id
    edit.selectAll()
    qtbot.keyClicks(edit, new)
    qtbot.keyClick(edit, QtCore.Qt.Key.Key_Return)


def set_value_in_properties(qtbot, window, node_id: str, text: str) -> None:
    window.show_node(node_id)
    edit = window.properties.value_edit
    edit.selectAll()
    qtbot.keyClick(edit, QtCore.Qt.Key.Key_Delete)
    qtbot.keyClicks(edit, text)
    qtbot.keyClick(edit, QtCore.Qt.Key.Key_Return)


def comparable(cell: Cell) -> dict[str, Any]:
    """What the compiler and the file hold, apart from canvas positions."""
    data = cell.to_json()
    data.pop("layout", None)
    data.pop("x-editor", None)
    return data


class User:
    """The user actions above, bound to a qtbot and a window: `user.add("sigmoid")`."""

    def __init__(self, qtbot, window):
        self.qtbot, self.window = qtbot, window

    def add(self, op: str) -> str:
        return add_from_palette(self.qtbot, self.window, op)

    def rename(self, node_id: str, new: str) -> None:
        rename_in_properties(self.qtbot, self.window, node_id, new)

    def set_value(self, node_id: str, text: str) -> None:
        set_value_in_properties(self.qtbot, self.window, node_id, text)


@pytest.fixture
def user(qtbot, window) -> User:
    return User(qtbot, window)


# -- charts ------------------------------------------------------------------------------------------------

def inside(inner, outer, slack: float = 1.0) -> bool:
    """Whether matplotlib box `inner` lies within `outer`, give or take `slack` pixels."""
    return (inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack
            and inner.x1 <= outer.x1 + slack and inner.y1 <= outer.y1 + slack)


def _tick_labels(axis, low: float, high: float) -> list:
    """The tick labels an axis draws: those of its ticks within its limits (it keeps others)."""
    low, high = min(low, high), max(low, high)
    return [t.label1 for t in axis.get_major_ticks()
            if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high]


def problems_of_chart(fig) -> list[str]:
    """What is out of place in a drawn figure: a label (title, footnote, legend, axis label, tick label)
    not wholly inside the figure, a value written at a bar's end outside its axes, the title not above
    the axes, the footnote not below them, or a figure legend over a plot or over the title."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    drawn = [ax for ax in fig.axes if ax.axison]
    problems: list[str] = []
    labels = [t for t in (fig._suptitle, fig._supxlabel, fig._supylabel) if t is not None]
    legends = [*fig.legends, *(ax.get_legend() for ax in drawn if ax.get_legend() is not None)]
    labels += [t for legend in legends for t in (legend.get_title(), *legend.get_texts())]
    for ax in drawn:
        labels += [ax.title, ax.xaxis.label, ax.yaxis.label]
        labels += _tick_labels(ax.xaxis, *ax.get_xlim()) + _tick_labels(ax.yaxis, *ax.get_ylim())
        for t in ax.texts:
            if not inside(t.get_window_extent(renderer), ax.bbox, slack=2.0):
                problems.append(f"{t.get_text()!r} outside its axes")
    for t in labels:
        if t.get_visible() and t.get_text() and not inside(t.get_window_extent(renderer), box):
            problems.append(f"{t.get_text()!r} outside the figure")
    for ax in drawn:
        tight = ax.get_tightbbox(renderer)
        if fig._suptitle is not None and fig._suptitle.get_window_extent(renderer).y0 < tight.y1 - 1.0:
            problems.append("the title overlaps the axes")
        if fig._supxlabel is not None and fig._supxlabel.get_window_extent(renderer).y1 > tight.y0 + 1.0:
            problems.append("the footnote overlaps the axes")
        for legend in fig.legends:  # an axes' own legend is placed on its plot by design
            if legend.get_window_extent(renderer).overlaps(ax.bbox):
                problems.append("a legend over a plot")
    for legend in fig.legends:
        for t in (fig._suptitle, fig._supxlabel):
            if t is not None and legend.get_window_extent(renderer).overlaps(t.get_window_extent(renderer)):
                problems.append(f"a legend over {t.get_text()!r}")
    return problems


@pytest.fixture
def chart_problems():
    """problems_of_chart, for a test: chart_problems(fig) -> what is out of place in the figure."""
    return problems_of_chart


@pytest.fixture
def same():
    """same(cell_a, cell_b): equal apart from canvas positions."""
    return lambda a, b: comparable(a) == comparable(b)


# -- wires ---------------------------------------------------------------------------------------------------

def node_of(item):
    from cellfuse.app.node_item import CellNodeItem

    while item is not None and not isinstance(item, CellNodeItem):
        item = item.parentItem()
    return item


def wires_of(window) -> list:
    """Every wire shown, with its two ends' nodes: the cell's own and the groups'."""
    from cellfuse.app.canvas_wires import CellPipe
    from cellfuse.app.group_items import GroupWire

    out = []
    for item in window.canvas.scene().items():
        if isinstance(item, CellPipe) and item.isVisible():
            out.append((item, {item.input_port.node, item.output_port.node}))
        elif isinstance(item, GroupWire) and item.isVisible():
            out.append((item, {node_of(item.start), node_of(item.end)}))
    return out


def crossings_of(window) -> list[tuple[str, str, str]]:
    """(from, to, under) for each wire that runs under a node it does not join."""
    from cellfuse.app.node_item import CellNodeItem

    window.canvas.router.flush()  # the wires drawn last wait for their routes
    nodes = [i for i in window.canvas.scene().items() if isinstance(i, CellNodeItem) and i.isVisible()]
    found = []
    for wire, ends in wires_of(window):
        path = wire.path()
        points = [path.pointAtPercent(k / 200) for k in range(1, 200)]
        for node in nodes:
            inner = node.sceneBoundingRect().adjusted(2.0, 2.0, -2.0, -2.0)
            if node not in ends and any(inner.contains(p) for p in points):
                names = sorted(n.name for n in ends if n is not None)
                found.append((*names, node.name))
    return found


@pytest.fixture
def wires():
    """wires(window) -> every wire shown, with its two ends' nodes."""
    return wires_of


@pytest.fixture
def crossings():
    """crossings(window) -> (from, to, under) for each wire that runs under a node it does not join."""
    return crossings_of
