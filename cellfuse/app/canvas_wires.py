"""The canvas's wires: NodeGraphQt's pipe, routed around the nodes in its way (see wire_routing) and
lit while a node at either end is selected; a group's wire (group_items.GroupWire) is routed and lit
alike.

A wire is drawn on NodeGraphQt's curve at once and routed a moment later, with every other wire drawn
meanwhile (WireRouter): loading a cell or dragging a node draws each wire many times, and a route asks
where every node is.

NodeGraphQt lights a selected node's wires itself, but from inside the selection change, before the
node counts as selected, and a wire between two nodes went dark when one of them was deselected while
the other stayed selected. Here a wire's look follows from the selection as it is: once the selection has
changed, the viewer asks again every wire lit until then and every wire of a node selected now (see
CanvasViewer); a wire keeps the viewer's set of lit wires as it is styled.
"""

from __future__ import annotations

from collections.abc import Callable

from NodeGraphQt.constants import Z_VAL_PIPE, PipeEnum, PortTypeEnum
from NodeGraphQt.qgraphics.pipe import PipeItem
from PySide6 import QtCore, QtGui, QtWidgets

from . import theme, wire_routing
from .node_item import CellNodeItem

WIDTH = 2
LIT_WIDTH = 3
LIT_Z = Z_VAL_PIPE + 0.5  # above the other wires, still under the nodes
CORNER = 12.0  # the radius of a route's turns
NEAR = 400.0  # how far above and below its ends a route looks for a free lane
BUCKET = 256.0  # the width of a column of the router's index of nodes
OWN_PEN = 0  # the key of a group's wire's own pen, kept while it is lit (QGraphicsItem.data)


class CellPipe(PipeItem):
    """A wire between two ports of the cell's nodes."""

    # -- look ---------------------------------------------------------------------------------------
    def lit(self) -> bool:
        """Whether a node at either end is selected."""
        ends = [p.node for p in (self.input_port, self.output_port) if p is not None]
        return any(n.isSelected() for n in ends)

    def restyle(self) -> None:
        """The wire's look for the selection as it is now: lit in the selection's colour, or its own."""
        lit = self.lit()
        self._highlight = lit
        rgb = theme.SELECTED_COLOR if lit else self.color[:3]
        self.set_pipe_styling(color=(*rgb, 255), width=LIT_WIDTH if lit else WIDTH,
                              style=PipeEnum.DRAW_TYPE_DEFAULT.value if lit else self.style)
        self.setZValue(LIT_Z if lit else Z_VAL_PIPE)
        self._draw_direction_pointer()
        note_lit(self, lit)

    # NodeGraphQt calls these while a node's selection changes, and on hover; the look is the selection's.
    def highlight(self) -> None:
        self.restyle()

    def reset(self) -> None:
        self._active = False
        self.restyle()

    # -- path ---------------------------------------------------------------------------------------
    def draw_path(self, start_port, end_port=None, cursor_pos=None) -> None:
        super().draw_path(start_port, end_port, cursor_pos)
        if cursor_pos is not None or end_port is None:
            return
        ports = {start_port.port_type: start_port, end_port.port_type: end_port}
        out, into = ports.get(PortTypeEnum.OUT.value), ports.get(PortTypeEnum.IN.value)
        if out is not None and into is not None and out.node is not into.node:
            route_later(self, out, into, into.node.boundingRect().width(), self._take_route)

    def _take_route(self, path: QtGui.QPainterPath) -> None:
        # From the input port to the output port, as NodeGraphQt draws it: its arrow reads the path so.
        self.setPath(path.toReversed())
        self._draw_direction_pointer()


def route_later(wire: QtWidgets.QGraphicsItem, start: QtWidgets.QGraphicsItem, end: QtWidgets.QGraphicsItem,
                tangent_room: float, take: Callable[[QtGui.QPainterPath], None]) -> None:
    """Asks the canvas's router to route `wire` from `start` (an output port, or an open group's stub) to
    `end` (an input port) around the nodes in its way, once the drawing under way is done; `take` gets the
    route's path where the curve NodeGraphQt draws (its tangents `tangent_room` long at most) passes a
    node and the route passes fewer."""
    scene = start.scene()
    router = getattr(scene.viewer(), "router", None) if hasattr(scene, "viewer") else None
    if router is not None:
        router.later(wire, start, end, tangent_room, take)


class WireRouter(QtCore.QObject):
    """Routes the wires drawn since it last ran, in one pass over the nodes."""

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._pending: dict[QtWidgets.QGraphicsItem, tuple] = {}
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.flush)

    def later(self, wire, start, end, tangent_room: float, take) -> None:
        self._pending[wire] = (start, end, tangent_room, take)
        self._timer.start()

    def flush(self) -> None:
        """Routes every wire waiting now."""
        self._timer.stop()
        pending, self._pending = self._pending, {}
        index: _NodeIndex | None = None
        for wire, (start, end, tangent_room, take) in pending.items():
            scene = wire.scene()
            if scene is None or not wire.isVisible():
                continue  # gone, or hidden with a closed group
            if index is None:
                index = _NodeIndex(scene)
            a, b = _centre(start), _centre(end)
            boxes = index.near(a, b, {_node_of(start), _node_of(end)})
            corners = wire_routing.route(a, b, boxes, tangent_room)
            if corners is not None:
                take(rounded(corners))


