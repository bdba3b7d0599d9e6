"""The editor's main window: the canvas in the middle, the palette, properties, plan, problems,
equations, CUDA and benchmark panels around it, the menus, and the document's life (new, open, save,
autosave, close).

The window wires panels to the cell adapter and to the compiler and benchmark; it holds no cell
logic of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from ..codegen import SCHEDULES, generate_cuda, make_plan
from ..gpu_runtime.bench import BASELINES, BenchConfig, available_backends
from ..gpu_runtime.kernel_cache import ExportFit
from ..graph_model import (
    Cell,
    CellError,
    CellInfo,
    Node,
    Sizes,
    analyze,
    atomic_write,
    cell_from_text,
    cell_to_text,
    load_cell,
    load_template,
    plan_formula,
    save_cell,
    template_names,
)
from . import autosave, dialogs, formula_names, fragments, node_marks, recent_files, window_geometry
from .bench_panel import BenchPanel
from .bench_runs import BenchRun
from .bench_worker import BenchWorker
from .breadcrumb import Breadcrumb
from .cell_adapter import CellAdapter
from .cuda_view import CudaView
from .document import Document, with_cell_suffix
from .equations_panel import EquationsPanel
from .menus import WindowActions, build_menus
from .palette_panel import PalettePanel
from .plan_overlay import PlanOverlay
from .plan_panel import PlanPanel
from .plan_worker import PlanOutcome, PlanWorker, plan_outcome
from .problems_panel import ProblemsPanel
from .properties_panel import PropertiesPanel

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "lstm"
DEFAULT_SCHEDULE = "hoisted"
AUTOSAVE_INTERVAL_MS = 30_000
PLAN_DELAY_MS = 150
PLAN_BUSY_AFTER_MS = 300  # a plan that takes longer to come back is marked as being updated


class MainWindow(QtWidgets.QMainWindow):
    """The CellFuse editor. `start(path)` opens a file, or the LSTM template."""

    bench_finished = QtCore.Signal(object)  # the BenchRun, or None when the run failed

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("CellFuseMainWindow")
        screen = QtGui.QGuiApplication.primaryScreen()
        if screen is not None:
            self.setGeometry(window_geometry.initial_geometry(screen.availableGeometry()))
        self.adapter = CellAdapter(self)
        self.adapter.layout_groups = self.plan_groups
        self.document = Document()
        self.info = CellInfo()
        self.worker: BenchWorker | None = None
        self._run_number = 0
        self._plan_key: tuple | None = None
        self._last_structure: str | None = None
        self._marks_key: tuple | None = None  # what the node marks were last set for (node_marks.show_all)
        self._shown_once = False

        self.canvas = self.adapter.graph.viewer()
        self.canvas.setMinimumSize(*window_geometry.CANVAS_MIN_SIZE)
        self.breadcrumb = Breadcrumb(self.canvas)
        self.overlay = PlanOverlay(self.adapter)

        self.palette = PalettePanel()
        self.properties = PropertiesPanel()
        self.problems = ProblemsPanel()
        self.equations_panel = EquationsPanel()
        self.plan_panel = PlanPanel(list(SCHEDULES))
        if DEFAULT_SCHEDULE in SCHEDULES:
            self.plan_panel.set_schedule(DEFAULT_SCHEDULE)
        self.cuda_view = CudaView()
        self.bench_panel = BenchPanel(list(SCHEDULES), list(BASELINES), available_backends())
        self._build_central_tabs()
        self._build_docks()

        self.actions_ = WindowActions(self, self)  # the window holds the actions and does what they ask
        build_menus(self, self, self.actions_)
        self.actions_.cancel.setEnabled(False)  # while a benchmark runs
        self._build_status_bar()

        self._plan_timer = QtCore.QTimer(self)
        self._plan_timer.setSingleShot(True)
        self._plan_timer.setInterval(PLAN_DELAY_MS)
        self._plan_timer.timeout.connect(self.request_plan)
        self.plan_worker = PlanWorker(self)
        self.plan_worker.ready.connect(self._show_plan)
        self._plan_busy_timer = QtCore.QTimer(self)
        self._plan_busy_timer.setSingleShot(True)
        self._plan_busy_timer.setInterval(PLAN_BUSY_AFTER_MS)
        self._plan_busy_timer.timeout.connect(lambda: self._set_plan_busy(True))
        self.autosave_timer = QtCore.QTimer(self)
        self.autosave_timer.setInterval(AUTOSAVE_INTERVAL_MS)
        self.autosave_timer.timeout.connect(self.write_autosave)
        self.autosave_timer.start()

        self._connect()
        self._restore_window_state()

    # == building ====================================================================================
    def _dock(self, title: str, name: str, widget: QtWidgets.QWidget,
              area: QtCore.Qt.DockWidgetArea) -> QtWidgets.QDockWidget:
        dock = QtWidgets.QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        dock.setFeatures(QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetClosable
                         | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.addDockWidget(area, dock)
        return dock

    def _build_central_tabs(self) -> None:
        """The canvas, and beside it the benchmark's results: a chart needs more room than a panel
        at the window's edge has on a laptop screen."""
        self.central_tabs = QtWidgets.QTabWidget()
        self.central_tabs.setDocumentMode(True)
        self.central_tabs.addTab(self.canvas, "Cell")
        self.central_tabs.addTab(self.bench_panel.results, "Benchmark results")
        self.setCentralWidget(self.central_tabs)

    def show_canvas(self) -> None:
        self.central_tabs.setCurrentWidget(self.canvas)

    def show_bench_results(self) -> None:
        self.central_tabs.setCurrentWidget(self.bench_panel.results)

    def _build_docks(self) -> None:
        left = QtCore.Qt.DockWidgetArea.LeftDockWidgetArea
        right = QtCore.Qt.DockWidgetArea.RightDockWidgetArea
        bottom = QtCore.Qt.DockWidgetArea.BottomDockWidgetArea
        self.setCorner(QtCore.Qt.Corner.BottomLeftCorner, left)
        self.setCorner(QtCore.Qt.Corner.BottomRightCorner, right)
        self.palette_dock = self._dock("Palette", "palette", self.palette, left)
        self.properties_dock = self._dock("Properties", "properties", self.properties, right)
        self.plan_dock = self._dock("Plan", "plan", self.plan_panel, right)
        self.problems_dock = self._dock("Problems", "problems", self.problems, bottom)
        self.equations_dock = self._dock("Equations", "equations", self.equations_panel, bottom)
        self.cuda_dock = self._dock("CUDA", "cuda", self.cuda_view, bottom)
        self.bench_dock = self._dock("Benchmark", "benchmark", self.bench_panel, bottom)
        self.splitDockWidget(self.properties_dock, self.plan_dock, QtCore.Qt.Orientation.Vertical)
        self.tabifyDockWidget(self.problems_dock, self.equations_dock)
        self.tabifyDockWidget(self.equations_dock, self.cuda_dock)
        self.tabifyDockWidget(self.cuda_dock, self.bench_dock)
        self.problems_dock.raise_()
        g = window_geometry
        self.palette.setMinimumWidth(g.PALETTE_MIN_WIDTH)
        for panel in (self.properties, self.plan_panel):
            panel.setMinimumWidth(g.SIDE_PANEL_MIN_WIDTH)
        for panel in (self.problems, self.equations_panel, self.cuda_view, self.bench_panel):
            panel.setMinimumHeight(g.BOTTOM_PANEL_MIN_HEIGHT)
        self.panel_docks = [self.palette_dock, self.properties_dock, self.plan_dock, self.problems_dock,
                            self.equations_dock, self.cuda_dock, self.bench_dock]
        self.bottom_docks = window_geometry.BottomDocks(self, [self.equations_dock, self.cuda_dock],
                                                        [self.problems_dock],
                                                        {self.bench_dock: self.bench_panel.needed_height})

    def _build_status_bar(self) -> None:
        self.validity_label = QtWidgets.QLabel()
        self.sizes_label = QtWidgets.QLabel()
        self.sizes_label.setProperty("role", "hint")
        self.plan_busy_label = QtWidgets.QLabel("Updating the plan…")
        self.plan_busy_label.setProperty("role", "hint")
        self.plan_busy_label.setVisible(False)
        self.statusBar().addPermanentWidget(self.plan_busy_label)
        self.statusBar().addPermanentWidget(self.sizes_label)
        self.statusBar().addPermanentWidget(self.validity_label)

    def _connect(self) -> None:
        a = self.adapter
        a.cell_changed.connect(self._on_cell_changed)
        a.selection_changed.connect(self._on_selection_changed)
        a.message.connect(lambda text: self.statusBar().showMessage(text, 6000))
        a.group_opened.connect(self._on_group_opened)
        self.breadcrumb.back_requested.connect(a.close_group)
        self.palette.op_activated.connect(self.add_node)
        self.problems.node_activated.connect(self.show_node)
        self.equations_panel.nodes_activated.connect(self._select_nodes)
        self.equations_panel.formula_entered.connect(self.add_formula)
        self.properties.node_activated.connect(self.show_node)
        self.properties.rename_requested.connect(self._rename)
        self.properties.shape_requested.connect(lambda i, s: self._edit(a.set_weight_shape, i, s))
        self.properties.value_requested.connect(lambda i, v: self._edit(a.set_const_value, i, v))
        self.properties.cell_info_requested.connect(self._set_cell_info)
        self.plan_panel.schedule_changed.connect(lambda _s: self.refresh_plan())
        self.plan_panel.overlay_toggled.connect(self.set_overlay_visible)
        self.plan_panel.nodes_activated.connect(self._select_nodes)
        self.plan_panel.region_hovered.connect(self.overlay.highlight)
        self.cuda_view.export_requested.connect(lambda: self.export_cuda())
        self.bench_panel.run_requested.connect(self.run_benchmark)
        self.bench_panel.cancel_requested.connect(self.cancel_benchmark)
        self.bench_panel.sizes_changed.connect(self.schedule_plan)
        self.bench_panel.export_chart_requested.connect(lambda: self.export_chart())
        self.bench_panel.export_results_requested.connect(lambda: self.export_results())
        self.bench_panel.results.notice.connect(lambda text: self.statusBar().showMessage(text, 8000))

    # == the cell ======================================================================================
    @property
    def cell(self) -> Cell:
        return self.adapter.cell

    def _on_cell_changed(self, cell: Cell) -> None:
        self.info = analyze(cell)
        self.problems.show_problems(self.info.problems, self.info.notes)
        structure = cell.structure_hash()
        if structure != self._last_structure:  # the equations are of the structure only, not of a move
            self.equations_panel.show_cell(cell)
        # only what changed (nothing for a move): setting them all took 50-60 ms on a thousand nodes
        self._marks_key = node_marks.show_all(self.adapter, self.info, structure, self._marks_key)
        self.properties.show_cell(cell, self.info, self.adapter.selected_ids())
        self.breadcrumb.show_path(cell.name, self.adapter.open_group)
        errors = len(self.info.errors)
        warnings = len(self.info.problems) - errors
        if errors:
            self.validity_label.setText(f'<span style="color:#f07060">● {errors} error(s)</span>')
        elif warnings:
            self.validity_label.setText(f'<span style="color:#f0c040">● valid, {warnings} warning(s)</span>')
        else:
            self.validity_label.setText('<span style="color:#6fcf97">● valid</span>')
        self.update_title()
        if structure != self._last_structure:
            self._last_structure = structure
            self.schedule_plan()
        else:
            self.overlay.refresh()

    def _on_selection_changed(self, ids: list[str]) -> None:
        self.properties.show_cell(self.cell, self.info, ids)
        self.equations_panel.show_selection(ids)
        if ids:
            self.cuda_view.scroll_to_node(ids[0])

    def _on_group_opened(self, name: str | None) -> None:
        self.breadcrumb.show_path(self.cell.name, name)
        self.overlay.refresh()  # around the nodes shown now
        if name is not None:
            self.show_canvas()
            self.statusBar().showMessage(f"Group '{name}': the path at the canvas's top left goes back to "
                                         "the whole cell", 6000)
        elif self.statusBar().currentMessage().startswith("Group '"):
            self.statusBar().clearMessage()  # back on the whole cell: the group's hint no longer holds

    def update_title(self) -> None:
        name = self.document.display_name(self.cell)
        self.setWindowTitle(f"{name}[*] — CellFuse")
        self.setWindowModified(self.is_modified())

    def is_modified(self) -> bool:
        return self.document.is_modified(self.cell)

    def _edit(self, fn, *args) -> bool:
        """Runs one adapter edit; a refused one is said in the properties panel and the status bar."""
        try:
            fn(*args)
        except CellError as e:
            self.properties.show_error(str(e))
            self.statusBar().showMessage(str(e), 6000)
            return False
        return True

    def _rename(self, old: str, new: str) -> None:
        if self._edit(self.adapter.rename, old, new):
            self.adapter.select([new])

    def _set_cell_info(self, info: dict) -> None:
        self._edit(lambda: self.adapter.set_cell_info(info["name"], info["description"], info["sizes"]))
        if info["sizes"]:
            self.bench_panel.set_sizes(**info["sizes"])

    def add_node(self, op: str) -> str:
        """Adds a node of `op` at the middle of the view (the palette's action); returns its id."""
        try:
            node_id = self.adapter.add_node(op)
        except CellError as e:
            self.statusBar().showMessage(str(e), 6000)
            return ""
        if node_id:
            self.show_canvas()
            self.adapter.select([node_id])
        self.palette.reset_search()
        return node_id

    def add_formula(self, formula: str) -> list[str]:
        """Adds what a typed formula computes, as one undoable edit; returns the new nodes' ids. A formula
        that cannot be added is said under the entry, with where."""
        try:
            edit = formula_names.name_nodes(plan_formula(self.cell, formula), self.cell)
            ids = self.adapter.add_formula(edit)
        except CellError as e:
            self.equations_panel.show_formula_error(e)
            return []
        self.equations_panel.formula_added()
        self.statusBar().showMessage(f"{edit.target}: {edit.describe()}", 6000)
        if ids:
            self._select_nodes(ids)
        return ids

    def focus_formula(self) -> None:
        """Shows the equations panel and puts the cursor in its formula entry."""
        self.equations_dock.show()
        self.equations_dock.raise_()
        self.equations_panel.focus_entry()

    def show_node(self, node_id: str) -> None:
        """Selects a node and centres the canvas on it, opening the group that holds it."""
        if not self.cell.has(node_id):
            return
        self._select_nodes([node_id])

    def _select_nodes(self, ids: list[str]) -> None:
        """Selects nodes named by a panel (a term, a launch) and centres the canvas on them, opening the
        group that holds them where one does (see CellAdapter.reveal)."""
        ids = [i for i in ids if self.cell.has(i)]
        if ids:
            self.show_canvas()
            self.adapter.reveal(ids)
        self.adapter.select(ids)
        if ids:
            self.adapter.centre_on(ids)

    # == plan and CUDA =================================================================================
    def sizes(self) -> Sizes:
        return self.bench_panel.sizes()

    def schedule_plan(self) -> None:
        """Asks for the plan a moment from now: a burst of edits asks once."""
        self._plan_timer.start()

    def request_plan(self) -> None:
        """Asks the worker for the plan of the current cell, sizes and schedule; the last plan, its
        outlines and its CUDA stay on show until it comes back, marked as being updated after a while."""
        key = self._wanted_plan()
        if key == self._plan_key:  # on show, or on its way
            self.overlay.refresh()
            return
        self._plan_key = key
        if self._say_no_plan():
            return
        self.plan_worker.request(self.cell, key[1], key[2])
        self._plan_busy_timer.start()

    def refresh_plan(self) -> None:
        """Makes the plan of the current cell, sizes and schedule now, on this thread, and shows it: for
        what needs it at once, the schedule chosen in the plan panel (the panel then says the plan of
        the schedule it shows), a script, a test. Edits ask the worker (request_plan)."""
        key = self._wanted_plan()
        if key == self._plan_key and not self.plan_worker.busy:
            self.overlay.refresh()
            return
        self._plan_key = key
        self.plan_worker.drop()  # what it would bring back is older than this
        if self._say_no_plan():
            return
        # the slowest schedules of a cell of a thousand nodes take a few tenths of a second
        QtWidgets.QApplication.setOverrideCursor(QtCore.Qt.CursorShape.WaitCursor)
        try:
            outcome = plan_outcome(self.cell, key[1], key[2])
        finally:
            QtWidgets.QApplication.restoreOverrideCursor()
        self._show_plan(outcome)

    def updating(self) -> bool:
        """Whether the plan, the CUDA or the equations of the last edit are still being made (a script
        or a test that needs them waits for this)."""
        return self._plan_timer.isActive() or self.plan_worker.busy or self.equations_panel.drawing

    def _wanted_plan(self) -> tuple[str, Sizes, str]:
        """What the plan to show is of: the cell's structure, the sizes and the schedule (the sizes are
        shown on the way)."""
        self._plan_timer.stop()
        s = self.sizes()
        self.plan_panel.show_sizes(f"T={s.seq}, B={s.batch}, input={s.input}, hidden={s.hidden}, "
                                   f"layers={s.layers} (set in the Benchmark panel)")
        self.sizes_label.setText(f"T {s.seq} · B {s.batch} · in {s.input} · h {s.hidden} · L {s.layers}")
        return self.cell.structure_hash(), s, self.plan_panel.schedule()

    def _say_no_plan(self) -> bool:
        """Where the cell has errors, says so over the last plan and drops any plan on its way; True
        then."""
        if self.info.ok:
            return False
        self.plan_worker.drop()
        n = len(self.info.errors)
        self._show_out_of_date(f"Fix the {n} error{'s' if n != 1 else ''} in Problems to see the plan.")
        return True

    def _show_plan(self, outcome: PlanOutcome) -> None:
        self._set_plan_busy(False)
        said, source = outcome.summary, outcome.source
        if said is None or source is None:
            self._show_out_of_date(outcome.error or "")
            return
        self.plan_panel.show_summary(said)
        self.overlay.show_summary(said)
        lines = source.text.count("\n") + 1
        self.cuda_view.show_source(source.text, source.kernel_of_node, source.kernel_line,
                                   f"{self.cell.name} · schedule '{said['schedule']}' · {lines} lines")
        selected = self.adapter.selected_ids()
        if selected:
            self.cuda_view.scroll_to_node(selected[0])

    def _set_plan_busy(self, busy: bool) -> None:
        """The mark of a plan being made: in the status bar and the plan panel, once it takes a while."""
        self._plan_busy_timer.stop()
        busy = busy and self.plan_worker.busy
        self.plan_busy_label.setVisible(busy)
        self.plan_panel.show_updating(busy)

    def plan_groups(self, cell: Cell) -> list[list[str]]:
        """The nodes of each GEMM group and of each fused kernel of the cell's plan at the chosen
        schedule: the auto layout keeps each together, so that its outline is one area. Empty for a
        cell that has no plan; it is laid out by its graph alone."""
        try:
            plan = make_plan(cell, self.sizes(), self.plan_panel.schedule())
        except CellError:
            return []
        except Exception:  # the compiler's failure must not take the layout down
            log.exception("the scheduler failed on cell '%s'", cell.name)
            return []
        return [list(g.matmuls) for g in plan.groups] + [list(i.nodes) for i in plan.islands]

    def _show_out_of_date(self, reason: str) -> None:
        """The last valid plan, its outlines and its CUDA stay on show, marked as out of date, while the
        cell has no plan."""
        self._set_plan_busy(False)
        self.plan_panel.mark_out_of_date(reason)
        self.cuda_view.mark_out_of_date(reason)
        self.overlay.mark_out_of_date()

    def set_overlay_visible(self, visible: bool) -> None:
        self.overlay.set_visible(visible)
        for widget in (self.plan_panel.overlay_check, self.actions_.plan_overlay):
            if widget.isChecked() != visible:
                widget.blockSignals(True)
                widget.setChecked(visible)
                widget.blockSignals(False)

    # == documents =====================================================================================
    def start(self, path: str | Path | None = None) -> None:
        """Opens `path` (or, where no such file is, the built-in template of that name); with none, or
        when it cannot be opened, a new LSTM (or its autosave)."""
        if path is not None and not Path(path).exists() and str(path) in template_names():
            self.new_from_template(str(path), ask=False)
            return
        if path is not None and self.open_file(Path(path), ask=False):
            return
        if path is None and self._restore_untitled():
            return
        self.new_from_template(DEFAULT_TEMPLATE, ask=False)

    def _show(self, cell: Cell, path: Path | None, relayout: bool, saved: bool) -> bool:
        try:
            self.adapter.load(cell, relayout=relayout)
        except CellError as e:
            where = path.name if path is not None else cell.name
            dialogs.show_error(self, "Cannot show the cell", f"{where}: {e}")
            return False
        self.cancel_benchmark()
        self.document = Document(path=path, saved=self.cell.to_json() if saved else None)
        self.bench_panel.set_sizes(**{k: v for k, v in cell.sizes.items() if k in ("input", "hidden")})
        self._plan_key = None
        self.plan_panel.show_message("No plan yet.")  # another cell's plan is not out of date, it is wrong
        self.cuda_view.show_message("No source yet.")
        self.overlay.clear()
        self.update_title()  # the panels showed the cell as it loaded, the title the old document's name
        self.request_plan()
        self.adapter.fit()
        return True

    def new_cell(self, ask: bool = True) -> bool:
        """A new cell holding only the input and the output node."""
        if ask and not self.maybe_save():
            return False
        if not self._show(Cell(name="untitled", nodes=[Node("x", "input")]), None, relayout=True, saved=True):
            return False
        self.statusBar().showMessage("New cell: add nodes from the palette (or Tab on the canvas)", 4000)
        return True

    def new_from_template(self, name: str, ask: bool = True) -> bool:
        if ask and not self.maybe_save():
            return False
        try:
            cell = load_template(name)
        except CellError as e:
            dialogs.show_error(self, "Cannot open template", str(e))
            return False
        if not self._show(cell, None, relayout=True, saved=True):
            return False
        self.statusBar().showMessage(f"New cell from the template '{name}'", 4000)
        return True

    def open_file(self, path: Path | None = None, ask: bool = True) -> bool:
        """Opens a cell file (asking for one when `path` is None). A file that cannot be read is
        reported in a dialog that names the problem."""
        if ask and not self.maybe_save():
            return False
        if path is None:
            start = str(self.document.path.parent) if self.document.path else ""
            path = dialogs.ask_open_path(self, start)
            if path is None:
                return False
        try:
            cell = load_cell(path)
        except CellError as e:
            dialogs.show_error(self, "Cannot open cell", str(e))
            return False
        recent_files.add_recent_file(path)
        found = autosave.find_autosave(path)
        if found is not None and dialogs.ask_restore_autosave(self, path.name, found.when()):
            try:
                restored = cell_from_text(found.file.read_text("utf-8"), str(found.file))
            except (CellError, OSError) as e:
                dialogs.show_error(self, "Cannot restore the autosave", str(e))
            else:
                if self._show(restored, path, relayout=False, saved=False):
                    self.statusBar().showMessage(f"Restored unsaved changes of {path.name}", 6000)
                    return True
        if found is not None:
            autosave.remove_autosave(path)
        if not self._show(cell, path, relayout=False, saved=True):
            return False
        self.statusBar().showMessage(f"Opened {path}", 4000)
        return True

    def _restore_untitled(self) -> bool:
        found = autosave.find_autosave(None)
        if found is None:
            return False
        if not dialogs.ask_restore_autosave(self, "a new cell", found.when()):
            autosave.remove_autosave(None)
            return False
        try:
            cell = cell_from_text(found.file.read_text("utf-8"), str(found.file))
        except (CellError, OSError) as e:
            dialogs.show_error(self, "Cannot restore the autosave", str(e))
            return False
        return self._show(cell, None, relayout=False, saved=False)

    def save(self) -> bool:
        if self.document.path is None:
            return self.save_as()
        return self._save_to(self.document.path)

    def save_as(self, path: Path | None = None) -> bool:
        if path is None:
            path = dialogs.ask_save_path(self, "Save cell as", self.document.suggested_name(self.cell),
                                         dialogs.CELL_FILTER)
            if path is None:
                return False
        return self._save_to(with_cell_suffix(Path(path)))

    def _save_to(self, path: Path) -> bool:
        cell = self.cell
        try:
            save_cell(cell, path)
        except CellError as e:  # a file refused as a target, or a cell a file cannot hold (a NaN const)
            dialogs.show_error(self, "Cannot save", str(e))
            return False
        except OSError as e:
            dialogs.show_error(self, "Cannot save", f"{path}: {e.strerror or e}")
            return False
        old = self.document.path
        self.document = Document(path=path, saved=cell.to_json())
        autosave.remove_autosave(old)
        autosave.remove_autosave(path)
        recent_files.add_recent_file(path)
        self.update_title()
        self.statusBar().showMessage(f"Saved {path}", 4000)
        return True

    def maybe_save(self) -> bool:
        """True when the document may be replaced: no unsaved changes, or saved, or discarded."""
        if not self.is_modified():
            return True
        answer = dialogs.ask_save_changes(self, self.document.display_name(self.cell))
        if answer == "save":
            return self.save()
        if answer == "discard":
            autosave.remove_autosave(self.document.path)
            return True
        return False

    def write_autosave(self) -> Path | None:
        """Writes the autosave when there are unsaved changes; returns where."""
        if not self.is_modified():
            return None
        try:
            return autosave.write_autosave(cell_to_text(self.cell), self.document.path)
        except (OSError, CellError) as e:
            log.warning("autosave failed: %s", e)
            return None

    def export_cuda(self, path: Path | None = None) -> bool:
        """Writes the generated CUDA of the chosen schedule to a .cu file."""
        if not self.info.ok:
            dialogs.show_error(self, "Cannot export CUDA",
                               f"The cell has {len(self.info.errors)} error(s); see Problems.")
            return False
        schedule = self.plan_panel.schedule()
        if path is None:
            stem = Path(self.document.suggested_name(self.cell)).name.replace(".cell.json", "")
            path = dialogs.ask_save_path(self, "Export CUDA", f"{stem}_{schedule}.cu",
                                         "CUDA source (*.cu);;All files (*)")
            if path is None:
                return False
        fit = ExportFit()
        try:
            # a module with persistent kernels is compiled by nvcc to see whether one spills registers
            # (seconds, the first time; the kernel cache keeps the answer)
            QtWidgets.QApplication.setOverrideCursor(QtCore.Qt.CursorShape.WaitCursor)
            try:
                source = generate_cuda(self.cell, self.sizes(), schedule, fit=fit)
            finally:
                QtWidgets.QApplication.restoreOverrideCursor()
            atomic_write(path, source.text.encode("utf-8"))
        except CellError as e:
            dialogs.show_error(self, "Cannot export CUDA", str(e))
            return False
        except OSError as e:
            dialogs.show_error(self, "Cannot export CUDA", f"{path}: {e.strerror or e}")
            return False
        notes = [f"{name} spilled registers as planned: written with {how}"
                 for name, (_, how) in fit.rewritten.items()]
        if fit.failed:
            notes.append(f"kernels not checked for spilled registers: {fit.failed.splitlines()[0]}")
            log.warning("export: the kernels nvcc could not check are written as planned: %s", fit.failed)
        self.statusBar().showMessage("; ".join([f"Wrote {path}", *notes]), 8000 if notes else 4000)
        return True

    def rebuild_recent_menu(self, menu: QtWidgets.QMenu) -> None:
        menu.clear()
        files = recent_files.recent_files()
        for i, path in enumerate(files):
            action = menu.addAction(f"&{i + 1}  {path.name}")
            action.setToolTip(str(path))
            action.setStatusTip(str(path))
            action.triggered.connect(lambda _=False, p=path: self.open_file(p))
        if not files:
            menu.addAction("No recent files").setEnabled(False)
        menu.addSeparator()
        menu.addAction("Clear list", recent_files.clear_recent_files).setEnabled(bool(files))

    # == edit ==========================================================================================
    def copy_selection(self) -> bool:
        ids = self.adapter.selected_ids()
        if not ids:
            return False
        fragment = fragments.fragment_of(self.cell, ids, self.adapter.state_update_positions())
        # As plain text: a QMimeData made in Python and handed to the clipboard crashes PySide6 at exit.
        QtWidgets.QApplication.clipboard().setText(fragments.fragment_to_text(fragment))
        self.statusBar().showMessage(f"Copied {len(ids)} node(s)", 3000)
        return True

    def cut_selection(self) -> bool:
        if not self.copy_selection():
            return False
        self.adapter.delete_selected()
        return True

    def paste(self) -> list[str]:
        text = QtWidgets.QApplication.clipboard().text()
        fragment = fragments.fragment_from_text(text) if text else None
        if fragment is None:
            self.statusBar().showMessage("The clipboard holds no CellFuse nodes", 3000)
            return []
        ids = fragments.fragment_ids(fragment)
        heights = [n.view.height for i in ids for n in self.adapter.canvas_nodes(i)]
        offset = fragments.paste_offset(fragment, max(heights, default=fragments.DEFAULT_NODE_HEIGHT))
        try:
            return self.adapter.paste(fragments.plan_paste(self.cell, fragment, offset))
        except CellError as e:
            self.statusBar().showMessage(f"Cannot paste: {e}", 6000)
            return []

    def delete_selection(self) -> None:
        self.adapter.delete_selected()

    def group_selection(self, name: str | None = None) -> bool:
        """Groups the selected nodes under `name` (asked for when None), as one undoable edit."""
        ids = self.adapter.selected_ids()
        if not ids:
            self.statusBar().showMessage("Select the nodes to group first", 4000)
            return False
        if name is None:
            name = dialogs.ask_group_name(self, "group")
            if name is None:
                return False
        try:
            self.adapter.group(ids, name)
        except CellError as e:
            self.statusBar().showMessage(f"Cannot group: {e}", 6000)
            return False
        self.statusBar().showMessage(f"Grouped {len(ids)} node(s) as '{name}': double-click to open", 6000)
        return True

    def rename_group_selection(self, name: str | None = None) -> bool:
        """Renames the selected group, or the open one, to `name` (asked for when None), as one undoable
        edit."""
        group = self.adapter.group_to_rename()
        if group is None:
            self.statusBar().showMessage("Select one group to rename", 4000)
            return False
        old = group.name()
        if name is None:
            name = dialogs.ask_group_name(self, old)
            if name is None:
                return False
        try:
            self.adapter.rename_group(group, name)
        except CellError as e:
            self.statusBar().showMessage(f"Cannot rename the group '{old}': {e}", 6000)
            return False
        self.statusBar().showMessage(f"Renamed the group '{old}' to '{name}'", 4000)
        return True

    def ungroup_selection(self) -> bool:
        """Ungroups the selected groups, or the open one, as one undoable edit."""
        names = self.adapter.ungroup_selected()
        if not names:
            self.statusBar().showMessage("Select a group to ungroup", 4000)
            return False
        self.statusBar().showMessage(f"Ungrouped {', '.join(repr(n) for n in names)}", 4000)
        return True

    def open_node_search(self) -> None:
        self.adapter.graph.open_node_search(self.adapter.node_search_names())

    # == run ===========================================================================================
    def validate(self) -> CellInfo:
        self._on_cell_changed(self.cell)
        self.problems_dock.show()
        self.problems_dock.raise_()
        errors = len(self.info.errors)
        self.statusBar().showMessage(
            f"{errors} error(s), {len(self.info.problems) - errors} warning(s)" if self.info.problems
            else "The cell is valid.", 5000)
        return self.info

    def bench_config(self) -> BenchConfig:
        panel = self.bench_panel
        return BenchConfig(sizes=panel.sizes(), backend=panel.backend(), schedules=panel.schedules(),
                           baselines=panel.baselines(), repeats=panel.repeats(), train=panel.train(),
                           lengths=panel.lengths(), bidirectional=panel.bidirectional(),
                           precision=panel.precision())

    def run_benchmark(self) -> bool:
        """Starts the benchmark of the current cell in a worker thread; False when it cannot start."""
        self.bench_dock.show()
        self.bench_dock.raise_()
        if self.worker is not None:
            return False
        if not self.info.ok:
            self.bench_panel.show_status(f"Fix the {len(self.info.errors)} error(s) in Problems first.")
            return False
        try:
            sweep = self.bench_panel.sweep()
        except ValueError as e:
            self.bench_panel.show_status(str(e))
            return False
        # Refused here, not by the worker once it has started (a sweep would lose the values run before).
        panel = self.bench_panel
        if why := panel.lengths_problem() or panel.bidirectional_problem():
            self.bench_panel.show_status(why)
            return False
        config = self.bench_config()
        if not config.schedules and not config.baselines:
            self.bench_panel.show_status("Choose at least one schedule or baseline.")
            return False
        self.worker = BenchWorker(self.cell, config, sweep, self)
        self.worker.progressed.connect(self.bench_panel.show_progress)
        self.worker.succeeded.connect(self._bench_succeeded)
        self.worker.failed.connect(self._bench_failed)
        self.worker.finished.connect(self._bench_thread_done)
        self.bench_panel.set_running(True)
        self.actions_.cancel.setEnabled(True)
        in_precision = f" in {config.precision}" if config.precision != "fp32" else ""
        self.bench_panel.show_status(f"Running on {config.backend}{in_precision}…")
        self.worker.start()
        return True

    def cancel_benchmark(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            self.bench_panel.show_status("Cancelling…")

    def _bench_succeeded(self, result) -> None:
        parts = result.results if hasattr(result, "param") else [result]  # a sweep's, or the one
        cancelled = not parts or any(part.cancelled for part in parts)
        if cancelled and not any(row.median_ms is not None for part in parts for row in part.rows):
            # cancelled before anything was timed: no run to list, no empty chart
            self.bench_panel.show_status("Cancelled before anything was timed.")
            self.bench_finished.emit(None)
            return
        self._run_number += 1
        is_sweep = hasattr(result, "param")
        run = BenchRun(self._run_number, sweep=result if is_sweep else None,
                       result=None if is_sweep else result)
        if not is_sweep:
            run.unavailable = dict(getattr(result, "left_out", {}))
        self.bench_panel.add_run(run)
        self.show_bench_results()
        results = run.results
        first = run.first
        cancelled = any(r.cancelled for r in results)
        wrong = [r.name for res in results for r in res.rows if not r.ok]
        text = f"Run #{run.number} on {first.device}" if first is not None else f"Run #{run.number}"
        if cancelled:
            text += " — cancelled, partial results"
        if wrong:
            text += f" — not timed (wrong or failed): {', '.join(dict.fromkeys(wrong))}"
        # Of what was left out, the baselines are not here; the schedules do not run in this precision.
        absent = [name for name in run.unavailable if name in BASELINES]
        if absent:
            text += f" — not available here: {', '.join(absent)}"
        if other := [name for name in run.unavailable if name not in BASELINES]:
            text += f" — not run in {run.precision}: {', '.join(other)}"
        for said in (run.precision_text(), run.directions_text(), run.lengths_text()):
            if said:
                text += f" — {said}"
        self.bench_panel.show_status(text)
        self.bench_finished.emit(run)

    def _bench_failed(self, message: str) -> None:
        self.bench_panel.show_status(f"The benchmark failed: {message}")
        self.bench_finished.emit(None)

    def _bench_thread_done(self) -> None:
        if self.worker is not None:
            self.worker.deleteLater()
        self.worker = None
        self.bench_panel.set_running(False)
        self.actions_.cancel.setEnabled(False)

    def export_chart(self, path: Path | None = None) -> bool:
        if not self.bench_panel.runs:
            self.statusBar().showMessage("Run the benchmark first", 3000)
            return False
        if path is None:
            path = dialogs.ask_save_path(self, "Save chart", "benchmark.png",
                                         "PNG image (*.png);;SVG image (*.svg)")
            if path is None:
                return False
        path = Path(path) if Path(path).suffix else Path(path).with_suffix(".png")
        try:
            self.bench_panel.results.save_chart(str(path))
        except (OSError, ValueError) as e:
            dialogs.show_error(self, "Cannot save chart", f"{path}: {e}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 4000)
        return True

    def export_results(self, path: Path | None = None) -> bool:
        run = self.bench_panel.shown_run()
        if run is None:
            self.statusBar().showMessage("Run the benchmark first", 3000)
            return False
        if path is None:
            path = dialogs.ask_save_path(self, "Save results", "benchmark.json",
                                         "JSON (*.json);;CSV (*.csv)")
            if path is None:
                return False
        path = Path(path) if Path(path).suffix else Path(path).with_suffix(".json")
        import json

        text = run.to_csv() if path.suffix.lower() == ".csv" else json.dumps(run.to_json(), indent=2) + "\n"
        try:
            atomic_write(path, text.encode("utf-8"))
        except OSError as e:
            dialogs.show_error(self, "Cannot save results", f"{path}: {e.strerror or e}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 4000)
        return True

    # == window ========================================================================================
    def _restore_window_state(self) -> None:
        s = recent_files.settings()
        geometry = s.value("window/geometry")
        state = s.value("window/state")
        self._state_restored = False
        if isinstance(geometry, QtCore.QByteArray):
            self.restoreGeometry(geometry)
        if isinstance(state, QtCore.QByteArray):
            self._state_restored = self.restoreState(state)

    def arrange_docks(self) -> None:
        """The default sizes of the panels: most of the window for the canvas."""
        horizontal, vertical = QtCore.Qt.Orientation.Horizontal, QtCore.Qt.Orientation.Vertical
        self.resizeDocks([self.palette_dock, self.properties_dock], [190, 340], horizontal)
        self.bottom_docks.fit()
        self.resizeDocks([self.properties_dock, self.plan_dock],
                         [int(self.height() * 0.36), int(self.height() * 0.5)], vertical)

    def showEvent(self, event: QtGui.QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            if not self._state_restored:
                self.arrange_docks()

    def end_by_signal(self) -> None:
        """Before the application ends on Ctrl+C or SIGTERM: no question asked, the unsaved work kept in
        the autosave (the next start offers it back), the benchmark stopped, the layout remembered."""
        self.write_autosave()
        self._wind_down()

    def _wind_down(self) -> None:
        self.plan_worker.stop()
        if self.worker is not None:
            self.worker.cancel()
            self.worker.wait(10_000)
        s = recent_files.settings()
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        self.autosave_timer.stop()

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if not self.maybe_save():
            event.ignore()
            return
        autosave.remove_autosave(self.document.path)
        self._wind_down()
        event.accept()
