"""The plan panel: the schedule chooser and what the scheduler made of the cell at the current sizes
(launches, FLOPs and bytes per step, the GEMM groups and fused kernels, coloured as on the canvas)."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from ..codegen.plan_text import SCHEDULE_LINES
from . import theme
from .plan_overlay import regions_of

NODES_ROLE = QtCore.Qt.ItemDataRole.UserRole
REGION_ROLE = QtCore.Qt.ItemDataRole.UserRole + 1


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def loop_text(summary: dict) -> str:
    """One sentence on how the plan runs its steps beyond launches one after another: the kernel per layer
    of a persistent or tensor plan (cooperative where its blocks wait for each other), the layers side by
    side of a wavefront (see plan_text.summary), or "" for neither."""
    p = summary.get("persistent")
    if summary.get("layer_streams"):
        return ("Each layer runs its steps on a stream of its own, a chunk of steps beside the layer "
                "below's next chunk.")
    if not p:
        return ""
    barriers = f"{p['barriers_per_step']} grid barrier(s)"
    waits = (f"{p['exchange_waits_per_step']} wait(s) per step for the values of other blocks in an "
             f"exchange buffer ({barriers if p['barriers_per_step'] else 'no grid barrier'})"
             if p.get("exchange_waits_per_step") else f"{barriers} per step")
    kind = "cooperative kernel" if p.get("cooperative", True) else "kernel, its blocks independent,"
    text = (f"One {kind} per layer runs every step: {p['blocks']} blocks of {p['threads']} "
            f"threads, {waits}, "
            f"{p['smem_bytes_per_block'] / 1024:.0f} KiB of shared memory per block.")
    if p.get("tensor_cores"):
        text += f" GEMMs on tensor cores ({p['tensor_core_math']})."
    if p.get("note"):
        text += f" Note: {p['note']}."
    return text


class PlanPanel(QtWidgets.QWidget):
    schedule_changed = QtCore.Signal(str)
    nodes_activated = QtCore.Signal(list)
    overlay_toggled = QtCore.Signal(bool)
    region_hovered = QtCore.Signal(object)  # the name of the launch whose row is under the cursor, or None

    def __init__(self, schedules: list[str], parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.schedule_combo = QtWidgets.QComboBox()
        self.schedule_combo.addItems(schedules)
        for i, name in enumerate(schedules):  # each rung explains itself where it is chosen
            line = SCHEDULE_LINES.get(name)
            if line is not None:
                self.schedule_combo.setItemData(i, f"<b>{name}</b>: {line}",
                                                QtCore.Qt.ItemDataRole.ToolTipRole)
        self.overlay_check = QtWidgets.QCheckBox("Outline on canvas")
        self.overlay_check.setChecked(True)
        top = QtWidgets.QHBoxLayout()
        top.addWidget(QtWidgets.QLabel("Schedule"))
        top.addWidget(self.schedule_combo, 1)
        top.addWidget(self.overlay_check)

        self.sizes_label = QtWidgets.QLabel()
        self.sizes_label.setProperty("role", "hint")
        self.message = QtWidgets.QLabel()
        self.message.setWordWrap(True)
        self.message.setProperty("role", "error")
        self.updating = QtWidgets.QLabel("Updating the plan…")
        self.updating.setProperty("role", "hint")
        self.updating.setVisible(False)

        stats = QtWidgets.QGridLayout()
        stats.setHorizontalSpacing(14)
        self.stat_values: dict[str, QtWidgets.QLabel] = {}
        for row, (key, title) in enumerate([("launches_per_step", "Launches per step"),
                                            ("launches_before_loop", "Launches before the loop"),
                                            ("flops_per_step", "FLOPs per step"),
                                            ("bytes_per_step", "Bytes per step"),
                                            ("intensity", "FLOPs per byte")]):
            name = QtWidgets.QLabel(title)
            name.setProperty("role", "hint")
            value = QtWidgets.QLabel("–")
            value.setProperty("role", "heading")
            value.setAlignment(QtCore.Qt.AlignmentFlag.AlignRight)
            stats.addWidget(name, row, 0)
            stats.addWidget(value, row, 1)
            self.stat_values[key] = value
        # what a persistent rung's kernel holds: blocks, barriers, shared memory, tensor cores
        self.kernel_label = QtWidgets.QLabel()
        self.kernel_label.setWordWrap(True)
        self.kernel_label.setProperty("role", "hint")
        self.kernel_label.setVisible(False)
        stats.addWidget(self.kernel_label, len(self.stat_values), 0, 1, 2)
        self.stats_box = QtWidgets.QGroupBox("Per step of one layer")
        self.stats_box.setLayout(stats)

        self.tree = QtWidgets.QTreeWidget()
        self.tree.setHeaderLabels(["Launch", "Nodes"])
        self.tree.setRootIsDecorated(False)
        self.tree.header().setSectionResizeMode(0, QtWidgets.QHeaderView.ResizeMode.ResizeToContents)
        self.tree.setWordWrap(True)

        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(top)
        layout.addWidget(self.sizes_label)
        layout.addWidget(self.message)
        layout.addWidget(self.updating)
        layout.addWidget(self.stats_box)
        layout.addWidget(self.tree, 1)

        self.schedule_combo.currentTextChanged.connect(self.schedule_changed)
        self.overlay_check.toggled.connect(self.overlay_toggled)
        self.tree.itemClicked.connect(
            lambda item, _c: self.nodes_activated.emit(item.data(0, NODES_ROLE) or []))
        # The row under the cursor points at its launch on the canvas.
        self.tree.setMouseTracking(True)
        self.tree.itemEntered.connect(lambda item, _c: self.region_hovered.emit(item.data(0, REGION_ROLE)))
        self.tree.viewport().installEventFilter(self)
        self.has_plan = False
        self.out_of_date = False
        self.show_message("No plan yet.")

    def eventFilter(self, watched: QtCore.QObject, event: QtCore.QEvent) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.tree.viewport() and event.type() == QtCore.QEvent.Type.Leave:
            self.region_hovered.emit(None)
        return super().eventFilter(watched, event)

    def schedule(self) -> str:
        return self.schedule_combo.currentText()

    def set_schedule(self, name: str) -> None:
        self.schedule_combo.setCurrentText(name)

    def show_sizes(self, text: str) -> None:
        self.sizes_label.setText(text)
        self.sizes_label.setToolTip(text)  # the whole line, where the dock is too narrow to show it

    def show_updating(self, updating: bool) -> None:
        """Marks the plan on show as being replaced by one on its way (see plan_worker)."""
        self.updating.setVisible(updating)

    def show_message(self, text: str) -> None:
        """Says why there is no plan (the cell has errors, or the scheduler refused it)."""
        self.message.setText(text)
        self.message.setVisible(True)
        self.stats_box.setEnabled(False)
        for v in self.stat_values.values():
            v.setText("–")
        self.kernel_label.setVisible(False)
        self.tree.clear()
        self.has_plan = False
        self.out_of_date = False

    def mark_out_of_date(self, reason: str) -> None:
        """Keeps the last plan on show, greyed and marked, while the cell cannot be scheduled (a node
        being drawn is not connected yet): the plan is what the user was working from."""
        if not self.has_plan:
            self.show_message(reason)
            return
        self.out_of_date = True
        self.message.setText(f"Out of date: the last valid plan. {reason}")
        self.message.setVisible(True)
        self.stats_box.setEnabled(False)

    def show_summary(self, summary: dict) -> None:
        self.has_plan = True
        self.out_of_date = False
        self.message.setVisible(False)
        self.stats_box.setEnabled(True)
        flops = summary.get("flops_per_step", 0)
        nbytes = summary.get("bytes_per_step", 0)
        self.stat_values["launches_per_step"].setText(str(summary.get("launches_per_step", "?")))
        self.stat_values["launches_before_loop"].setText(str(summary.get("launches_before_loop", 0)))
        self.stat_values["flops_per_step"].setText(human(flops, "FLOP"))
        self.stat_values["bytes_per_step"].setText(human(nbytes, "B"))
        self.stat_values["intensity"].setText(f"{flops / nbytes:.2f}" if nbytes else "–")
        kernel = loop_text(summary)
        self.kernel_label.setText(kernel)
        self.kernel_label.setVisible(bool(kernel))
        self.tree.clear()
        for region in regions_of(summary):
            where = "hoisted" if region.hoisted else "each step"
            where += ", tensor cores" if region.tensor_cores else ""
            kind = "GEMM" if region.kind == "gemm" else "fused"
            item = QtWidgets.QTreeWidgetItem([f"{region.name}  {kind}, {where}", ", ".join(region.nodes)])
            item.setIcon(0, theme.swatch_icon(region.rgb))
            item.setToolTip(0, region.label)
            item.setToolTip(1, ", ".join(region.nodes))
            item.setData(0, NODES_ROLE, list(region.nodes))
            item.setData(0, REGION_ROLE, region.name)
            self.tree.addTopLevelItem(item)
