"""What validation found, shown on the canvas: a node with a problem gets a red (error) or amber
(warning) border and badge, a node with a note (information: a condition the cell runs under) a blue
"i" badge alone, and its tooltip lists them and its inferred shape; a group's node gets the gravest
mark of its members and all their lines. A port's tooltip says the shape of the
value it carries. Wires take the colour of the node they come from."""

from __future__ import annotations

from ..graph_model import CellInfo, shape_str
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
    for n in adapter.graph.all_nodes():
        if not isinstance(n, CellNode):
            continue
        n.item.set_shape_text("")
        if n.ROLE == ROLE_OUTPUT:
            lines = [p.message for p in cell_level if "output" in p.message]
            n.item.set_mark("error" if lines else None, lines)
            continue
        n.item.set_mark(None, [])
    for node_id, found in by_node.items():
        severity = _gravest(s for s, _ in found)
        for n in adapter.canvas_nodes(node_id):
            n.item.set_mark(severity, [m for _, m in found])
    for node_id, shape in info.shapes.items():
        for n in adapter.canvas_nodes(node_id):
            n.item.set_shape_text(shape_str(shape))
    for g in adapter.group_nodes():
        marked = [m.item for m in adapter.members(g) if m.item.mark]
        severity = _gravest(i.mark for i in marked) if marked else None
        g.item.set_mark(severity, list(dict.fromkeys(line for i in marked for line in i.mark_lines)))


def _gravest(severities) -> str:
    return min(severities, key=SEVERITY_ORDER.__getitem__)


def _shape_of(info: CellInfo, node_id: str) -> str:
    shape = info.shapes.get(node_id)
    return shape_str(shape) if shape is not None else UNKNOWN_SHAPE


def show_port_shapes(adapter: CellAdapter, info: CellInfo) -> None:
    """Each port's tooltip: an output port the shape of its node's value ("h: [batch, hidden]"), an
    input port that of the value wired into it, and from where (in place of NodeGraphQt's tooltip,
    which says how many wires the port takes)."""
    for n in adapter.graph.all_nodes():
        if not isinstance(n, CellNode):
            continue
        if n.ROLE == ROLE_GROUP:  # its ports are named after the nodes whose values they show
            for port in [*n.input_ports(), *n.output_ports()]:
                port.view.setToolTip(f"{port.name()}: {_shape_of(info, port.name())}")
            continue
        if n.ROLE == ROLE_OP:
            for port in n.output_ports():
                port.view.setToolTip(f"{n.name()}: {_shape_of(info, n.name())}")
        for port in n.input_ports():
            wired = port.connected_ports()
            source = wired[0].node() if wired else None
            if isinstance(source, CellNode) and source.ROLE == ROLE_OP:
                text = f"{port.name()}: {_shape_of(info, source.name())} from '{source.name()}'"
            else:
                text = f"{port.name()}: not connected"
            port.view.setToolTip(text)


def color_wires(adapter: CellAdapter) -> None:
    """Each wire takes the colour of the kind of node it comes from."""
    for pipe in adapter.graph.viewer().all_pipes():
        out = pipe.output_port
        item = out.node if out is not None else None
        rgb = getattr(item, "kind_rgb", None)
        if rgb is None:
            continue
        color = (int(rgb[0] * 0.8), int(rgb[1] * 0.8), int(rgb[2] * 0.8), 255)
        if tuple(pipe.color) != color:
            pipe.color = color
            if not (pipe.active() or pipe.highlighted()):
                pipe.reset()
