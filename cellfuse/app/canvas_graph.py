"""NodeGraphQt's graph, with the user's gestures that create or rename nodes handed to CellFuse.

NodeGraphQt would create nodes from the Tab search or a drop itself, and rename a node from its
title with no check. Here those gestures become signals; the cell adapter decides what they do, so
that every node gets a valid, unique cell id and a state gets its update node; a node asked for at the
cursor goes to the free place nearest it (free_place, where every new node finds its place, the
adapter's too). The Tab search lists the ops by the names the palette shows.
"""

from __future__ import annotations

import logging

from NodeGraphQt import NodeGraph
from NodeGraphQt.constants import PortTypeEnum
from NodeGraphQt.widgets.tab_search import TabSearchMenuWidget
from PySide6 import QtCore, QtGui, QtWidgets

from . import canvas_layout, theme, wire_drop
from .canvas_viewer import CanvasViewer
from .minimap import Minimap
from .node_finder import NodeFinder
from .node_types import (
    ALL_NODE_CLASSES,
    ROLE_GROUP,
    ROLE_OP,
    ROLE_OUTPUT,
    ROLE_UPDATE,
    CellNode,
    OutputNode,
    node_type_of,
)

log = logging.getLogger(__name__)

OP_MIME_TYPE = "application/x-cellfuse-op"
NEW_NODE_SIZE = (160.0, 80.0)  # the room kept clear for a new node, before it is made and its size known


class OpSearchMenu(TabSearchMenuWidget):
    """NodeGraphQt's node search, with the names it is given as one flat list in their order.
    NodeGraphQt's own files them in submenus titled with the node classes' type strings
    ("cellfuse.Elementwise"), which are no names a user knows."""

    def build_menu_tree(self) -> None:
        for name in self._node_dict:
            action = QtGui.QAction(name, self)
            # Not a slot of the menu: a menu drops every connection of an action to itself when the
            # action is taken out of it, as the list does while the user types.
            action.triggered.connect(lambda _checked=False, name=name: self._submit(name))
            self._actions[name] = action

    def _submit(self, name: str) -> None:
        if not self._block_submit:
            self.search_submitted.emit(self._node_dict[name])
        self._close()

    def _set_menu_visible(self, visible: bool) -> None:
        # NodeGraphQt shows its submenus while nothing is typed, and only the matches while typing;
        # here every name stands for its submenu.
        for action in self._actions.values():
            if visible:
                self.addAction(action)
            else:
                self.removeAction(action)

    def names(self) -> list[str]:
        """The names listed now, top to bottom."""
        return [a.text() for a in self.actions() if a in self._actions.values()]

    viewer: QtWidgets.QWidget | None = None  # the canvas it searches for (set by CanvasGraph)

    def move(self, pos: QtCore.QPoint) -> None:
        # NodeGraphQt places the search at the cursor in the viewer's coordinates; the menu is a window
        # of its own, placed in the screen's: without the mapping it opened at the screen's top left.
        viewer = self.viewer
        super().move(viewer.mapToGlobal(pos) if viewer is not None and self.parent() is None else pos)


