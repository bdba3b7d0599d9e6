"""The one adapter between the canvas (NodeGraphQt) and the `Cell` it edits.

The canvas is what the user touches; the Cell is derived from it after every edit. Every edit, the
user's drags as well as the editor's own commands, goes through NodeGraphQt's undo stack, and each
change of the stack re-reads the whole canvas into a new Cell. So undo, redo, load and paste can
never leave the Cell and the canvas apart, whatever signals NodeGraphQt emits or forgets.

How the canvas holds a cell:
- every node of the cell is one canvas node whose name is the cell id (our stable id: the canvas
  ids of NodeGraphQt change on every load); its input ports are the op's args, in order, and a port
  with no wire is the arg "" (validation names it as not connected);
- a state is shown twice: the state node (its value at t-1, an output port) and its update node
  (the value it takes at t, an input port), linked by the state node's canvas id and titled with
  the state's name; connecting into the update node sets `cell.updates[state]`;
- the output sink's input sets `cell.output`;
- weight shapes, const values and a node's editor keys are hidden node properties, so that their
  edits are undoable too; positions of update nodes and of the output sink are kept in the cell's
  `x-editor` key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from PySide6 import QtCore, QtGui

from ..graph_model import OPS, Cell, CellError, FormulaEdit, Node
from ..graph_model.builder import COLUMN_SPACING, ROW_SPACING
from ..graph_model.validate import DIMS, ID_PATTERN, OUTPUT_TITLE, update_title
from . import canvas_layout
from .canvas_graph import CanvasGraph
from .fragments import PastePlan
from .node_types import (
    ALL_NODE_CLASSES,
    DEFAULT_CONST_VALUE,
    DEFAULT_WEIGHT_SHAPE,
    OP_NODE_CLASSES,
    PROP_EXTRA,
    PROP_SHAPE,
    PROP_STATE_LINK,
    PROP_VALUE,
    ROLE_OP,
    ROLE_OUTPUT,
    ROLE_UPDATE,
    CellNode,
    OutputNode,
    StateUpdateNode,
    caption_for,
    node_type_of,
)

log = logging.getLogger(__name__)

EDITOR_KEY = "x-editor"
OUTPUT_OP = "output"  # the palette's name for the output sink
SINK_GAP = 70.0
NEW_NODE_SIZE = (160.0, 80.0)  # room kept for a node added where no position is given
FREE_SPOT_REACH = 6  # grid cells searched on each side of the view's middle for a free spot


class _CellInfoCmd(QtGui.QUndoCommand):
    """Changes the cell's name, description or default sizes, undoably."""

    def __init__(self, adapter: CellAdapter, new: dict[str, Any]):
        super().__init__("cell properties")
        self._adapter = adapter
        self._old = adapter.cell_info()
        self._new = new

    def redo(self) -> None:
        self._adapter._set_info(self._new)

    def undo(self) -> None:
        self._adapter._set_info(self._old)


