"""The window's actions, their shortcuts, and the menus that hold them."""

from __future__ import annotations

from typing import Protocol

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import CellInfo, load_template, template_names
from . import about, theme
from .cell_adapter import CellAdapter
from .palette_panel import palette_entries

Key = QtGui.QKeySequence


class Editor(Protocol):
    """What the actions and menus call: the main window is one. Described here rather than imported,
    because the main window imports this module."""

    adapter: CellAdapter
    canvas: QtWidgets.QWidget
    panel_docks: list[QtWidgets.QDockWidget]

    def new_cell(self) -> bool: ...
    def new_from_template(self, name: str) -> bool: ...
    def open_file(self) -> bool: ...
    def rebuild_recent_menu(self, menu: QtWidgets.QMenu) -> None: ...
    def save(self) -> bool: ...
    def save_as(self) -> bool: ...
    def export_cuda(self) -> bool: ...
    def cut_selection(self) -> bool: ...
    def copy_selection(self) -> bool: ...
    def paste(self) -> list[str]: ...
    def delete_selection(self) -> None: ...
    def group_selection(self) -> bool: ...
    def rename_group_selection(self) -> bool: ...
    def ungroup_selection(self) -> bool: ...
    def open_node_search(self) -> None: ...
    def focus_formula(self) -> None: ...
    def add_node(self, op: str) -> str: ...
    def show_node(self, node_id: str) -> None: ...
    def show_canvas(self) -> None: ...
    def set_overlay_visible(self, visible: bool) -> None: ...
    def validate(self) -> CellInfo: ...
    def run_benchmark(self) -> bool: ...
    def cancel_benchmark(self) -> None: ...


def _action(parent: QtWidgets.QWidget, text: str, slot, shortcuts=(), tip: str = "",
            context: QtCore.Qt.ShortcutContext = QtCore.Qt.ShortcutContext.WindowShortcut) -> QtGui.QAction:
    action = QtGui.QAction(text, parent)
    keys = []
    for s in shortcuts:
        keys += Key.keyBindings(s) if isinstance(s, Key.StandardKey) else [Key(s)]
    action.setShortcuts(keys)
    action.setShortcutContext(context)
    if tip:
        action.setStatusTip(tip)
        action.setToolTip(tip)
    action.triggered.connect(lambda _checked=False: slot())
    parent.addAction(action)
    return action


