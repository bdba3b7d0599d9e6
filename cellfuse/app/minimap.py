"""A small overview of the whole canvas in its bottom-right corner: every node shown as a block in its
kind's colour, and the part of the cell the canvas shows as a frame; a click or a drag there moves the
canvas to that place.

The overview draws boxes of its own rather than the scene's items: a node paints itself by the scale
it is painted at (compact below a zoom, see node_item), and painting the scene a second time, tiny,
would switch every node's look back and forth between the two views.
"""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from . import theme
from .node_item import CellNodeItem

SIZE = (200, 130)
MARGIN = 10  # from the canvas's edges
PAD = 6  # inside the overview, around the cell
REDRAW_MS = 120  # the overview follows edits and moves this long after them, once for all made meanwhile


class Minimap(QtWidgets.QWidget):
    """The overview of `viewer` (a CanvasViewer), a child of it."""

    def __init__(self, viewer) -> None:
        super().__init__(viewer)
        self.viewer = viewer
        self.setObjectName("minimap")
        self.setFixedSize(*SIZE)
        self.setCursor(QtCore.Qt.CursorShape.PointingHandCursor)
        self.setToolTip("The whole cell: click or drag to move the canvas there")
        self._boxes: list[tuple[QtCore.QRectF, QtGui.QColor]] = []
        self._bounds = QtCore.QRectF()
        self._held: QtGui.QTransform | None = None  # the mapping a drag began with: the frame moves, not it
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self.refresh)
        viewer.scene().changed.connect(self._soon)
        viewer.view_changed.connect(self._follow_view)
        self._place()

    # -- what it shows --------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Reads where the nodes are now."""
        self._timer.stop()
        self._boxes = [(item.sceneBoundingRect(), theme.qcolor(item.kind_rgb))
                       for item in self.viewer.scene().items()
                       if isinstance(item, CellNodeItem) and item.isVisible()]
        bounds = QtCore.QRectF()
        for rect, _color in self._boxes:
            bounds = bounds.united(rect)
        self._bounds = bounds
        self.update()

    def _soon(self) -> None:
        if not self._timer.isActive():  # not restarted: a stream of changes (a drag) still shows
            self._timer.start()

    def _follow_view(self) -> None:
        self._place()
        self.update()

    def _place(self) -> None:
        parent = self.parentWidget()
        self.move(parent.width() - self.width() - MARGIN, parent.height() - self.height() - MARGIN)
        self.raise_()

    def _transform(self) -> QtGui.QTransform | None:
        """Scene to overview: the cell and the canvas's view both in sight, scaled to fit."""
        area = self._bounds.united(self.viewer.visible_scene_rect()) if not self._bounds.isNull() else None
        if area is None or area.isEmpty():
            return None
        room = QtCore.QRectF(self.rect()).adjusted(PAD, PAD, -PAD, -PAD)
        scale = min(room.width() / area.width(), room.height() / area.height())
        t = QtGui.QTransform()
        t.translate(room.center().x(), room.center().y())
        t.scale(scale, scale)
        t.translate(-area.center().x(), -area.center().y())
        return t

    def view_frame(self) -> QtCore.QRectF:
        """Where the canvas's view is drawn in the overview, in its pixels."""
        t = self._transform()
        return t.mapRect(self.viewer.visible_scene_rect()) if t is not None else QtCore.QRectF()

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        painter = QtGui.QPainter(self)
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        painter.setPen(QtGui.QPen(theme.qcolor(theme.CANVAS_GRID).lighter(160), 1.0))
        painter.setBrush(theme.qcolor(theme.CANVAS_BACKGROUND, 225))
        painter.drawRoundedRect(QtCore.QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5), 5.0, 5.0)
        t = self._transform()
        if t is not None:
            painter.setPen(QtCore.Qt.PenStyle.NoPen)
            for rect, color in self._boxes:
                painter.setBrush(color)
                painter.drawRect(t.mapRect(rect))
            painter.setBrush(QtCore.Qt.BrushStyle.NoBrush)
            painter.setPen(QtGui.QPen(theme.qcolor(theme.SELECTED_COLOR), 1.5))
            painter.drawRect(self.view_frame())
        painter.end()

    # -- moving the canvas ----------------------------------------------------------------------------
    def _go(self, pos: QtCore.QPointF) -> None:
        t = self._held or self._transform()
        if t is None:
            return
        inverse, ok = t.inverted()
        if ok:
            self.viewer.centre_at(inverse.map(pos))

    def mousePressEvent(self, event: QtGui.QMouseEvent) -> None:  # noqa: N802 (Qt's name)
        if event.button() == QtCore.Qt.MouseButton.LeftButton:
            self._held = self._transform()
            self._go(event.position())
            event.accept()

    def mouseReleaseEvent(self, event: QtGui.QMouseEvent) -> None:  # noqa: N802 (Qt's name)
        self._held = None
        event.accept()

    def mouseMoveEvent(self, event: QtGui.QMouseEvent) -> None:  # noqa: N802 (Qt's name)
        if event.buttons() & QtCore.Qt.MouseButton.LeftButton:
            self._go(event.position())
            event.accept()