class CellAdapter(QtCore.QObject):
    """Owns the canvas graph; reads it into a Cell and edits it on behalf of the editor."""

    cell_changed = QtCore.Signal(object)  # the new Cell
    selection_changed = QtCore.Signal(list)  # ids of the selected cell nodes
    message = QtCore.Signal(str)  # a short note for the status bar

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self.graph = CanvasGraph(self)
        for cls in ALL_NODE_CLASSES:
            self.graph.register_node(cls)
        self._info: dict[str, Any] = {"name": "untitled", "description": "", "sizes": {},
                                      "extra": {}}
        self._cell = Cell(name="untitled")
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        self._loading = False
        self._index: dict[str, list[CellNode]] | None = None  # cell id -> canvas nodes, until an edit
        # The sets of cell ids the auto layout keeps together in a column (the editor's plan gives
        # them); none by default.
        self.layout_groups: Callable[[Cell], list[list[str]]] = lambda _cell: []
        self.graph.undo_stack().indexChanged.connect(self._on_stack_changed)
        self.graph.node_requested.connect(self._on_node_requested)
        self.graph.op_dropped.connect(lambda op, pos: self._add_or_report(op, pos))
        self.graph.rename_requested.connect(self._on_canvas_rename)
        self.graph.node_selection_changed.connect(lambda *_: self._emit_selection())
        self.graph.node_selected.connect(lambda *_: self._emit_selection())

    # == reading ====================================================================================
    @property
    def cell(self) -> Cell:
        """The cell as the canvas shows it now. Treat it as read-only; it is replaced on each edit."""
        return self._cell

    def undo_stack(self) -> QtGui.QUndoStack:
        return self.graph.undo_stack()

    def cell_info(self) -> dict[str, Any]:
        return {"name": self._info["name"], "description": self._info["description"],
                "sizes": dict(self._info["sizes"]), "extra": dict(self._info["extra"])}

    def _nodes(self) -> list[CellNode]:
        nodes = [n for n in self.graph.all_nodes() if isinstance(n, CellNode)]
        for n in nodes:
            if n.id not in self._seq:
                self._seq[n.id] = self._next_seq
                self._next_seq += 1
        return sorted(nodes, key=lambda n: self._seq[n.id])

    def _ops(self) -> list[CellNode]:
        return [n for n in self._nodes() if n.ROLE == ROLE_OP]

    def _updates(self) -> list[StateUpdateNode]:
        return [n for n in self._nodes() if n.ROLE == ROLE_UPDATE]

    def output_node(self) -> OutputNode | None:
        sinks = [n for n in self._nodes() if n.ROLE == ROLE_OUTPUT]
        return sinks[0] if sinks else None  # type: ignore[return-value]

    def _state_of(self, update: CellNode) -> CellNode | None:
        node = self.graph.get_node_by_id(update.get_property(PROP_STATE_LINK))
        return node if isinstance(node, CellNode) and node.ROLE == ROLE_OP else None

    def _update_of(self, state: CellNode) -> StateUpdateNode | None:
        for u in self._updates():
            if u.get_property(PROP_STATE_LINK) == state.id:
                return u
        return None

    @staticmethod
    def _source_id(port) -> str | None:
        connected = port.connected_ports()
        if not connected:
            return None
        src = connected[0].node()
        if isinstance(src, CellNode) and src.ROLE == ROLE_OP:
            return src.name()
        return None

    def node(self, cell_id: str) -> CellNode:
        """The canvas node of a cell node (a state's own node, not its update)."""
        for n in self._ops():
            if n.name() == cell_id:
                return n
        raise CellError(f"no node '{cell_id}' on the canvas")

    def canvas_nodes(self, cell_id: str) -> list[CellNode]:
        """Every canvas node that shows a cell node: a state's node and its update node."""
        if self._index is None:
            updates = {u.get_property(PROP_STATE_LINK): u for u in self._updates()}
            index: dict[str, list[CellNode]] = {}
            for n in self._ops():
                shown = index.setdefault(n.name(), [])
                shown.append(n)
                if n.OP == "state" and n.id in updates:
                    shown.append(updates[n.id])
            self._index = index
        return list(self._index.get(cell_id, []))

    def update_node(self, state_id: str) -> StateUpdateNode:
        u = self._update_of(self.node(state_id))
        if u is None:
            raise CellError(f"state '{state_id}' has no update node")
        return u

    def _read(self) -> Cell:
        """The cell the canvas shows."""
        nodes: list[Node] = []
        layout: dict[str, list[float]] = {}
        for n in self._ops():
            # A port with no wire is read as the empty id, so that the ports after it keep their place
            # and validation can say which port it is.
            args = [self._source_id(p) or "" for p in n.input_ports()]
            shape = n.get_property(PROP_SHAPE) if n.OP == "weight" else None
            value = n.get_property(PROP_VALUE) if n.OP == "const" else None
            nodes.append(Node(id=n.name(), op=n.OP, args=args,
                              shape=list(shape) if shape is not None else None,
                              value=float(value) if value is not None else None,
                              extra=dict(n.get_property(PROP_EXTRA) or {})))
            x, y = n.pos()
            layout[n.name()] = [round(float(x), 1), round(float(y), 1)]
        updates: dict[str, str] = {}
        editor: dict[str, Any] = {"updates": {}}
        for u in self._updates():
            state = self._state_of(u)
            if state is None:
                continue
            x, y = u.pos()
            editor["updates"][state.name()] = [round(float(x), 1), round(float(y), 1)]
            src = self._source_id(u.input_ports()[0])
            if src is not None:
                updates[state.name()] = src
        output = None
        sink = self.output_node()
        if sink is not None:
            output = self._source_id(sink.input_ports()[0])
            x, y = sink.pos()
            editor["output"] = [round(float(x), 1), round(float(y), 1)]
        extra = dict(self._info["extra"])
        extra[EDITOR_KEY] = editor
        return Cell(name=self._info["name"], nodes=nodes, updates=updates, output=output,
                    description=self._info["description"], sizes=dict(self._info["sizes"]),
                    layout=layout, extra=extra)

    # == keeping the Cell in step ====================================================================
    def _on_stack_changed(self, _index: int = 0) -> None:
        self._index = None
        if not self._loading:
            self.resync()

    def resync(self) -> None:
        """Re-reads the whole canvas into the Cell and refreshes the derived labels."""
        self._index = None
        for u in self._updates():
            state = self._state_of(u)
            title = update_title(state.name()) if state is not None else "(deleted state)"
            if u.name() != title:
                u.set_property("name", title, push_undo=False)
        for n in self._ops():
            if n.OP in ("weight", "const"):
                n.item.set_caption(caption_for(n.OP, n.get_property(PROP_SHAPE) if n.OP == "weight"
                                               else None,
                                               n.get_property(PROP_VALUE) if n.OP == "const" else None))
        self._cell = self._read()
        self.cell_changed.emit(self._cell)

    def _set_info(self, info: dict[str, Any]) -> None:
        self._info = {"name": info["name"], "description": info["description"],
                      "sizes": dict(info["sizes"]), "extra": dict(info["extra"])}

    # == loading =====================================================================================
    def load(self, cell: Cell, relayout: bool = False) -> None:
        """Shows `cell` on a fresh canvas (the undo history is cleared). With `relayout`, or when
        the cell has no positions, its nodes are laid out anew. Raises CellError, leaving the canvas
        as it was, for a node whose op the canvas has no node for."""
        for n in cell.nodes:
            if n.op not in OP_NODE_CLASSES:
                raise CellError(f"node '{n.id}': unknown op '{n.op}' (the editor knows: {', '.join(OPS)})")
        self._loading = True
        self._index = None
        try:
            old = [n for n in self.graph.all_nodes()]
            if old:
                self.graph.delete_nodes(old, push_undo=False)
            self._seq.clear()
            extra = {k: v for k, v in cell.extra.items() if k != EDITOR_KEY}
            self._set_info({"name": cell.name, "description": cell.description,
                            "sizes": dict(cell.sizes), "extra": extra})
            editor = cell.extra.get(EDITOR_KEY) if isinstance(cell.extra.get(EDITOR_KEY), dict) else {}
            canvas: dict[str, CellNode] = {}
            lost: list[str] = []
            for n in cell.nodes:
                if n.id in canvas:
                    lost.append(f"a second node '{n.id}'")
                    continue
                canvas[n.id] = self._create_op(n.id, n.op, _pos(cell.layout.get(n.id)), n.shape, n.value,
                                               n.extra, push_undo=False)
            for n in cell.nodes:
                node = canvas.get(n.id)
                if node is None:
                    continue
                ports = node.input_ports()
                for i, a in enumerate(n.args):
                    if i >= len(ports):
                        lost.append(f"arg {i + 1} of '{n.id}'")
                    elif a == "":
                        continue  # a port saved unconnected
                    elif a not in canvas:
                        lost.append(f"arg '{a}' of '{n.id}'")
                    else:
                        ports[i].connect_to(canvas[a].output(0), push_undo=False)
            upd_pos = editor.get("updates", {}) if isinstance(editor.get("updates"), dict) else {}
            states = [s for s in cell.updates if s in canvas and canvas[s].OP == "state"]
            states += [n.id for n in cell.nodes if n.op == "state" and n.id not in states and n.id in canvas]
            for s in states:
                u = self._create_update(canvas[s], _pos(upd_pos.get(s)), push_undo=False)
                target = cell.updates.get(s)
                if target in canvas:
                    u.input_ports()[0].connect_to(canvas[target].output(0), push_undo=False)
            for s in cell.updates:
                if s not in states:
                    lost.append(f"the update of '{s}'")
            sink = self._create_output(_pos(editor.get("output")), push_undo=False)
            if cell.output in canvas:
                sink.input_ports()[0].connect_to(canvas[cell.output].output(0), push_undo=False)
            elif cell.output is not None:
                lost.append(f"the output '{cell.output}'")
            if lost:
                log.warning("the canvas cannot show %s", ", ".join(lost))
                self.message.emit("Not shown on the canvas: " + ", ".join(lost))
            missing = [n for n in canvas.values() if n.name() not in cell.layout]
            if relayout or missing:
                self._apply_positions(self._layout_positions(cell), push_undo=False)
            else:
                self._place_sinks(editor)
        finally:
            self._loading = False
        self.graph.undo_stack().clear()
        self.resync()

    def _place_sinks(self, editor: dict[str, Any]) -> None:
        """Puts update nodes and the output sink that have no saved position right of their source."""
        upd_pos = editor.get("updates", {}) if isinstance(editor.get("updates"), dict) else {}
        sinks: list[CellNode] = []
        for u in self._updates():
            state = self._state_of(u)
            if state is not None and state.name() not in upd_pos:
                sinks.append(u)
        sink = self.output_node()
        if sink is not None and "output" not in editor:
            sinks.append(sink)
        taken = [n.view.sceneBoundingRect() for n in self._nodes() if n not in sinks]
        for n in sinks:
            conn = n.input_ports()[0].connected_ports()
            anchor = conn[0].node() if conn else None
            if anchor is not None:
                x = anchor.pos()[0] + anchor.view.width + SINK_GAP
                y = anchor.pos()[1]
            else:
                x, y = 0.0, 0.0
            rect = QtCore.QRectF(x, y, n.view.width, n.view.height)
            while any(rect.adjusted(-10.0, -10.0, 10.0, 10.0).intersects(r) for r in taken):
                rect.translate(0.0, 30.0)
            taken.append(rect)
            n.set_pos(rect.x(), rect.y())  # not yet undoable: called while loading

    # == creating canvas nodes ===========================================================================
    def _create_op(self, cell_id: str, op: str, pos: tuple[float, float] | None,
                   shape: list[str] | None = None, value: float | None = None,
                   extra: dict[str, Any] | None = None, push_undo: bool = True) -> CellNode:
        cls = OP_NODE_CLASSES.get(op)
        if cls is None:
            raise CellError(f"node '{cell_id}': unknown op '{op}' (known: {', '.join(OPS)})")
        node = self.graph.create_node(node_type_of(cls), name=cell_id, selected=push_undo,
                                      pos=list(pos) if pos else None, push_undo=push_undo)
        if node.name() != cell_id:  # NodeGraphQt made the name unique; should not happen
            log.warning("canvas renamed node '%s' to '%s'", cell_id, node.name())
        if op == "weight":
            node.set_property(PROP_SHAPE, list(shape) if shape is not None else list(DEFAULT_WEIGHT_SHAPE),
                              push_undo=push_undo)
        if op == "const":
            node.set_property(PROP_VALUE, float(value) if value is not None else DEFAULT_CONST_VALUE,
                              push_undo=push_undo)
        if extra:
            node.set_property(PROP_EXTRA, dict(extra), push_undo=push_undo)
        node.item.set_caption(caption_for(op, node.get_property(PROP_SHAPE) if op == "weight" else None,
                                          node.get_property(PROP_VALUE) if op == "const" else None))
        return node

    def _create_update(self, state: CellNode, pos: tuple[float, float] | None,
                       push_undo: bool = True) -> StateUpdateNode:
        node = self.graph.create_node(node_type_of(StateUpdateNode), name=update_title(state.name()),
                                      selected=False, pos=list(pos) if pos else None, push_undo=push_undo)
        node.set_property(PROP_STATE_LINK, state.id, push_undo=push_undo)
        return node

    def _create_output(self, pos: tuple[float, float] | None, push_undo: bool = True) -> OutputNode:
        return self.graph.create_node(node_type_of(OutputNode), name=OUTPUT_TITLE, selected=push_undo,
                                      pos=list(pos) if pos else None, push_undo=push_undo)

    # == edits (each one undoable) =======================================================================
    @contextmanager
    def _macro(self, text: str) -> Iterator[None]:
        """One undo step for everything done inside."""
        stack = self.graph.undo_stack()
        stack.beginMacro(text)
        try:
            yield
        finally:
            stack.endMacro()

    def free_spot(self, width: float = NEW_NODE_SIZE[0]) -> tuple[float, float]:
        """A free spot for a new node `width` wide (a state and its update node side by side are wider),
        as near the middle of the view as one is: the cells of a grid around it, nearest first, those
        inside the view before those outside, so that new nodes neither pile up nor land out of sight."""
        viewer = self.graph.viewer()
        visible = viewer.mapToScene(viewer.viewport().rect()).boundingRect()
        centre = visible.center()
        height = NEW_NODE_SIZE[1]
        taken = [n.view.sceneBoundingRect().adjusted(-20.0, -15.0, 20.0, 15.0) for n in self._nodes()]
        reach = range(-FREE_SPOT_REACH, FREE_SPOT_REACH + 1)
        cells = sorted(((i, j) for i in reach for j in reach), key=lambda c: c[0] ** 2 + c[1] ** 2)
        spots = [QtCore.QRectF(centre.x() - width / 2 + i * (width + 40.0), centre.y() - height / 2 + j
                               * (height + 30.0), width, height) for i, j in cells]
        for rect in sorted(spots, key=lambda r: not visible.contains(r)):  # stable: nearest stays first
            if not any(r.intersects(rect) for r in taken):
                return rect.x(), rect.y()
        right = max((r.right() for r in taken), default=centre.x())  # a crowded canvas: right of it all
        return right + 40.0, centre.y() - height / 2

    def add_node(self, op: str, pos: tuple[float, float] | None = None, node_id: str | None = None) -> str:
        """Adds a node of `op` (or the output sink, op 'output'); returns its cell id. A state gets
        its update node beside it. Raises CellError for an unknown op or a bad or taken id."""
        if pos is None:
            # a state's update node goes beside it: find room for both
            pair = 2 * NEW_NODE_SIZE[0] + 2 * SINK_GAP
            pos = self.free_spot(pair if op == "state" else NEW_NODE_SIZE[0])
        if op == OUTPUT_OP:
            sink = self.output_node()
            if sink is not None:
                self.select_canvas([sink])
                self.message.emit("The cell has one output node; it is selected.")
                return ""
            with self._macro("add output"):
                self._create_output(pos)
            return ""
        if op not in OPS:
            raise CellError(f"unknown op '{op}' (known: {', '.join(OPS)})")
        new_id = node_id or self._cell.fresh_id(op)
        self._check_id(new_id)
        with self._macro(f"add {op} '{new_id}'"):
            node = self._create_op(new_id, op, pos)
            if op == "state":
                self._create_update(node, (pos[0] + node.view.width + 2 * SINK_GAP, pos[1]))
        return new_id

    def _add_or_report(self, op: str, pos: tuple[float, float] | None) -> None:
        try:
            self.add_node(op, pos)
        except CellError as e:
            self.message.emit(str(e))

    def _on_node_requested(self, node_type: str, pos: tuple[float, float]) -> None:
        for cls in ALL_NODE_CLASSES:
            if node_type_of(cls) == node_type and cls.ROLE != ROLE_UPDATE:
                self._add_or_report(cls.OP, pos)
                return

    def _check_id(self, new_id: str, old: str | None = None) -> None:
        if not ID_PATTERN.match(new_id):
            raise CellError(f"'{new_id}' is not a valid id: use letters, digits and _, "
                            "not starting with a digit")
        if new_id != old and any(n.name() == new_id for n in self._ops()):
            raise CellError(f"the id '{new_id}' is taken by another node")

    def _input_port(self, dst: str, port: str | int):
        node = self.node(dst)
        ports = node.input_ports()
        if isinstance(port, int):
            if not 0 <= port < len(ports):
                raise CellError(f"node '{dst}' ({node.OP}) has no input port {port}")
            return ports[port]
        for p in ports:
            if p.name() == port:
                return p
        names = ", ".join(p.name() for p in ports) or "none"
        raise CellError(f"node '{dst}' ({node.OP}) has no input '{port}' (its inputs: {names})")

    def connect(self, src: str, dst: str, port: str | int) -> None:
        """Connects the output of `src` to the input `port` (an arg name or index) of `dst`."""
        in_port = self._input_port(dst, port)
        out_port = self.node(src).output(0)
        with self._macro(f"connect {src} -> {dst}.{in_port.name()}"):
            in_port.connect_to(out_port)

    def disconnect(self, dst: str, port: str | int) -> None:
        in_port = self._input_port(dst, port)
        with self._macro(f"disconnect {dst}.{in_port.name()}"):
            in_port.clear_connections()

    def set_update(self, state: str, src: str) -> None:
        """Makes `src` the value `state` takes at the end of the step."""
        node = self.node(state)
        if node.OP != "state":
            raise CellError(f"'{state}' is a '{node.OP}' node, not a state")
        u = self._update_of(node)
        with self._macro(f"update {state} <- {src}"):
            if u is None:
                x, y = node.pos()
                u = self._create_update(node, (x + node.view.width + 2 * SINK_GAP, y))
            u.input_ports()[0].connect_to(self.node(src).output(0))

    def set_output(self, src: str) -> None:
        """Makes `src` the cell's output."""
        with self._macro(f"output <- {src}"):
            sink = self.output_node()
            if sink is None:
                s = self.node(src)
                x, y = s.pos()
                sink = self._create_output((x + s.view.width + 2 * SINK_GAP, y))
            sink.input_ports()[0].connect_to(self.node(src).output(0))

    def rename(self, old: str, new: str) -> None:
        """Gives a node a new id; every link to it follows. Raises CellError for a bad or taken id."""
        node = self.node(old)
        if new == old:
            return
        self._check_id(new, old)
        with self._macro(f"rename {old} -> {new}"):
            node.set_name(new)

    def _on_canvas_rename(self, canvas_id: str, name: str) -> None:
        node = self.graph.get_node_by_id(canvas_id)
        if not isinstance(node, CellNode) or node.ROLE != ROLE_OP:
            return
        try:
            self.rename(node.name(), name)
        except CellError as e:
            self.message.emit(f"Rename refused: {e}")

    def set_weight_shape(self, weight: str, shape: list[str]) -> None:
        node = self.node(weight)
        if node.OP != "weight":
            raise CellError(f"'{weight}' is a '{node.OP}' node; only weights have a shape")
        if len(shape) not in (1, 2) or any(d not in DIMS for d in shape):
            raise CellError(f"a weight shape is one or two of {list(DIMS)}, got {shape!r}")
        with self._macro(f"shape of {weight}"):
            node.set_property(PROP_SHAPE, list(shape))

    def set_const_value(self, const: str, value: float) -> None:
        node = self.node(const)
        if node.OP != "const":
            raise CellError(f"'{const}' is a '{node.OP}' node; only consts have a value")
        with self._macro(f"value of {const}"):
            node.set_property(PROP_VALUE, float(value))

    def set_cell_info(self, name: str | None = None, description: str | None = None,
                      sizes: dict[str, int] | None = None) -> None:
        """Changes the cell's name, description or default sizes (one undoable step)."""
        new = self.cell_info()
        if name is not None:
            new["name"] = name
        if description is not None:
            new["description"] = description
        if sizes is not None:
            new["sizes"] = {**new["sizes"], **sizes}
        if new != self.cell_info():
            self.graph.undo_stack().push(_CellInfoCmd(self, new))

    def _with_partners(self, nodes: list[CellNode]) -> list[CellNode]:
        """A state goes with its update node, both ways: on the canvas they are one state."""
        out = list(dict.fromkeys(nodes))
        for n in list(out):
            if n.ROLE == ROLE_OP and n.OP == "state" and (u := self._update_of(n)) is not None:
                out.append(u)
            if n.ROLE == ROLE_UPDATE and (s := self._state_of(n)) is not None:
                out.append(s)
        return list(dict.fromkeys(out))

    def delete(self, ids: list[str]) -> None:
        """Deletes cell nodes (with the update nodes of states)."""
        self._delete_canvas([self.node(i) for i in ids])

    def delete_selected(self) -> int:
        """Deletes the selected canvas nodes; returns how many cell nodes went."""
        nodes = [n for n in self.graph.selected_nodes() if isinstance(n, CellNode)]
        return self._delete_canvas(nodes)

    def _delete_canvas(self, nodes: list[CellNode]) -> int:
        nodes = self._with_partners(nodes)
        if not nodes:
            return 0
        with self._macro(f"delete {len(nodes)} node(s)"):
            self.graph.delete_nodes(nodes)
        return sum(1 for n in nodes if n.ROLE == ROLE_OP)

    def paste(self, plan: PastePlan) -> list[str]:
        """Adds the nodes of a paste plan (see fragments.plan_paste); returns their ids, selected."""
        if not plan.nodes:
            return []
        for p in plan.nodes:
            self._check_id(p.id)
            if p.op not in OPS:
                raise CellError(f"node '{p.id}': unknown op '{p.op}'")
        made: dict[str, CellNode] = {}
        with self._macro(f"paste {len(plan.nodes)} node(s)"):
            for p in plan.nodes:
                made[p.id] = self._create_op(p.id, p.op, p.pos or self.free_spot(), p.shape, p.value,
                                             p.extra)
            for p in plan.nodes:
                ports = made[p.id].input_ports()
                for i, a in enumerate(p.args):
                    if a is not None and a in made and i < len(ports):
                        ports[i].connect_to(made[a].output(0))
            for s in plan.states:
                state = made[s]
                x, y = state.pos()
                u = self._create_update(state, plan.update_pos.get(s)
                                        or (x + state.view.width + 2 * SINK_GAP, y))
                if s in plan.updates:
                    u.input_ports()[0].connect_to(made[plan.updates[s]].output(0))
        self.select(list(made))
        return list(made)

    def add_formula(self, edit: FormulaEdit) -> list[str]:
        """Adds what a typed formula computes (graph_model.formula.plan_formula): its nodes, wired, and
        the update or output it sets, as one undoable step. Returns the new nodes' ids, selected."""
        for n in edit.nodes:  # an edit planned on another cell than the canvas's may name a taken id
            self._check_id(n.id)
        positions = self._formula_positions(edit)
        made: dict[str, CellNode] = {}

        def canvas_node(cell_id: str) -> CellNode:
            return made[cell_id] if cell_id in made else self.node(cell_id)

        with self._macro(f"formula {edit.target}"):
            for n in edit.nodes:
                made[n.id] = self._create_op(n.id, n.op, positions[n.id], n.shape, n.value)
            for n in edit.nodes:
                ports = made[n.id].input_ports()
                for i, a in enumerate(n.args):
                    ports[i].connect_to(canvas_node(a).output(0))
            for state, target in edit.updates.items():
                source = canvas_node(target)
                u = self._update_of(canvas_node(state))
                if u is None:
                    x, y = source.pos()
                    u = self._create_update(canvas_node(state), (x + source.view.width + SINK_GAP, y))
                u.input_ports()[0].connect_to(source.output(0))
            for state in (n.id for n in edit.nodes if n.op == "state" and n.id not in edit.updates):
                node = made[state]
                x, y = node.pos()
                self._create_update(node, (x + node.view.width + 2 * SINK_GAP, y))
            if edit.output is not None:
                source = canvas_node(edit.output)
                sink = self.output_node()
                if sink is None:
                    x, y = source.pos()
                    sink = self._create_output((x + source.view.width + SINK_GAP, y))
                sink.input_ports()[0].connect_to(source.output(0))
        self.select(list(made))
        return list(made)

    def _formula_positions(self, edit: FormulaEdit) -> dict[str, tuple[float, float]]:
        """Where a formula's nodes go: a computed node a column right of its rightmost arg, level with
        its first; a new source (a weight, a const, a state) a column left of its first user. Each is
        then moved down until it is clear of the nodes on the canvas and of the others."""
        known = {nid: (float(p[0]), float(p[1])) for nid, p in self._cell.layout.items()}
        pos: dict[str, tuple[float, float]] = {}
        for n in edit.nodes:  # args before the nodes that use them
            placed = [p for a in n.args if (p := pos.get(a) or known.get(a)) is not None]
            if placed:
                pos[n.id] = (max(p[0] for p in placed) + COLUMN_SPACING, placed[0][1])
        for n in edit.nodes:
            if n.id in pos:
                continue
            user = next((u.id for u in edit.nodes if n.id in u.args and u.id in pos), None)
            pos[n.id] = ((pos[user][0] - COLUMN_SPACING, pos[user][1] + ROW_SPACING) if user is not None
                         else self.free_spot())
        taken = [c.view.sceneBoundingRect() for c in self._nodes()]
        for n in edit.nodes:
            rect = QtCore.QRectF(*pos[n.id], *NEW_NODE_SIZE)
            while any(rect.adjusted(-20.0, -15.0, 20.0, 15.0).intersects(r) for r in taken):
                rect.translate(0.0, ROW_SPACING / 2)
            taken.append(rect)
            pos[n.id] = (rect.x(), rect.y())
        return pos

    # == layout ============================================================================================
    def _layout_positions(self, cell: Cell) -> dict[str, tuple[float, float]]:
        nodes = self._nodes()
        canvas_id = {n.name(): n.id for n in nodes if n.ROLE == ROLE_OP}
        groups = [[canvas_id[i] for i in group if i in canvas_id] for group in self.layout_groups(cell)]
        edges = []
        for n in nodes:
            for p in n.input_ports():
                for c in p.connected_ports():
                    edges.append((c.node().id, n.id))
        sizes = {n.id: (float(n.view.width), float(n.view.height)) for n in nodes}
        sinks = [n.id for n in nodes if n.ROLE != ROLE_OP]
        return canvas_layout.layered_layout([n.id for n in nodes], edges, sizes, sinks, groups=groups)

    def _apply_positions(self, positions: dict[str, tuple[float, float]], push_undo: bool) -> None:
        for canvas_id, (x, y) in positions.items():
            node = self.graph.get_node_by_id(canvas_id)
            if node is not None:
                node.set_property("pos", [float(x), float(y)], push_undo=push_undo)

    def auto_layout(self) -> None:
        """Lays the canvas out in columns from the input to the updates (one undoable step)."""
        with self._macro("auto layout"):
            self._apply_positions(self._layout_positions(self.cell), push_undo=True)

    # == selection and view ==============================================================================
    def selected_ids(self) -> list[str]:
        """The cell ids of the selected canvas nodes (an update node stands for its state)."""
        out: list[str] = []
        for n in self.graph.selected_nodes():
            if not isinstance(n, CellNode):
                continue
            if n.ROLE == ROLE_OP:
                out.append(n.name())
            elif n.ROLE == ROLE_UPDATE and (s := self._state_of(n)) is not None:
                out.append(s.name())
        return list(dict.fromkeys(out))

    def select_canvas(self, nodes: list[CellNode]) -> None:
        """Selects canvas nodes without an undo step (selection is not an edit)."""
        wanted = {n.id for n in nodes}
        for item in self.graph.viewer().selected_nodes():
            if item.id not in wanted:
                item.setSelected(False)
        for n in nodes:
            n.view.setSelected(True)
        self._emit_selection()

    def select(self, ids: list[str]) -> None:
        nodes = [n for i in ids for n in self.canvas_nodes(i)[:1]]
        self.select_canvas(nodes)

    def select_all(self) -> None:
        self.select_canvas(self._nodes())

    def centre_on(self, ids: list[str]) -> None:
        nodes = [n for i in ids for n in self.canvas_nodes(i)]
        if nodes:
            self.graph.center_on(nodes)

    def fit(self, margin: float = 50.0) -> None:
        """Frames the selection, or the whole cell when nothing is selected (never beyond 1:1)."""
        viewer = self.graph.viewer()
        items = [n.view for n in (self.graph.selected_nodes() or self._nodes())]
        if not items:
            return
        rect = QtCore.QRectF()
        for item in items:
            rect = rect.united(item.sceneBoundingRect())
        rect = rect.adjusted(-margin, -margin, margin, margin)
        port = viewer.viewport().rect()
        if rect.width() < port.width() and rect.height() < port.height():
            rect = QtCore.QRectF(0.0, 0.0, port.width(), port.height()).translated(
                rect.center() - QtCore.QPointF(port.width() / 2.0, port.height() / 2.0))
        # NodeGraphQt keeps its own idea of the visible scene range; set it, then let it fit.
        viewer._scene_range = rect
        viewer._update_scene()

    def _emit_selection(self) -> None:
        self.selection_changed.emit(self.selected_ids())

    def state_update_positions(self) -> dict[str, list[float]]:
        editor = self._cell.extra.get(EDITOR_KEY, {})
        return dict(editor.get("updates", {})) if isinstance(editor, dict) else {}

    def node_search_names(self) -> dict[str, list[str]]:
        """Name -> node types for NodeGraphQt's node search (update nodes come with their state)."""
        return {cls.NODE_NAME: [node_type_of(cls)] for cls in ALL_NODE_CLASSES if cls.ROLE != ROLE_UPDATE}


def _pos(raw: Any) -> tuple[float, float] | None:
    if isinstance(raw, (list, tuple)) and len(raw) == 2 and all(isinstance(c, (int, float)) for c in raw):
        return float(raw[0]), float(raw[1])
    return None