class WindowActions:
    """Every action of the window, by name (tests trigger them as a user would). The actions belong to
    `w`, the window, and call `e`, the editor: in the application both are the main window."""

    def __init__(self, w: QtWidgets.QMainWindow, e: Editor) -> None:
        canvas_only = QtCore.Qt.ShortcutContext.WidgetWithChildrenShortcut
        std = Key.StandardKey
        self.open = _action(w, "&Open…", lambda: e.open_file(), [std.Open], "Open a cell file")
        self.save = _action(w, "&Save", e.save, [std.Save], "Save the cell")
        self.save_as = _action(w, "Save &As…", lambda: e.save_as(), ["Ctrl+Shift+S"], "Save under a new name")
        self.export_cuda = _action(w, "Export &CUDA…", lambda: e.export_cuda(), ["Ctrl+E"],
                                   "Write the generated CUDA of the chosen schedule to a .cu file")
        self.quit = _action(w, "&Quit", w.close, ["Ctrl+Q"])
        self.new = _action(w, "&New Cell", lambda: e.new_cell(), [std.New],
                           "A new cell with only its input and output")

        stack = e.adapter.undo_stack()
        self.undo = stack.createUndoAction(w, "&Undo")
        self.undo.setShortcuts([Key("Ctrl+Z")])
        self.redo = stack.createRedoAction(w, "&Redo")
        self.redo.setShortcuts([Key("Ctrl+Shift+Z"), Key("Ctrl+Y")])
        w.addAction(self.undo)
        w.addAction(self.redo)
        self.cut = _action(w, "Cu&t", e.cut_selection, [std.Cut])
        self.copy = _action(w, "&Copy", e.copy_selection, [std.Copy])
        self.paste = _action(w, "&Paste", e.paste, [std.Paste])
        self.delete = _action(e.canvas, "&Delete", e.delete_selection, ["Del", "Backspace"],
                              "Delete the selected nodes", canvas_only)
        self.select_all = _action(w, "Select &All", e.adapter.select_all, [std.SelectAll])
        self.group = _action(w, "&Group…", lambda: e.group_selection(), ["Ctrl+G"],
                             "Show the selected nodes as one node, under a name")
        self.rename_group = _action(w, "&Rename Group…", lambda: e.rename_group_selection(), ["F2"],
                                    "Give the selected group (or the open one) a new name")
        self.ungroup = _action(w, "U&ngroup", e.ungroup_selection, ["Ctrl+Shift+G"],
                               "Show the nodes of the selected groups (or of the open one) again")
        self.node_search = _action(e.canvas, "Add Node by &Name…", e.open_node_search, ["Tab"],
                                   "Search the ops by name and add one", canvas_only)
        self.formula = _action(w, "Type a &Formula…", e.focus_formula, ["Ctrl+Shift+F"],
                               "Add nodes by typing what they compute, as f = sigmoid(x @ W_f + b_f)")

        finder = e.adapter.graph.finder
        finder.names = lambda: [n.id for n in e.adapter.cell.nodes]
        finder.go, finder.before = e.show_node, e.show_canvas
        self.find = _action(w, "&Find Node…", finder.open, ["Ctrl+F"], "Find a node by its name and go to it")
        self.fit = _action(e.canvas, "&Fit", e.adapter.fit, ["F"],
                           "Frame the selected nodes, or the whole cell", canvas_only)
        self.auto_layout = _action(w, "Auto &Layout", e.adapter.auto_layout, ["Ctrl+L"],
                                   "Arrange the nodes in columns from the input to the updates")
        self.plan_overlay = _action(w, "Plan &Outlines", lambda: e.set_overlay_visible(
            self.plan_overlay.isChecked()), ["Ctrl+Shift+P"], "Outline GEMM groups and fused kernels")
        self.plan_overlay.setCheckable(True)
        self.plan_overlay.setChecked(True)
        minimap = e.adapter.graph.minimap
        self.minimap = _action(w, "&Minimap", lambda: minimap.setVisible(self.minimap.isChecked()),
                               ["Ctrl+Shift+M"], "The whole cell in the canvas's corner: click to go there")
        self.minimap.setCheckable(True)
        self.minimap.setChecked(True)

        self.validate = _action(w, "&Validate", e.validate, ["F7"], "Check the cell and list its problems")
        self.benchmark = _action(w, "&Benchmark", e.run_benchmark, ["F5"],
                                 "Check and time every schedule of the cell")
        self.cancel = _action(w, "&Cancel Benchmark", e.cancel_benchmark, ["Shift+F5"])
        self.about = _action(w, "&About CellFuse", lambda: about.show_about(w), (),
                             "The version, whether a GPU was found, where settings and autosaves live")


def build_menus(w: QtWidgets.QMainWindow, e: Editor, a: WindowActions) -> None:
    bar = w.menuBar()
    file = bar.addMenu("&File")
    file.addAction(a.new)
    templates = file.addMenu("New from &Template")
    for name in template_names():
        try:
            title = load_template(name).name
        except Exception:  # a broken template must not stop the editor from starting
            title = name
        templates.addAction(f"{title}  ({name})", lambda n=name: e.new_from_template(n))
    file.addSeparator()
    file.addAction(a.open)
    recent = file.addMenu("Open &Recent")
    recent.aboutToShow.connect(lambda: e.rebuild_recent_menu(recent))
    e.rebuild_recent_menu(recent)
    file.addSeparator()
    file.addAction(a.save)
    file.addAction(a.save_as)
    file.addAction(a.export_cuda)
    file.addSeparator()
    file.addAction(a.quit)

    edit = bar.addMenu("&Edit")
    for action in (a.undo, a.redo, None, a.cut, a.copy, a.paste, a.delete, None, a.select_all, a.group,
                   a.rename_group, a.ungroup, None, a.node_search, a.formula):
        edit.addSeparator() if action is None else edit.addAction(action)
    add = edit.addMenu("Add &Node")
    _add_node_menu(e, add)

    view = bar.addMenu("&View")
    view.addAction(a.find)
    view.addAction(a.fit)
    view.addAction(a.auto_layout)
    view.addAction(a.plan_overlay)
    view.addAction(a.minimap)
    view.addSeparator()
    panels = view.addMenu("&Panels")
    for dock in e.panel_docks:
        panels.addAction(dock.toggleViewAction())

    run = bar.addMenu("&Run")
    run.addAction(a.validate)
    run.addAction(a.benchmark)
    run.addAction(a.cancel)

    help_menu = bar.addMenu("&Help")
    help_menu.addAction("&Keyboard and Mouse", lambda: _show_help(w))
    help_menu.addSeparator()
    help_menu.addAction(a.about)

    # The canvas's right-click menu.
    ctx = e.adapter.graph.get_context_menu("graph").qmenu
    ctx_add = ctx.addMenu("Add Node")
    _add_node_menu(e, ctx_add)
    ctx.addSeparator()
    for action in (a.cut, a.copy, a.paste, a.delete, None, a.group, a.rename_group, a.ungroup, None,
                   a.select_all, a.fit, a.auto_layout):
        ctx.addSeparator() if action is None else ctx.addAction(action)


