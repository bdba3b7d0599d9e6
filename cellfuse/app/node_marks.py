"""What validation found, shown on the canvas: a node with a problem gets a red (error) or amber
(warning) border and badge, a node with a note (information: a condition the cell runs under) a blue
"i" badge alone, and its tooltip lists them and its inferred shape; a group's node gets the gravest
mark of its members and all their lines. A port's tooltip says the shape of the
value it carries. Wires take the colour of the node they come from."""

from __future__ import annotations

from ..graph_model import CellInfo, shape_str
from .canvas_wires import own_color
from .cell_adapter import CellAdapter
from .node_types import ROLE_GROUP, ROLE_OP, ROLE_OUTPUT, CellNode
from .problems_panel import SEVERITY_ORDER

UNKNOWN_SHAPE = "shape not known: see Problems"


def show_problems(adapter: CellAdapter, info: CellInfo) -> None:
    by_node: dict[str, list[tuple[str, str]]] = {}
    for p in [*info.problems, *info.notes]:
        if p.node is not None:
            by_node.setdefault(p.node, []).append((p.severity, p.message))
    cell_level = [p for p in info.problems if p.node is None]
    # What each node shows, worked out first and set once: setting a node's mark or shape redraws its
    # tooltip, and a node set back to nothing and then to what it had redraws it twice for nothing.
    marks: dict[CellNode, tuple[str | None, list[str]]] = {}
    for node_id, found in by_node.items():
        severity = _gravest(s for s, _ in found)
        for n in adapter.canvas_nodes(node_id):
            marks[n] = (severity, [m for _, m in found])
    shapes: dict[CellNode, str] = {}
    for node_id, shape in info.shapes.items():
        for n in adapter.canvas_nodes(node_id):
            shapes[n] = shape_str(shape)
    groups = []
    for n in adapter.graph.all_nodes():
        if not isinstance(n, CellNode):
            continue
        n.item.set_shape_text(shapes.get(n, ""))
        if n.ROLE == ROLE_OUTPUT:
            lines = [p.message for p in cell_level if "output" in p.message]
            n.item.set_mark("error" if lines else None, lines)
        elif n.ROLE == ROLE_GROUP:
            groups.append(n)
        else:
            n.item.set_mark(*marks.get(n, (None, [])))
    for g in groups:
        marked = [m.item for m in adapter.members(g) if m.item.mark]
        severity = _gravest(i.mark for i in marked) if marked else None
        g.item.set_mark(severity, list(dict.fromkeys(line for i in marked for line in i.mark_lines)))


def show_all(adapter: CellAdapter, info: CellInfo, structure: str, before: tuple | None) -> tuple:
    """Sets the nodes' marks and shapes, the ports' tooltips and the wires' colours, each only where what
    it follows from changed since `before` (what the last call returned; None: set them all); returns
    what they follow from now. They follow from the canvas's nodes (each one itself, not its id) and the
    cell's structure (`structure`: its structure_hash), the wires' colours from those alone (but the
    groups' nodes); the ports' tooltips from the groups too (a group's node has a port for each value
    into or out of it) and the shapes validation found, the marks from its problems too. A move changes
    none of these, a new group no wire's colour."""
    cell = adapter.cell
    wired = (adapter.node_serials(groups=False), structure)  # what the cell's own wires are between
    groups = (adapter.node_serials(), tuple((g.name, tuple(g.nodes)) for g in cell.groups))
    found = tuple((p.severity, p.node, p.message) for p in [*info.problems, *info.notes])
    now = (wired, groups, repr(info.shapes), found)
    if before is None or now != before:
        show_problems(adapter, info)
    if before is None or now[:3] != before[:3]:
        show_port_shapes(adapter, info)
    if before is None or wired != before[0]:
        color_wires(adapter)
    return now


def _gravest(severities) -> str:
    return min(severities, key=SEVERITY_ORDER.__getitem__)


def _shape_of(info: CellInfo, node_id: str) -> str:
    shape = info.shapes.get(node_id)
    return shape_str(shape) if shape is not None else UNKNOWN_SHAPE


def show_port_shapes(adapter: CellAdapter, info: CellInfo) -> None:
    """Each port's tooltip: an output port the shape of its node's value ("h: [batch, hidden]"), an
    input port that of the value wired into it, and from where (in place of NodeGraphQt's tooltip,
    which says how many wires the port takes)."""
    nodes = [n for n in adapter.graph.all_nodes() if isinstance(n, CellNode)]
    by_item = {n.view: n for n in nodes}
    for n in nodes:
        if n.ROLE == ROLE_GROUP:  # its ports are named after the nodes whose values they show
            for port in [*n.input_ports(), *n.output_ports()]:
                _set_tooltip(port, f"{port.name()}: {_shape_of(info, port.name())}")
            continue
        if n.ROLE == ROLE_OP:
            for port in n.output_ports():
                _set_tooltip(port, f"{n.name()}: {_shape_of(info, n.name())}")
        for port in n.input_ports():
            wired = port.view.connected_ports  # NodeGraphQt's port.connected_ports() is slower
            source = by_item.get(wired[0].node) if wired else None
            if source is not None and source.ROLE == ROLE_OP:
                text = f"{port.name()}: {_shape_of(info, source.name())} from '{source.name()}'"
            else:
                text = f"{port.name()}: not connected"
            _set_tooltip(port, text)


def _set_tooltip(port, text: str) -> None:
    if port.view.toolTip() != text:  # setting it calls back into Python: NodeGraphQt's itemChange
        port.view.setToolTip(text)


def color_wires(adapter: CellAdapter) -> None:
    """Each wire takes the colour of the kind of node it comes from (a wire made since has it from the
    start: CanvasViewer.establish_connection)."""
    for pipe in adapter.graph.viewer().all_pipes():
        color = own_color(pipe)
        if color is not None and tuple(pipe.color) != color:
            pipe.color = color
            if not (pipe.active() or pipe.highlighted()):
                pipe.reset()
