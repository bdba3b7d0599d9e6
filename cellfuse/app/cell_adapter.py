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
  edits are undoable too; positions of update nodes, of the output sink and of group nodes are kept
  in the cell's `x-editor` key.

Groups (the cell's `groups`, presentation only) are canvas nodes too: a group node holds the canvas
ids of its members in a hidden property, so that grouping, ungrouping, renaming and moving a group
are undo steps of the same stack, and its title is the group's name. While it is closed its members are
hidden, and it shows, as ports, the values that enter and leave the group; the wires to them are
drawn by the adapter (group_items) and the cell's own wires stay where they are, hidden. Opening a
group (double-click) shows its members alone, with a stub for each value entering or leaving it.
A node added there joins it, but the output sink, which no group holds: adding it goes back to the
whole cell, where it shows.

The panels select cell nodes by id (a term of an equation, a launch of the plan, a problem): the
canvas selects what shows each one, which is a closed group's node for a member, or, in an open
group, the stub of a value that enters it. The selection then stands for those ids only, not for
every member of the group (see _Pick), until the user picks on the canvas.

NodeGraphQt has group nodes of its own (GroupNode, expand_group_node, sub-graph tabs), but they do
not serve here: a collapsed GroupNode holds its nodes only as a serialized NodeGraphQt session, not
as nodes of the graph this adapter reads the Cell from; an expanded one is a second graph with an
undo stack of its own, so that edits inside it would miss both the window's undo and the Cell, and
its session is written back on collapse with no undo step; it has no way to group nodes that
exist, only to build inside an empty group; and its tabs would replace the canvas the window shows.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import OPS, Cell, CellError, FormulaEdit, Group, Node, group_name_problem
from ..graph_model.builder import COLUMN_SPACING, ROW_SPACING
from ..graph_model.validate import DIMS, ID_PATTERN, OUTPUT_TITLE, update_title
from . import canvas_layout, long_lived
from .canvas_graph import NEW_NODE_SIZE, CanvasGraph
from .fragments import PastePlan
from .group_items import STUB_HEIGHT, GroupWire, PortStub
from .node_types import (
    ALL_NODE_CLASSES,
    DEFAULT_CONST_VALUE,
    DEFAULT_WEIGHT_SHAPE,
    INPUT_PORT_COLOR,
    OP_NODE_CLASSES,
    PROP_EXTRA,
    PROP_MEMBERS,
    PROP_SHAPE,
    PROP_STATE_LINK,
    PROP_VALUE,
    ROLE_GROUP,
    ROLE_OP,
    ROLE_OUTPUT,
    ROLE_UPDATE,
    CellGroupNode,
    CellNode,
    OutputNode,
    StateUpdateNode,
    caption_for,
    node_type_of,
    port_color,
)

log = logging.getLogger(__name__)

EDITOR_KEY = "x-editor"
OUTPUT_OP = "output"  # the palette's name for the output sink
SINK_GAP = 70.0
STUB_GAP = 90.0  # between an open group's nodes and the stubs of its inputs and outputs
STUB_SPACING = 12.0


@dataclass(frozen=True)
class _Pick:
    """What a selection made by `CellAdapter.select` stands for beyond its canvas nodes: for a closed
    group's node, the members it was selected for; in an open group, the values entering it whose
    stubs are selected. It holds while the canvas's selection stays the one it was made with."""

    selection: frozenset[str]  # the canvas ids of the nodes selected with it
    members: dict[str, frozenset[str]]  # a group node's canvas id -> the canvas ids of the members meant
    stubs: frozenset[str]  # the canvas ids of nodes outside the open group whose stubs are selected


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
    group_opened = QtCore.Signal(object)  # the name of the group opened, or None: back to the whole cell

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self.graph = CanvasGraph(self)
        for cls in [*ALL_NODE_CLASSES, CellGroupNode]:
            self.graph.register_node(cls)
        self._info: dict[str, Any] = {"name": "untitled", "description": "", "sizes": {},
                                      "extra": {}}
        self._cell = Cell(name="untitled")
        # Creation order of the canvas nodes, keyed by the node itself: NodeGraphQt's ids are memory
        # addresses, reused once a deleted node is freed, so an id would hand a new node a dead one's place.
        self._seq: weakref.WeakKeyDictionary[CellNode, int] = weakref.WeakKeyDictionary()
        self._next_seq = 0
        self._listed: list[CellNode] = []  # _nodes() as it was last, of the canvas ids `_listed_ids`
        self._listed_ids: tuple[str, ...] = ()
        self._loading = False
        self._index: dict[str, list[CellNode]] | None = None  # cell id -> canvas nodes, until an edit
        self._member_index: dict[str, CellGroupNode] | None = None  # canvas id -> its group, until an edit
        self._members: dict[str, list[CellNode]] = {}  # a group's canvas id -> members(), with the index
        self._open: str | None = None  # the canvas id of the open group's node
        self._group_items: list[QtWidgets.QGraphicsItem] = []  # the wires and stubs drawn for groups
        self._stubs: dict[str, PortStub] = {}  # canvas id of a node outside the open group -> its stub
        self._pick: _Pick | None = None
        self._top_view: QtCore.QRectF | None = None  # the view of the whole cell, while a group is open
        # The sets of cell ids the auto layout keeps together in a column (the editor's plan gives
        # them); none by default.
        self.layout_groups: Callable[[Cell], list[list[str]]] = lambda _cell: []
        self.graph.undo_stack().indexChanged.connect(self._on_stack_changed)
        self.graph.node_requested.connect(self._on_node_requested)
        self.graph.op_dropped.connect(lambda op, pos: self._add_or_report(op, pos))
        self.graph.rename_requested.connect(self._on_canvas_rename)
        self.graph.node_selection_changed.connect(lambda *_: self._on_canvas_selection(False))
        self.graph.node_selected.connect(lambda *_: self._on_canvas_selection(True))
        self.graph.node_double_clicked.connect(self._on_double_clicked)

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
        """The canvas's cell nodes in the order they were made. Sorted again only when the canvas's nodes
        are others than last time: an edit asks a hundred times (the list it keeps holds the nodes, so
        that no new node can take the id of one in it)."""
        ids = tuple(self.graph.model.nodes)
        if ids != self._listed_ids:
            nodes = [n for n in self.graph.all_nodes() if isinstance(n, CellNode)]
            for n in nodes:
                if n not in self._seq:
                    self._seq[n] = self._next_seq
                    self._next_seq += 1
            self._listed = sorted(nodes, key=lambda n: self._seq[n])
            self._listed_ids = ids
        return list(self._listed)

    def node_serials(self, groups: bool = True) -> tuple[int, ...]:
        """A number for each canvas node (but the groups' nodes, without `groups`), in the order they
        were made, that no other node ever has (not NodeGraphQt's id, a memory address): the same
        numbers, the same nodes."""
        self._nodes()
        return tuple(self._seq[n] for n in self._listed if groups or n.ROLE != ROLE_GROUP)

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
        groups: list[Group] = []
        for g in self._groups():
            members = self.members(g)
            if members:
                groups.append(Group(g.name(), [m.name() for m in members]))
                x, y = g.pos()
                editor.setdefault("groups", []).append([round(float(x), 1), round(float(y), 1)])
        extra = dict(self._info["extra"])
        extra[EDITOR_KEY] = editor
        return Cell(name=self._info["name"], nodes=nodes, updates=updates, output=output,
                    description=self._info["description"], sizes=dict(self._info["sizes"]),
                    layout=layout, extra=extra, groups=groups)

    # == keeping the Cell in step ====================================================================
    def _on_stack_changed(self, _index: int = 0) -> None:
        self._index = None
        self._member_index = None
        if not self._loading:
            self.resync()

    def resync(self) -> None:
        """Re-reads the whole canvas into the Cell and refreshes the derived labels and the groups."""
        self._index = None
        self._member_index = None
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
        self._refresh_groups()
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
        self._member_index = None
        was_open, self._open = self._open, None
        try:
            self._clear_group_items()
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
            # A group's members are hidden from the start, the group closed: their wires are then made
            # hidden rather than drawn, and routed, to be hidden by the groups' refresh after.
            grouped = {m for group in cell.groups for m in group.nodes}
            for n in cell.nodes:
                if n.id in canvas:
                    lost.append(f"a second node '{n.id}'")
                    continue
                canvas[n.id] = self._create_op(n.id, n.op, _pos(cell.layout.get(n.id)), n.shape, n.value,
                                               n.extra, push_undo=False)
                canvas[n.id].view.setVisible(n.id not in grouped)
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
                u.view.setVisible(s not in grouped)
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
            saved_groups = editor.get("groups") if isinstance(editor.get("groups"), list) else []
            unplaced: list[CellGroupNode] = []
            for i, group in enumerate(cell.groups):
                held = [canvas[m].id for m in group.nodes if m in canvas]
                if not held:
                    lost.append(f"the group '{group.name}'")
                    continue
                pos = _pos(saved_groups[i]) if i < len(saved_groups) else None
                made = self._create_group(group.name, held, pos, push_undo=False)
                if pos is None:
                    unplaced.append(made)
            self._member_index = None
            self._sync_group_ports()
            if lost:
                log.warning("the canvas cannot show %s", ", ".join(lost))
                self.message.emit("Not shown on the canvas: " + ", ".join(lost))
            missing = [n for n in canvas.values() if n.name() not in cell.layout]
            if relayout or missing:
                self._apply_positions(self._layout_positions(cell), push_undo=False)
            else:
                self._place_groups(unplaced)
                self._place_sinks(editor)
            self.graph.undo_stack().clear()  # while loading: the resync below reads the canvas, once
        finally:
            self._loading = False
        self.resync()
        long_lived.freeze_after_next_full_collection()
        if was_open is not None:
            self.group_opened.emit(None)

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
        inside = self._membership()
        taken = [n.view.sceneBoundingRect() for n in self._nodes() if n not in sinks and n.id not in inside]
        for n in sinks:
            conn = n.input_ports()[0].connected_ports()
            anchor = conn[0].node() if conn else None
            if anchor is not None:
                x = anchor.pos()[0] + anchor.view.width + SINK_GAP
                y = anchor.pos()[1]
            else:
                x, y = 0.0, 0.0
            rect = _clear_below(QtCore.QRectF(x, y, n.view.width, n.view.height), taken, 10.0, 10.0, 30.0)
            # no undo step: the stack is cleared after loading, and each step makes the groups be read again
            n.set_property("pos", [rect.x(), rect.y()], push_undo=False)

    def _place_groups(self, groups: list[CellGroupNode]) -> None:
        """Puts group nodes that have no saved position where their members' top left is, moved down
        clear of the nodes shown beside them."""
        inside = self._membership()
        taken = [n.view.sceneBoundingRect() for n in self._nodes()
                 if n.id not in inside and n.ROLE in (ROLE_OP, ROLE_GROUP) and n not in groups]
        for g in groups:
            corner = _united([m.view.sceneBoundingRect() for m in self._with_partners(self.members(g))])
            rect = QtCore.QRectF(corner.left(), corner.top(), g.view.width, g.view.height)
            rect = _clear_below(rect, taken, 10.0, 10.0, 30.0)
            g.set_property("pos", [rect.x(), rect.y()], push_undo=False)  # as in _place_sinks

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

    def _create_group(self, name: str, members: list[str], pos: tuple[float, float] | None,
                      push_undo: bool = True) -> CellGroupNode:
        """A group node holding the canvas nodes `members` (canvas ids of cell nodes)."""
        node = self.graph.create_node(node_type_of(CellGroupNode), name=name, selected=False,
                                      pos=list(pos) if pos else None, push_undo=push_undo)
        node.set_property(PROP_MEMBERS, list(members), push_undo=push_undo)
        return node

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

    def _taken(self) -> list[QtCore.QRectF]:
        """The shown nodes' outlines, with the room kept around each."""
        return [n.view.sceneBoundingRect().adjusted(-20.0, -15.0, 20.0, 15.0) for n in self._shown()]

    def add_node(self, op: str, pos: tuple[float, float] | None = None, node_id: str | None = None) -> str:
        """Adds a node of `op` (or the output sink, op 'output'); returns its cell id. A state gets
        its update node beside it. Raises CellError for an unknown op or a bad or taken id."""
        if pos is None:
            # a state's update node goes beside it: find room for both
            pair = (2 * NEW_NODE_SIZE[0] + 2 * SINK_GAP, NEW_NODE_SIZE[1])
            pos = self.graph.free_place(size=pair if op == "state" else NEW_NODE_SIZE)
        if op == OUTPUT_OP:
            return self._add_output(pos)
        if op not in OPS:
            raise CellError(f"unknown op '{op}' (known: {', '.join(OPS)})")
        new_id = node_id or self._cell.fresh_id(op)
        self._check_id(new_id)
        with self._macro(f"add {op} '{new_id}'"):
            node = self._create_op(new_id, op, pos)
            if op == "state":
                self._create_update(node, (pos[0] + node.view.width + 2 * SINK_GAP, pos[1]))
            self._join_open_group([node])
        return new_id

    def _add_output(self, pos: tuple[float, float]) -> str:
        """Adds the output sink, or selects the one the cell has; returns "" (the sink is no cell node).
        The sink belongs to the whole cell, never to a group: while a group is open, the canvas goes
        back to the whole cell first, so that the user sees the sink, at a free place of that view."""
        in_group = self.open_group_node() is not None
        if in_group:
            self.close_group()
            pos = self.graph.free_place()
        back = "Back to the whole cell: the output node belongs to no group. " if in_group else ""
        sink = self.output_node()
        if sink is not None:
            self.select_canvas([sink])
            self.message.emit(f"{back}The cell has one output node; it is selected.")
            return ""
        with self._macro("add output"):
            self._create_output(pos)
        if in_group:
            self.message.emit(f"{back}The output node was added to the whole cell.")
        return ""

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
        """Deletes the selected canvas nodes, of a group's node those members it was selected for (see
        select); returns how many cell nodes went. A node outside the open group, selected by its stub,
        stays: it is out of sight."""
        pick = self._current_pick()
        nodes: list[CellNode] = []
        for n in self.graph.selected_nodes():
            if not isinstance(n, CellNode):
                continue
            meant = pick.members.get(n.id) if pick is not None else None
            nodes.extend([m for m in self.members(n) if m.id in meant] if meant is not None else [n])
        gone = self._delete_canvas(nodes)
        if pick is not None:
            self.select_canvas([])  # what was picked is gone: a group's node left selected meant none of it
        return gone

    def _delete_canvas(self, nodes: list[CellNode]) -> int:
        """Deletes canvas nodes: a group's node with its members, a state with its update node, and a
        group whose members all go."""
        nodes = self._with_partners([m for n in nodes for m in
                                     ([n, *self.members(n)] if n.ROLE == ROLE_GROUP else [n])])
        going = {n.id for n in nodes}
        for g in self._groups():
            held = self.members(g)
            if g.id not in going and held and all(m.id in going for m in held):
                nodes.append(g)
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
        plan = self._clear_of_nodes(plan)
        made: dict[str, CellNode] = {}
        with self._macro(f"paste {len(plan.nodes)} node(s)"):
            for p in plan.nodes:
                made[p.id] = self._create_op(p.id, p.op, p.pos or self.graph.free_place(), p.shape, p.value,
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
            if self.open_group_node() is not None:  # groups do not nest: all join the open one
                self._join_open_group(list(made.values()))
            else:
                for group in plan.groups:
                    held = [made[i] for i in group.nodes if i in made]
                    rect = _united([n.view.sceneBoundingRect() for n in held])
                    self._create_group(group.name, [n.id for n in held], (rect.left(), rect.top()))
        self.select(list(made))
        return list(made)

    def _clear_of_nodes(self, plan: PastePlan) -> PastePlan:
        """The plan as it is where its nodes land clear of the nodes shown; else moved, all together, to
        the free place nearest that place, in sight first (see CanvasGraph.free_place)."""
        size = QtCore.QSizeF(*NEW_NODE_SIZE)  # the pasted nodes are not made yet: a new node's room each
        rects = [QtCore.QRectF(QtCore.QPointF(*pos), size)
                 for pos in [*(p.pos for p in plan.nodes), *plan.update_pos.values()] if pos is not None]
        if not rects:
            return plan
        block = _united(rects)
        taken = self._taken()
        if not any(t.intersects(r) for t in taken for r in rects):
            return plan
        x, y = self.graph.free_place((block.left(), block.top()), (block.width(), block.height()),
                                     in_sight=True)
        dx, dy = x - block.left(), y - block.top()

        def moved(pos: tuple[float, float] | None) -> tuple[float, float] | None:
            return (pos[0] + dx, pos[1] + dy) if pos is not None else None

        return dataclasses.replace(
            plan, nodes=[dataclasses.replace(p, pos=moved(p.pos)) for p in plan.nodes],
            update_pos={s: moved(p) for s, p in plan.update_pos.items()})

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
            self._join_open_group(list(made.values()))
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
                         else self.graph.free_place())
        taken = [c.view.sceneBoundingRect() for c in self._shown()]
        for n in edit.nodes:
            rect = _clear_below(QtCore.QRectF(*pos[n.id], *NEW_NODE_SIZE), taken, 20.0, 15.0, ROW_SPACING / 2)
            pos[n.id] = (rect.x(), rect.y())
        return pos

    # == layout ============================================================================================
    def _layout_positions(self, cell: Cell) -> dict[str, tuple[float, float]]:
        """Where each canvas node goes: the nodes outside groups and the groups' nodes in columns, each
        group as one node; then the members of each group laid out alike on their own, from where its
        node is, as opening the group shows them."""
        nodes = self._nodes()
        index = self._membership()
        unit = {n.id: index[n.id].id if n.id in index else n.id for n in nodes}  # what stands for it on top
        canvas_id = {n.name(): n.id for n in nodes if n.ROLE == ROLE_OP}
        together = [[canvas_id[i] for i in group if i in canvas_id] for group in self.layout_groups(cell)]
        edges = [(src.id, dst.id) for src, dst, _port in self._edges()]
        sizes = {n.id: (float(n.view.width), float(n.view.height)) for n in nodes}
        sinks = {n.id for n in nodes if n.ROLE in (ROLE_UPDATE, ROLE_OUTPUT)}
        top = [n.id for n in nodes if n.id not in index]
        positions = canvas_layout.layered_layout(
            top, [(unit[a], unit[b]) for a, b in edges if unit[a] != unit[b]], sizes, sinks & set(top),
            groups=[list(dict.fromkeys(unit[k] for k in group)) for group in together])
        for g in self._groups():
            inside = [n.id for n in nodes if index.get(n.id) is g]
            held = set(inside)
            positions.update(canvas_layout.layered_layout(
                inside, [(a, b) for a, b in edges if a in held and b in held], sizes, sinks & held,
                origin=positions[g.id], groups=[[k for k in group if k in held] for group in together]))
        return positions

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
        """The cell ids of the selected canvas nodes, in the cell's order: an update node stands for its
        state, a group's node for its members (those it was selected for, where `select` chose some), a
        selected stub for the node whose value enters the open group."""
        pick = self._current_pick()
        chosen: set[str] = set()  # canvas ids of the cell's nodes
        for n in self.graph.selected_nodes():
            if not isinstance(n, CellNode):
                continue
            if n.ROLE == ROLE_GROUP:
                meant = pick.members.get(n.id) if pick is not None else None
                chosen.update(m.id for m in self.members(n) if meant is None or m.id in meant)
            elif n.ROLE == ROLE_OP:
                chosen.add(n.id)
            elif n.ROLE == ROLE_UPDATE and (s := self._state_of(n)) is not None:
                chosen.add(s.id)
        if pick is not None:
            chosen.update(cid for cid in pick.stubs if cid in self._stubs)
        return [n.name() for n in self._ops() if n.id in chosen]

    def select_canvas(self, nodes: list[CellNode]) -> None:
        """Selects canvas nodes, a group's node for all its members, without an undo step (selection
        is not an edit)."""
        self._select(nodes, {}, set())

    def select(self, ids: list[str]) -> None:
        """Selects the cell nodes `ids` where the canvas shows them: a node shown itself, else the closed
        group's node that holds it (standing for the members named only), else, in an open group, the
        stub of its value entering the group; a node shown by none of these is left out."""
        index = self._membership()
        nodes: list[CellNode] = []
        members: dict[str, set[str]] = {}
        stubs: set[str] = set()
        for i in ids:
            for n in self.canvas_nodes(i)[:1]:  # a state's own node
                if n.view.isVisible():
                    nodes.append(n)
                elif (g := index.get(n.id)) is not None and g.view.isVisible():
                    nodes.append(g)
                    members.setdefault(g.id, set()).add(n.id)
                elif n.id in self._stubs:
                    stubs.add(n.id)
        self._select(list(dict.fromkeys(nodes)), members, stubs)

    def _select(self, nodes: list[CellNode], members: dict[str, set[str]], stubs: set[str]) -> None:
        wanted = {n.id for n in nodes}
        for item in self.graph.viewer().selected_nodes():
            if item.id not in wanted:
                item.setSelected(False)
        for n in nodes:
            n.view.setSelected(True)
        self._pick = None
        if members or stubs:
            selection = frozenset(n.id for n in self.graph.selected_nodes())
            self._pick = _Pick(selection, {g: frozenset(m) for g, m in members.items()}, frozenset(stubs))
        self._mark_stubs()
        self._emit_selection()

    def _current_pick(self) -> _Pick | None:
        """The pick of the last `select`, while the canvas's selection is still the one it made."""
        if self._pick is not None and self._pick.selection != frozenset(
                n.id for n in self.graph.selected_nodes()):
            self._pick = None
        return self._pick

    def _on_canvas_selection(self, pressed: bool) -> None:
        """The user's selection on the canvas: a node clicked is picked whole (a group's node for all
        its members); a gesture that leaves the selection as it was (a pan) keeps what `select` picked."""
        if pressed:
            self._pick = None
        self._mark_stubs()
        self._emit_selection()

    def _mark_stubs(self) -> None:
        pick = self._current_pick()
        for cid, stub in self._stubs.items():
            stub.set_selected(pick is not None and cid in pick.stubs)

    def select_all(self) -> None:
        self.select_canvas(self._shown())

    def centre_on(self, ids: list[str]) -> None:
        nodes = list(dict.fromkeys(n for i in ids for n in self.shown_nodes(i)))
        if nodes:
            self.graph.center_on(nodes)

    def fit(self, margin: float = 50.0) -> None:
        """Frames the selection, or the whole cell when nothing is selected (never beyond 1:1)."""
        viewer = self.graph.viewer()
        items = [n.view for n in self.graph.selected_nodes() if n.view.isVisible()]
        if not items:
            items = [n.view for n in self._shown()] + self._group_items
        if not items:
            return
        rect = _united([item.sceneBoundingRect() for item in items])
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

    # == groups =============================================================================================
    def _groups(self) -> list[CellGroupNode]:
        return [n for n in self._nodes() if n.ROLE == ROLE_GROUP]  # type: ignore[misc]

    def group_nodes(self) -> list[CellNode]:
        """The canvas nodes of the groups, in the order they were made."""
        return list(self._groups())

    def _shown(self) -> list[CellNode]:
        return [n for n in self._nodes() if n.view.isVisible()]

    def _membership(self) -> dict[str, CellGroupNode]:
        """The canvas id of every node inside a group (a state's update node goes with its state) -> the
        group's node; a node that two group nodes name belongs to the first."""
        if self._member_index is None:
            index: dict[str, CellGroupNode] = {}
            updates = {u.get_property(PROP_STATE_LINK): u for u in self._updates()}
            for g in self._groups():
                for cid in g.get_property(PROP_MEMBERS) or []:
                    node = self.graph.get_node_by_id(cid)
                    if not isinstance(node, CellNode) or node.ROLE != ROLE_OP or cid in index:
                        continue  # deleted since, or taken
                    index[cid] = g
                    if node.OP == "state" and cid in updates:
                        index[updates[cid].id] = g
            self._member_index = index
            self._members = {}
            for n in self._ops():
                if (g := index.get(n.id)) is not None:
                    self._members.setdefault(g.id, []).append(n)
        return self._member_index

    def members(self, group: CellNode) -> list[CellNode]:
        """The cell's nodes in a group, in the cell's order (a state without its update node)."""
        self._membership()
        return list(self._members.get(group.id, []))

    def shown_nodes(self, cell_id: str) -> list[CellNode]:
        """The canvas nodes that show a cell node now: its own (a state's two) where they are shown,
        else the node of the closed group that holds it; none while a group it is not in is open."""
        index = self._membership()
        out: list[CellNode] = []
        for n in self.canvas_nodes(cell_id):
            if n.view.isVisible():
                out.append(n)
            elif (g := index.get(n.id)) is not None and g.view.isVisible():
                out.append(g)
        return list(dict.fromkeys(out))

    def _edges(self) -> list[tuple[CellNode, CellNode, Any]]:
        """Every wire of the canvas: (the node it comes from, the node it goes into, that node's port)."""
        out = []
        for n in self._nodes():
            for port in n.input_ports():
                for c in port.connected_ports():
                    if isinstance(c.node(), CellNode):
                        out.append((c.node(), n, port))
        return out

    def _boundary(self, group: CellNode) -> tuple[list[CellNode], list[CellNode]]:
        """The nodes outside `group` whose values enter it, and its members whose values leave it."""
        return self._boundaries()[group.id]

    def _boundaries(self) -> dict[str, tuple[list[CellNode], list[CellNode]]]:
        """`_boundary` of every group, from one pass over the wires (a pass per group made each edit of
        a cell of a thousand nodes and dozens of groups take most of a second)."""
        index = self._membership()
        boundaries: dict[str, tuple[list[CellNode], list[CellNode]]] = {g.id: ([], [])
                                                                         for g in self._groups()}
        entered: dict[str, set[str]] = {}  # a node's canvas id -> the groups its value enters
        leaves: set[str] = set()  # the members whose values leave their group
        for src, dst, _port in self._edges():
            g_src, g_dst = index.get(src.id), index.get(dst.id)
            if g_src is g_dst:
                continue
            if g_dst is not None:
                entered.setdefault(src.id, set()).add(g_dst.id)
            if g_src is not None:
                leaves.add(src.id)
        for n in self._ops():  # in the cell's order
            for g in entered.get(n.id, ()):
                boundaries[g][0].append(n)
            if n.id in leaves:
                boundaries[index[n.id].id][1].append(n)
        return boundaries

    def group(self, ids: list[str], name: str) -> None:
        """Makes the cell nodes `ids` one group named `name`, shown as one node where they were; a group
        that held any of them is merged into it. One undoable step. Raises CellError for a bad name, an
        unknown node, no node, or a group open (groups do not nest)."""
        problem = group_name_problem(name)
        if problem is not None:
            raise CellError(problem)
        if self.open_group_node() is not None:
            raise CellError("groups do not nest: go back to the whole cell (the path above the canvas) "
                            "to group nodes")
        nodes = [self.node(i) for i in dict.fromkeys(ids)]
        if not nodes:
            raise CellError("select the nodes to group first")
        index = self._membership()
        old = list(dict.fromkeys(g for n in nodes if (g := index.get(n.id)) is not None))
        held = {n.id for n in nodes} | {m.id for g in old for m in self.members(g)}
        members = [n for n in self._ops() if n.id in held]
        rect = _united([n.view.sceneBoundingRect() for n in [*self._with_partners(members), *old]
                        if n.view.isVisible()])
        with self._macro(f"group '{name}'"):
            if old:
                self.graph.delete_nodes(old)
            made = self._create_group(name, [n.id for n in members], (rect.left(), rect.top()))
            # where its members were, unless that covers another node: then below, in free space
            inside = {n.id for n in self._with_partners(members)}
            taken = [c.view.sceneBoundingRect() for c in self._shown()
                     if c is not made and c.id not in inside]
            box = made.view.sceneBoundingRect()
            free = _clear_below(QtCore.QRectF(box), taken, 20.0, 15.0, ROW_SPACING / 2)
            if free.top() != box.top():
                made.set_pos(free.left(), free.top())
        self.select_canvas([made])

    def group_to_rename(self) -> CellNode | None:
        """The group a rename acts on: the one group node selected, or else the open group; None where
        several group nodes are selected, or none is and no group is open."""
        selected = [n for n in self.graph.selected_nodes()
                    if isinstance(n, CellNode) and n.ROLE == ROLE_GROUP]
        if selected:
            return selected[0] if len(selected) == 1 else None
        return self.open_group_node()

    def rename_group(self, group: CellNode, name: str) -> None:
        """Gives `group` (a group's canvas node) the name `name`, as one undoable step. Raises CellError
        for a bad name, by the rules that grouping keeps."""
        if not isinstance(group, CellNode) or group.ROLE != ROLE_GROUP:
            raise CellError(f"'{group.name()}' is no group")
        problem = group_name_problem(name)
        if problem is not None:
            raise CellError(problem)
        if name == group.name():
            return
        with self._macro(f"rename group '{group.name()}' -> '{name}'"):
            group.set_name(name)

    def ungroup_selected(self) -> list[str]:
        """Ungroups the selected groups, or else the open one, as one undoable step: their members are
        shown again, selected, as they were laid out inside, their block's top left where the group's
        node was, and the nodes around moved clear of the blocks (see canvas_layout.make_room).
        Returns the ungrouped groups' names."""
        groups = [n for n in self.graph.selected_nodes() if isinstance(n, CellNode) and n.ROLE == ROLE_GROUP]
        if not groups and (g := self.open_group_node()) is not None:
            groups = [g]
        if not groups:
            return []
        if self.open_group_node() in groups:
            self.close_group()
        freed: list[CellNode] = []
        with self._macro(f"ungroup {', '.join(repr(g.name()) for g in groups)}"):
            for nodes in self._make_room(groups).values():
                freed += nodes
            names = [g.name() for g in groups]
            self.graph.delete_nodes(groups)
        self.select_canvas([n for n in freed if n.ROLE == ROLE_OP])
        return names

    def _make_room(self, groups: list[CellNode]) -> dict[CellNode, list[CellNode]]:
        """Moves the members of `groups` (with their update nodes) as blocks to where each group's node
        is, and the nodes shown beside them (another group's node with its members) clear of them, as
        part of the edit's undo step. Returns each group's freed nodes."""
        index = self._membership()
        inside = {g: self._with_partners(self.members(g)) for g in groups}
        blocks = {g.id: _united([n.view.sceneBoundingRect() for n in nodes]) for g, nodes in inside.items()}
        grown = {g.id: (_box(g.view.sceneBoundingRect()), (blocks[g.id].width(), blocks[g.id].height()))
                 for g in groups}
        around = {n.id: _box(n.view.sceneBoundingRect()) for n in self._shown() if n.id not in grown}
        corners = canvas_layout.make_room(grown, around)
        moving: list[tuple[CellNode, float, float]] = []
        for g, nodes in inside.items():
            x, y = corners[g.id]
            moving += [(n, x - blocks[g.id].left(), y - blocks[g.id].top()) for n in nodes]
        for n in self._shown():
            if n.id in around:
                dx, dy = corners[n.id][0] - around[n.id][0], corners[n.id][1] - around[n.id][1]
                kept = self._with_partners(self.members(n)) if n.ROLE == ROLE_GROUP else []
                moving += [(m, dx, dy) for m in [n, *kept] if m is n or index.get(m.id) is n]
        for n, dx, dy in moving:
            if (dx, dy) != (0.0, 0.0):
                x, y = n.pos()
                n.set_property("pos", [x + dx, y + dy])
        return inside

    def _join_open_group(self, nodes: list[CellNode]) -> None:
        """New nodes made while a group is open join it (inside the edit's undo step)."""
        g = self.open_group_node()
        joining = [n.id for n in nodes if n.ROLE == ROLE_OP]
        if g is not None and joining:
            g.set_property(PROP_MEMBERS, [*(g.get_property(PROP_MEMBERS) or []), *joining])

    # -- opening a group ---------------------------------------------------------------------------------
    def open_group_node(self) -> CellNode | None:
        node = self.graph.get_node_by_id(self._open) if self._open is not None else None
        return node if isinstance(node, CellNode) and node.ROLE == ROLE_GROUP else None

    @property
    def open_group(self) -> str | None:
        """The name of the open group; None while the canvas shows the whole cell."""
        g = self.open_group_node()
        return g.name() if g is not None else None

    def reveal(self, ids: list[str]) -> None:
        """Shows the cell nodes `ids` themselves where one view can: opens the group that holds them,
        where one holds them all but values that enter it (its stubs show those); else goes back to
        the whole cell, where a closed group's node shows the members among them."""
        if not ids:
            return
        index = self._membership()
        nodes = [self.node(i) for i in dict.fromkeys(ids)]
        groups = list(dict.fromkeys(g for n in nodes if (g := index.get(n.id)) is not None))
        if len(groups) == 1:
            group = groups[0]
            entering = {n.id for n in self._boundary(group)[0]}
            if all(index.get(n.id) is group or n.id in entering for n in nodes):
                if group.id != self._open:
                    self._open_node(group)
                return
        self.close_group()

    def open_group_of(self, cell_id: str) -> None:
        """Opens the group that holds the cell node `cell_id` (as a double-click on its node does)."""
        g = self._membership().get(self.node(cell_id).id)
        if g is None:
            raise CellError(f"node '{cell_id}' is in no group")
        self._open_node(g)

    def _on_double_clicked(self, node) -> None:
        if isinstance(node, CellNode) and node.ROLE == ROLE_GROUP:
            self._open_node(node)

    def _open_node(self, group: CellNode) -> None:
        viewer = self.graph.viewer()
        if self._open is None:
            self._top_view = QtCore.QRectF(viewer._scene_range)
        self._open = group.id
        self._refresh_groups()
        self.select_canvas([])
        self.fit()
        self.group_opened.emit(group.name())

    def close_group(self) -> None:
        """Back to the whole cell, the open group's node selected and the view as it was."""
        group = self.open_group_node()
        if self._open is None:
            return
        self._open = None
        self._refresh_groups()
        self.select_canvas([group] if group is not None else [])
        viewer = self.graph.viewer()
        if self._top_view is not None:
            viewer._scene_range = self._top_view  # NodeGraphQt's visible range (see fit)
            viewer._update_scene()
        self._top_view = None
        self.group_opened.emit(None)

    # -- drawing the groups ------------------------------------------------------------------------------
    def _refresh_groups(self) -> None:
        """The groups' ports, what the canvas shows (a closed group's node for its members; an open
        group's members alone), and the wires and stubs drawn for groups."""
        if self._open is not None and self.open_group_node() is None:  # its group went (an undo)
            self._open = None
            self._top_view = None
            self.group_opened.emit(None)
        open_group = self.open_group_node()
        self._sync_group_ports()
        index = self._membership()
        turned: list[CellNode] = []  # the nodes shown or hidden now
        for n in self._nodes():
            if n.ROLE == ROLE_GROUP:
                shown = open_group is None
            else:
                shown = index.get(n.id) is open_group
            if n.view.isVisible() != shown:
                if not shown:
                    n.view.setSelected(False)
                n.view.setVisible(shown)
                turned.append(n)
        # NodeGraphQt shows or hides a wire as its ends are when it draws it, and the canvas routes a wire
        # drawn anew around the nodes where they are now: the wires into the nodes shown, and those of the
        # nodes hidden now (not those inside closed groups: most wires of a large cell)
        ports = [port for n in self._nodes() if n.view.isVisible() for port in n.view.inputs]
        ports += [port for n in turned for port in [*n.view.inputs, *n.view.outputs]]
        for pipe in dict.fromkeys(pipe for port in ports for pipe in port.connected_pipes):
            pipe.draw_path(pipe.input_port, pipe.output_port)
        self._clear_group_items()
        if open_group is None:
            self._draw_group_wires()
        else:
            self._draw_stubs(open_group)

    def _sync_group_ports(self) -> None:
        """Each group node's ports: an input for each value that enters the group, an output for each
        that leaves it, named after the node that computes it. Drawn only: the user wires the cell's
        own nodes, inside the group."""
        boundaries = self._boundaries()
        for g in self._groups():
            into, out_of = boundaries[g.id]
            g.item.set_caption(f"group of {len(self.members(g))} · double-click to open")
            if ([p.name() for p in g.input_ports()] == [n.name() for n in into]
                    and [p.name() for p in g.output_ports()] == [n.name() for n in out_of]):
                continue
            for port in list(g.input_ports()):
                g.delete_input(port)
            for port in list(g.output_ports()):
                g.delete_output(port)
            for n in into:
                g.add_input(n.name(), color=INPUT_PORT_COLOR).view.locked = True
            for n in out_of:
                g.add_output(n.name(), color=port_color(n.KIND)).view.locked = True
            g.view.draw_node()

    def _clear_group_items(self) -> None:
        scene = self.graph.viewer().scene()
        for item in self._group_items:
            scene.removeItem(item)
        self._group_items.clear()
        self._stubs.clear()
        for n in self._nodes():
            n.item.wires.clear()

    def _add_wire(self, start: QtWidgets.QGraphicsItem, end: QtWidgets.QGraphicsItem, rgb, nodes) -> None:
        wire = GroupWire(start, end, rgb)
        self.graph.viewer().scene().addItem(wire)
        self._group_items.append(wire)
        for n in nodes:
            n.item.wires.append(wire)

    def _draw_group_wires(self) -> None:
        """A wire for each value into or out of a closed group, between the ports that show it."""
        index = self._membership()
        drawn = set()
        for src, dst, port in self._edges():
            gs, gd = index.get(src.id), index.get(dst.id)
            if gs is gd:
                continue  # the cell's own wire shows it, or both ends are inside one group
            start = gs.get_output(src.name()) if gs is not None else src.output(0)
            end = gd.get_input(src.name()) if gd is not None else port
            if start is None or end is None or (start.view, end.view) in drawn:
                continue
            drawn.add((start.view, end.view))
            self._add_wire(start.view, end.view, src.item.kind_rgb, [start.node(), end.node()])

    def _draw_stubs(self, group: CellNode) -> None:
        """An open group's inputs as stubs left of its nodes, wired to the ports they feed, and its
        outputs as stubs right of them."""
        index = self._membership()
        inside = [n for n in self._nodes() if index.get(n.id) is group]
        if not inside:
            return
        feeds: dict[str, tuple[CellNode, list]] = {}  # a value entering: its node, the ports it feeds
        leaves: dict[str, CellNode] = {}
        for src, dst, port in self._edges():
            src_in, dst_in = index.get(src.id) is group, index.get(dst.id) is group
            if dst_in and not src_in:
                feeds.setdefault(src.id, (src, []))[1].append(port)
            if src_in and not dst_in:
                leaves[src.id] = src
        order = {n.id: i for i, n in enumerate(self._nodes())}
        box = _united([n.view.sceneBoundingRect() for n in inside])
        scene = self.graph.viewer().scene()

        def place(stubs: list[tuple[PortStub, float]], left: bool) -> None:
            bottom = -float("inf")
            for stub, wanted in sorted(stubs, key=lambda s: s[1]):
                y = max(wanted - STUB_HEIGHT / 2, bottom + STUB_SPACING)
                x = box.left() - STUB_GAP - stub.rect.width() if left else box.right() + STUB_GAP
                stub.setPos(x, y)
                bottom = y + STUB_HEIGHT
                scene.addItem(stub)
                self._group_items.append(stub)

        entering = []
        for src_id in sorted(feeds, key=order.__getitem__):
            src, ports = feeds[src_id]
            stub = PortStub(src.name(), src.item.kind_rgb, facing_right=True)
            ys = [p.view.sceneBoundingRect().center().y() for p in ports]
            entering.append((stub, sum(ys) / len(ys), src, ports))
        place([(s, y) for s, y, _, _ in entering], left=True)
        for stub, _y, src, ports in entering:
            self._stubs[src.id] = stub
            for port in ports:
                self._add_wire(stub.dot, port.view, src.item.kind_rgb, [port.node()])
        leaving = []
        for src_id in sorted(leaves, key=order.__getitem__):
            src = leaves[src_id]
            stub = PortStub(src.name(), src.item.kind_rgb, facing_right=False)
            leaving.append((stub, src.output(0).view.sceneBoundingRect().center().y(), src))
        place([(s, y) for s, y, _ in leaving], left=False)
        for stub, _y, src in leaving:
            self._add_wire(src.output(0).view, stub.dot, src.item.kind_rgb, [src])
        self._mark_stubs()

    def node_search_names(self) -> dict[str, list[str]]:
        """Name -> node types for NodeGraphQt's node search (update nodes come with their state)."""
        return {cls.NODE_NAME: [node_type_of(cls)] for cls in ALL_NODE_CLASSES if cls.ROLE != ROLE_UPDATE}


def _clear_below(rect: QtCore.QRectF, taken: list[QtCore.QRectF], dx: float, dy: float,
                 step: float) -> QtCore.QRectF:
    """`rect` moved down by `step` until it keeps dx and dy clear of every rect in `taken`; it is then
    taken too."""
    while any(rect.adjusted(-dx, -dy, dx, dy).intersects(r) for r in taken):
        rect.translate(0.0, step)
    taken.append(rect)
    return rect


def _united(rects: list[QtCore.QRectF]) -> QtCore.QRectF:
    """The rectangle that holds them all (an empty one at the origin for none)."""
    out = QtCore.QRectF(rects[0]) if rects else QtCore.QRectF()
    for r in rects[1:]:
        out = out.united(r)
    return out


def _box(rect: QtCore.QRectF) -> canvas_layout.Rect:
    return rect.left(), rect.top(), rect.width(), rect.height()


def _pos(raw: Any) -> tuple[float, float] | None:
    if isinstance(raw, (list, tuple)) and len(raw) == 2 and all(isinstance(c, (int, float)) for c in raw):
        return float(raw[0]), float(raw[1])
    return None