class CanvasGraph(NodeGraph):
    """The canvas's graph. A wire dropped on empty canvas opens the op search with the ops whose node
    takes it (see wire_drop); the node picked is added there and wired in, as one undo step."""

    node_requested = QtCore.Signal(str, object)  # node type, (x, y) in scene coordinates
    op_dropped = QtCore.Signal(str, object)  # op name, (x, y)
    rename_requested = QtCore.Signal(str, str)  # canvas node id, new name

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        stack = QtGui.QUndoStack()
        super().__init__(parent, undo_stack=stack, viewer=CanvasViewer(undo_stack=stack))
        stack.setParent(self)
        # A refused drag must say why, through validation; and NodeGraphQt's acyclic check can
        # leave an undo macro open when it refuses a connection.
        self.set_acyclic(False)
        self.set_background_color(*theme.CANVAS_BACKGROUND)
        self.set_grid_color(*theme.CANVAS_GRID)
        viewer = self.viewer()
        self.minimap = Minimap(viewer)
        self.finder = NodeFinder(viewer)
        viewer._search_widget = self.search_menu = OpSearchMenu()
        self.search_menu.viewer = viewer
        self.search_menu.search_submitted.connect(viewer._on_search_submitted)
        self._wire: tuple[CellNode, str, bool] | None = None  # a dropped wire: its node, port, from an output
        viewer.wire_dropped.connect(self._on_wire_dropped)
        # The window owns Undo and Redo; the viewer's copies would make the shortcuts ambiguous.
        for action in (viewer.qaction_for_undo(), viewer.qaction_for_redo()):
            if action is not None:
                action.setShortcuts([])

    def get_unique_name(self, name: str) -> str:
        # NodeGraphQt renames a node whose name another node has ("f" -> "f 1"). The adapter keeps cell
        # ids unique itself, and the name of a group is free: two groups, or a group and a node, may
        # share one, so NodeGraphQt must take every name as it is given.
        return name

    def free_place(self, near: tuple[float, float] | None = None, size: tuple[float, float] = NEW_NODE_SIZE,
                   in_sight: bool = False) -> tuple[float, float]:
        """The top left nearest `near` where a new node (or a block of pasted nodes, or a state and its
        update node side by side) of `size` covers no node shown; with `in_sight`, places in the view
        before those outside it. With no `near`: the middle of the view, in sight first, so that nodes
        added where no place is asked for neither pile up nor land out of sight."""
        view = self.viewer().visible_scene_rect()
        if near is None:
            near, in_sight = (view.center().x() - size[0] / 2, view.center().y() - size[1] / 2), True
        # The graph's own list of nodes, not the viewer's: that one goes through every item of the scene.
        shown = [n.view.sceneBoundingRect() for n in self.all_nodes() if n.view.isVisible()]
        taken = [(r.x(), r.y(), r.width(), r.height()) for r in shown]
        within = (view.x(), view.y(), view.width(), view.height()) if in_sight else None
        return canvas_layout.nearest_free((*near, *size), taken, within=within)

    # -- NodeGraphQt's handlers, redirected ------------------------------------------------------
    def _on_search_triggered(self, node_type: str, pos) -> None:
        x, y = float(pos[0]), float(pos[1])
        wire = self._wire
        if wire is None:
            self.node_requested.emit(node_type, self.free_place((x, y)))
            return
        node, port, from_output = wire
        if not from_output:  # the new node's output port comes to the wire's end: left of it
            x -= NEW_NODE_SIZE[0]
        before = set(self.all_nodes())
        stack = self.undo_stack()
        stack.beginMacro(f"add a node on the wire of '{node.name()}'")
        try:
            self.node_requested.emit(node_type, self.free_place((x, y)))
            made = [n for n in self.all_nodes() if n not in before and isinstance(n, CellNode)
                    and n.ROLE in (ROLE_OP, ROLE_OUTPUT)]
            if not made and node_type == node_type_of(OutputNode):  # the cell's one output node
                made = [n for n in self.all_nodes() if isinstance(n, CellNode) and n.ROLE == ROLE_OUTPUT]
            if made:
                self._wire_in(made[0], node, port, from_output)
        finally:
            stack.endMacro()

    def _wire_in(self, new: CellNode, node: CellNode, port: str, from_output: bool) -> None:
        if from_output:
            inputs = new.input_ports()
            if inputs:
                into = inputs[wire_drop.port_for([p.name() for p in inputs], node.OP)]
                into.connect_to(node.get_output(port))
        elif new.output_ports():
            new.output_ports()[0].connect_to(node.get_input(port))

    def _on_wire_dropped(self, port_item, _scene_pos) -> None:
        node = self.get_node_by_id(port_item.node.id)
        if not isinstance(node, CellNode) or node.ROLE == ROLE_GROUP:
            return
        self._wire = (node, port_item.name, port_item.port_type == PortTypeEnum.OUT.value)
        # After the release that dropped the wire is done: the search waits for a pick in a loop of its own.
        QtCore.QTimer.singleShot(0, self._search_for_wire)

    def _search_for_wire(self) -> None:
        if self._wire is None:
            return
        node, port, from_output = self._wire
        classes = {cls.NODE_NAME: cls for cls in ALL_NODE_CLASSES if cls.ROLE != ROLE_UPDATE}
        names = {op: [node_type_of(classes[op])] for op in wire_drop.ops_for_wire(from_output, node.OP, port)
                 if op in classes}
        try:
            self.open_node_search(names)
        finally:
            self._wire = None

    def _on_node_name_changed(self, node_id: str, name: str) -> None:
        self.rename_requested.emit(node_id, name)
        node = self.get_node_by_id(node_id)
        if node is not None:
            node.view.text_item.setPlainText(node.name())
            node.view.draw_node()

    def _on_node_data_dropped(self, mimedata: QtCore.QMimeData, pos: QtCore.QPoint) -> None:
        if mimedata.hasFormat(OP_MIME_TYPE):
            op = bytes(mimedata.data(OP_MIME_TYPE).data()).decode()
            self.op_dropped.emit(op, self.free_place((float(pos.x()), float(pos.y()))))
            return
        log.debug("ignored a drop of %s", mimedata.formats())

    # -- search ---------------------------------------------------------------------------------
    def open_node_search(self, names: dict[str, list[str]]) -> None:
        """Opens the node search (Tab) with the given name -> node types, listed in their order."""
        # NodeGraphQt keeps the list it built first, and asks for a new one when a node class is
        # registered: built anew whenever it is not this list.
        listed = {name: types[0] for name, types in names.items() if len(types) == 1}
        if self.search_menu._node_dict != listed:
            self.search_menu.rebuild = True
        self.viewer().tab_search_set_nodes(names)