class _NodeIndex:
    """The shown nodes' boxes, widened by half a lane's clearance, in columns by x."""

    def __init__(self, scene: QtWidgets.QGraphicsScene) -> None:
        pad = wire_routing.CLEARANCE / 2
        self._columns: dict[int, list[tuple[wire_routing.Box, QtWidgets.QGraphicsItem]]] = {}
        for item in scene.items():
            if isinstance(item, CellNodeItem) and item.isVisible():
                r = item.sceneBoundingRect()
                box = (r.left() - pad, r.top() - pad, r.right() + pad, r.bottom() + pad)
                for k in range(int(box[0] // BUCKET), int(box[2] // BUCKET) + 1):
                    self._columns.setdefault(k, []).append((box, item))

    def near(self, a: wire_routing.Point, b: wire_routing.Point, ends: set) -> list[wire_routing.Box]:
        """The boxes of the nodes but `ends` that a wire from `a` to `b` or its route may meet."""
        left, right = min(a[0], b[0]) - wire_routing.LEAD, max(a[0], b[0]) + wire_routing.LEAD
        top, bottom = min(a[1], b[1]) - NEAR, max(a[1], b[1]) + NEAR
        seen: dict[int, wire_routing.Box] = {}
        for k in range(int(left // BUCKET), int(right // BUCKET) + 1):
            for box, item in self._columns.get(k, ()):
                if (item not in ends and box[0] < right and left < box[2] and box[1] < bottom
                        and top < box[3]):
                    seen[id(item)] = box
        return list(seen.values())


def restyle_group_wire(wire: QtWidgets.QGraphicsPathItem) -> None:
    """Lights a group's wire (group_items.GroupWire) as a CellPipe is lit, while a node at either end is
    selected; else gives it back its own pen."""
    own = wire.data(OWN_PEN)
    if own is None:
        own = QtGui.QPen(wire.pen())
        wire.setData(OWN_PEN, own)
    ends = [_node_of(wire.start), _node_of(wire.end)]
    lit = any(n is not None and n.isSelected() for n in ends)
    pen = QtGui.QPen(own)
    if lit:
        pen.setColor(theme.qcolor(theme.SELECTED_COLOR))
        pen.setWidthF(LIT_WIDTH)
    wire.setPen(pen)
    wire.setZValue(LIT_Z if lit else Z_VAL_PIPE)
    note_lit(wire, lit)


def note_lit(wire: QtWidgets.QGraphicsItem, lit: bool) -> None:
    """Keeps the canvas's set of lit wires (CanvasViewer.lit_wires) as a wire is styled, so that a change
    of the selection styles again those and the wires of the nodes selected, not every wire."""
    scene = wire.scene()
    views = scene.views() if scene is not None else []
    lit_wires = getattr(views[0], "lit_wires", None) if views else None
    if lit_wires is not None:
        if lit:
            lit_wires.add(wire)
        else:
            lit_wires.discard(wire)


def own_color(pipe: PipeItem) -> tuple[int, int, int, int] | None:
    """A wire's own colour: that of the kind of node it comes from, a little darker; None where its
    node has no kind."""
    out = pipe.output_port
    rgb = getattr(out.node if out is not None else None, "kind_rgb", None)
    if rgb is None:
        return None
    return int(rgb[0] * 0.8), int(rgb[1] * 0.8), int(rgb[2] * 0.8), 255


def _node_of(item: QtWidgets.QGraphicsItem | None) -> QtWidgets.QGraphicsItem | None:
    while item is not None and not isinstance(item, CellNodeItem):
        item = item.parentItem()
    return item


def _centre(item: QtWidgets.QGraphicsItem) -> tuple[float, float]:
    c = item.sceneBoundingRect().center()
    return c.x(), c.y()


def rounded(points: list[tuple[float, float]], radius: float = CORNER) -> QtGui.QPainterPath:
    """A path along straight runs between `points`, each turn rounded."""
    path = QtGui.QPainterPath(QtCore.QPointF(*points[0]))
    for i in range(1, len(points) - 1):
        (x0, y0), (x1, y1), (x2, y2) = points[i - 1], points[i], points[i + 1]
        before = abs(x1 - x0) + abs(y1 - y0)
        after = abs(x2 - x1) + abs(y2 - y1)
        r = min(radius, before / 2, after / 2)
        into = QtCore.QPointF(x1 - r * _sign(x1 - x0), y1 - r * _sign(y1 - y0))
        out = QtCore.QPointF(x1 + r * _sign(x2 - x1), y1 + r * _sign(y2 - y1))
        path.lineTo(into)
        path.quadTo(QtCore.QPointF(x1, y1), out)
    path.lineTo(QtCore.QPointF(*points[-1]))
    return path


def _sign(v: float) -> float:
    return (v > 0) - (v < 0)