def _add_node_menu(e: Editor, menu: QtWidgets.QMenu) -> None:
    submenus: dict[str, QtWidgets.QMenu] = {}
    for kind, op, doc in palette_entries():
        sub = submenus.get(kind)
        if sub is None:
            sub = submenus[kind] = menu.addMenu(theme.swatch_icon(theme.KIND_COLORS[kind]),
                                                theme.KIND_LABELS[kind])
        action = sub.addAction(op, lambda o=op: e.add_node(o))
        action.setStatusTip(doc)


HELP = """<h3>Canvas</h3>
<table cellspacing=4>
<tr><td><b>Drag</b> from an output port to an input port</td><td>connect</td></tr>
<tr><td><b>Tab</b></td><td>search the ops and add one</td></tr>
<tr><td><b>Del</b></td><td>delete the selection (a state goes with its update)</td></tr>
<tr><td><b>F</b></td><td>frame the selection, or the whole cell</td></tr>
<tr><td><b>Ctrl+F</b></td><td>find a node by name and go to it</td></tr>
<tr><td><b>Ctrl+L</b></td><td>lay the cell out again, in columns from the input to the updates</td></tr>
<tr><td><b>Click or drag</b> the minimap</td><td>move the canvas there</td></tr>
<tr><td><b>Drop a wire</b> on empty canvas</td><td>add a node that takes it, from a search</td></tr>
<tr><td><b>Alt+Shift+drag</b></td><td>cut wires</td></tr>
<tr><td><b>Middle-drag / wheel</b></td><td>pan / zoom</td></tr>
<tr><td><b>Double-click</b> a title</td><td>rename the node</td></tr>
<tr><td><b>Ctrl+G</b></td><td>group the selection under a name: one node on the canvas</td></tr>
<tr><td><b>Double-click</b> a group</td><td>open it; the path above the canvas goes back</td></tr>
<tr><td><b>F2</b></td><td>rename the selected group, or the open one</td></tr>
<tr><td><b>Ctrl+Shift+G</b></td><td>ungroup the selected groups, or the open one</td></tr>
</table>
<h3>Cell</h3>
<p>A state appears twice: its value from the previous step (an output port) and its
<i>next</i> node, whose input is the value it takes for the next step. The <i>cell output</i>
node's input is the layer's output.</p>
<h3>Equations</h3>
<p>The Equations panel shows what the cell computes; click a term to select its nodes.
<b>Ctrl+Shift+F</b> types a formula, such as <tt>f = sigmoid(x @ W_f + h @ U_f + b_f)</tt>:
<tt>@</tt> is the matrix product, <tt>*</tt> the elementwise one, <tt>h'</tt> the value state
<tt>h</tt> takes for the next step and <tt>y</tt> the output. Names the cell lacks become
weights or states by where they stand. One formula is one undo step.</p>
<p><b>F5</b> runs the benchmark, <b>F7</b> validates, <b>Ctrl+E</b> exports CUDA.</p>"""


def _show_help(w: QtWidgets.QWidget) -> None:
    QtWidgets.QMessageBox.information(w, "Keyboard and mouse", HELP)
