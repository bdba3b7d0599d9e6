"""What the canvas draws for groups besides their nodes: the wires that run to and from a group's
ports, and, while a group is open, a stub for each value that enters or leaves it.

These are view items only, made anew by the cell adapter after every edit: no undo step, no
file and no cell ever sees them, and the user cannot pick them up (the cell's own wires stay
between the cell's own nodes, hidden where one end is inside a closed group).
"""

from __future__ import annotations

from NodeGraphQt.constants import Z_VAL_PIPE
from PySide6 import QtCore, QtGui, QtWidgets

from . import canvas_wires, theme

WIRE_WIDTH = 1.2  # NodeGraphQt's pipe width
MAX_TANGENT = 150.0  # how far a wire's curve runs out of its ports, at most
STUB_HEIGHT = 32.0
STUB_MIN_WIDTH = 72.0
STUB_DOT = 12.0
SELECTED_RING = 2.0  # the selection's ring around a stub, as around a node


class GroupWire(QtWidgets.QGraphicsPathItem):
    """A curved wire from the centre of `start` (an output port, or a stub's dot) to the centre of `end`,
    in the colour of the node its value comes from, drawn and routed around nodes like the cell's own."""

    def __init__(self, start: QtWidgets.QGraphicsItem, end: QtWidgets.QGraphicsItem, rgb: theme.RGB) -> None:
        super().__init__()
        self.start, self.end = start, end
        pen = QtGui.QPen(theme.qcolor(tuple(int(c * 0.8) for c in rgb)), WIRE_WIDTH)
        self.setPen(pen)
        self.setZValue(Z_VAL_PIPE)
        self.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
        self.redraw()

    def redraw(self) -> None:
        a = self.start.sceneBoundingRect().center()
        b = self.end.sceneBoundingRect().center()
        tangent = min(abs(b.x() - a.x()), MAX_TANGENT)
        path = QtGui.QPainterPath(a)
        path.cubicTo(QtCore.QPointF(a.x() + tangent, a.y()), QtCore.QPointF(b.x() - tangent, b.y()), b)
        self.setPath(path)
        canvas_wires.route_later(self, self.start, self.end, MAX_TANGENT, self.setPath)  # around nodes


class PortStub(QtWidgets.QGraphicsItem):
    """An open group's input or output: a small block named after the value, in the colour of the node
    that computes it, with a dot on the side that faces the group (`dot`, where its wires attach).
    Ringed in the selection's colour while the selection stands for the node outside the group that
    computes it (the panels select it there)."""

    def __init__(self, text: str, rgb: theme.RGB, facing_right: bool) -> None:
        super().__init__()
        self.text = text
        self.rgb = rgb
        self.selected = False
        font = QtGui.QFont()
        font.setPointSizeF(12.0)  # an open group is seen whole, at about half size
        font.setBold(True)
        self._font = font
        width = QtGui.QFontMetricsF(font).horizontalAdvance(text) + 2 * STUB_DOT + 12.0
        self.rect = QtCore.QRectF(0.0, 0.0, max(STUB_MIN_WIDTH, width), STUB_HEIGHT)
        x = self.rect.right() - STUB_DOT / 2 if facing_right else -STUB_DOT / 2
        self.dot = QtWidgets.QGraphicsEllipseItem(x, (STUB_HEIGHT - STUB_DOT) / 2, STUB_DOT, STUB_DOT, self)
        self.dot.setBrush(theme.qcolor(rgb))
        self.dot.setPen(QtGui.QPen(theme.qcolor(rgb).darker(160), 1.0))
        self.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
        self.setToolTip(f"{text}: {'enters' if facing_right else 'leaves'} the group")

    def set_selected(self, selected: bool) -> None:
        if selected != self.selected:
            self.selected = selected
            self.update()

    def boundingRect(self) -> QtCore.QRectF:  # noqa: N802 (Qt's name)
        return self.rect.adjusted(-STUB_DOT, -2 * SELECTED_RING, STUB_DOT, 2 * SELECTED_RING)

    def paint(self, painter: QtGui.QPainter, option, widget=None) -> None:
        painter.save()
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        color = theme.qcolor(self.rgb)
        painter.setBrush(color.darker(170))
        painter.setPen(QtGui.QPen(color, 1.2))
        painter.drawRoundedRect(self.rect, STUB_HEIGHT / 2, STUB_HEIGHT / 2)
        if self.selected:
            painter.setBrush(QtCore.Qt.BrushStyle.NoBrush)
            painter.setPen(QtGui.QPen(theme.qcolor(theme.SELECTED_COLOR), SELECTED_RING))
            ring = self.rect.adjusted(-SELECTED_RING, -SELECTED_RING, SELECTED_RING, SELECTED_RING)
            painter.drawRoundedRect(ring, ring.height() / 2, ring.height() / 2)
        painter.setFont(self._font)
        painter.setPen(QtGui.QColor(235, 237, 240))
        painter.drawText(self.rect, QtCore.Qt.AlignmentFlag.AlignCenter, self.text)
        painter.restore()
