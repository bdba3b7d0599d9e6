"""NodeGraphQt's graph, with the user's gestures that create or rename nodes handed to CellFuse.

NodeGraphQt would create nodes from the Tab search or a drop itself, and rename a node from its
title with no check. Here those gestures become signals; the cell adapter decides what they do, so
that every node gets a valid, unique cell id and a state gets its update node.
"""

from __future__ import annotations

import logging

from NodeGraphQt import NodeGraph
from PySide6 import QtCore

from . import theme

log = logging.getLogger(__name__)

OP_MIME_TYPE = "application/x-cellfuse-op"


class CanvasGraph(NodeGraph):
    node_requested = QtCore.Signal(str, object)  # node type, (x, y) in scene coordinates
    op_dropped = QtCore.Signal(str, object)  # op name, (x, y)
    rename_requested = QtCore.Signal(str, str)  # canvas node id, new name

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        # A refused drag must say why, through validation; and NodeGraphQt's acyclic check can
        # leave an undo macro open when it refuses a connection.
        self.set_acyclic(False)
        self.set_background_color(*theme.CANVAS_BACKGROUND)
        self.set_grid_color(*theme.CANVAS_GRID)
        viewer = self.viewer()
        # The window owns Undo and Redo; the viewer's copies would make the shortcuts ambiguous.
        for action in (viewer.qaction_for_undo(), viewer.qaction_for_redo()):
            if action is not None:
                action.setShortcuts([])

    # -- NodeGraphQt's handlers, redirected ------------------------------------------------------
    def _on_search_triggered(self, node_type: str, pos) -> None:
        self.node_requested.emit(node_type, (float(pos[0]), float(pos[1])))

    def _on_node_name_changed(self, node_id: str, name: str) -> None:
        self.rename_requested.emit(node_id, name)
        node = self.get_node_by_id(node_id)
        if node is not None:
            node.view.text_item.setPlainText(node.name())
            node.view.draw_node()

    def _on_node_data_dropped(self, mimedata: QtCore.QMimeData, pos: QtCore.QPoint) -> None:
        if mimedata.hasFormat(OP_MIME_TYPE):
            op = bytes(mimedata.data(OP_MIME_TYPE).data()).decode()
            self.op_dropped.emit(op, (float(pos.x()), float(pos.y())))
            return
        log.debug("ignored a drop of %s", mimedata.formats())

    # -- search ---------------------------------------------------------------------------------
    def open_node_search(self, names: dict[str, list[str]]) -> None:
        """Opens NodeGraphQt's node search (Tab) with the given name -> node types."""
        self.viewer().tab_search_set_nodes(names)
