"""NodeGraphQt's viewer (the canvas widget), with what the editor needs to hear from it.

- The selection as a click leaves it. NodeGraphQt says the selection changed before Qt's own release
  handling deselects the other nodes of a selection a click lands in: a click on one node of ten
  selected ones left the panels saying ten. The viewer says it again once the click is done.
- Its wires are CellPipes (routed around nodes by its `router`, lit while an end is selected), in
  the colour of the node they come from from the start, restyled once the selection has changed: those
  lit and those of the nodes selected.
- A wire dropped on empty canvas (`wire_dropped`), for the op search to offer what fits its port.
- Any change of what it shows (zoom, pan, resize: `view_changed`), for what is drawn at a size on
  screen rather than in the scene (the plan's labels) and for the minimap.
"""

from __future__ import annotations

import shiboken6
from NodeGraphQt.qgraphics.node_abstract import AbstractNodeItem
from NodeGraphQt.qgraphics.port import PortItem
from NodeGraphQt.widgets.viewer import NodeViewer
from PySide6 import QtCore, QtWidgets

from . import canvas_wires
from .canvas_wires import CellPipe
from .group_items import GroupWire
from .node_item import CellNodeItem


class CanvasViewer(NodeViewer):
    view_changed = QtCore.Signal()
    wire_dropped = QtCore.Signal(object, object)  # the port the wire came from (a PortItem), scene QPointF

    def __init__(self, parent: QtWidgets.QWidget | None = None, undo_stack=None) -> None:
        super().__init__(parent, undo_stack=undo_stack)
        self.router = canvas_wires.WireRouter(self)
        self.lit_wires: set[QtWidgets.QGraphicsItem] = set()  # kept by the wires as they are styled
        # One restyle of the wires for a selection changed node by node (select all: a signal per node).
        self._restyle_timer = QtCore.QTimer(self)
        self._restyle_timer.setSingleShot(True)
        self._restyle_timer.setInterval(0)
        self._restyle_timer.timeout.connect(self.restyle_wires)
        self.scene().selectionChanged.connect(self._restyle_timer.start)
        if undo_stack is not None:  # an edit draws the groups' wires anew, unlit
            undo_stack.indexChanged.connect(self._restyle_timer.start)

    def selected_ids(self) -> set[str]:
        return {n.id for n in self.selected_nodes()}

    # -- wires ----------------------------------------------------------------------------------------
    def establish_connection(self, start_port, end_port) -> None:
        pipe = CellPipe()
        self.scene().addItem(pipe)
        pipe.set_connections(start_port, end_port)
        color = canvas_wires.own_color(pipe)
        if color is not None:
            pipe.color = color
        pipe.draw_path(pipe.input_port, pipe.output_port)
        pipe.restyle()
        if not start_port.node.visible or not end_port.node.visible:
            pipe.hide()

    def restyle_wires(self) -> None:
        """Lights the wires of the selected nodes, the groups' wires too, and no other: styles again the
        wires lit until now and those of the nodes selected now (every wire of a cell of a thousand
        nodes took 50-70 ms, after every edit and every click)."""
        scene = self.scene()
        wires = set(self.lit_wires)
        for item in scene.selectedItems():
            if isinstance(item, CellNodeItem):
                for port in [*item.inputs, *item.outputs]:
                    wires.update(port.connected_pipes)
                wires.update(item.wires)
        for wire in wires:
            if not shiboken6.isValid(wire) or wire.scene() is not scene:
                self.lit_wires.discard(wire)  # deleted, or gone from the canvas
            elif isinstance(wire, CellPipe):
                wire.restyle()
            elif isinstance(wire, GroupWire):
                canvas_wires.restyle_group_wire(wire)

    def apply_live_connection(self, event) -> None:
        start = self._start_port if self._LIVE_PIPE.isVisible() else None
        fresh = self._detached_port is None  # a new wire, not one pulled off a port
        pos = event.scenePos()
        on_item = any(isinstance(i, (PortItem, AbstractNodeItem)) for i in self.scene().items(pos))
        super().apply_live_connection(event)
        if start is not None and fresh and not on_item and not start.locked:
            self.wire_dropped.emit(start, pos)

    # -- selection --------------------------------------------------------------------------------------
    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        before = self.selected_ids()
        super().mouseReleaseEvent(event)
        after = self.selected_ids()
        if after != before:
            self.node_selection_changed.emit(sorted(after - before), sorted(before - after))

    # -- what it shows ----------------------------------------------------------------------------------
    def _update_scene(self) -> None:
        super()._update_scene()
        self.view_changed.emit()

    def center_selection(self, nodes=None) -> None:
        super().center_selection(nodes)
        self.view_changed.emit()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self.view_changed.emit()

    def visible_scene_rect(self) -> QtCore.QRectF:
        return self.mapToScene(self.viewport().rect()).boundingRect()

    def centre_at(self, point: QtCore.QPointF) -> None:
        """Moves the view, at its zoom, so that `point` of the scene is in its middle."""
        self._scene_range.translate(point - self._scene_range.center())
        self._update_scene()
