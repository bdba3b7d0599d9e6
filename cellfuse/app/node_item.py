"""How a node of the cell looks on the canvas: a coloured header by kind, a caption saying what the
node is, and a red or amber border and badge when validation has something to say about it."""

from __future__ import annotations

from NodeGraphQt.qgraphics.node_base import NodeItem
from PySide6 import QtCore, QtGui

from . import theme

CAPTION_HEIGHT = 16.0
RADIUS = 6.0


class CellNodeItem(NodeItem):
    """NodeGraphQt's node item, painted in CellFuse's style. The marks are view state only."""

    def __init__(self, name: str = "node", parent=None):
        super().__init__(name, parent)
        self.kind_rgb: theme.RGB = theme.KIND_COLORS["elementwise"]
        self.caption = ""
        self.mark: str | None = None  # "error" | "warning" | None
        self.mark_lines: list[str] = []
        self.plan_tag = ""  # e.g. "hoisted", drawn bottom right
        self.shape_text = ""
        self._icon_item.setPixmap(QtGui.QPixmap())
        self._icon_item.setVisible(False)
        self._proxy_mode_threshold = 45  # keep titles drawn when zoomed out to see a whole cell

    # -- state set by the editor ------------------------------------------------------------------
    def set_style(self, kind_rgb: theme.RGB, caption: str) -> None:
        self.kind_rgb = kind_rgb
        self.caption = caption
        self.update()

    def set_caption(self, caption: str) -> None:
        if caption != self.caption:
            self.caption = caption
            self.update()

    def set_mark(self, mark: str | None, lines: list[str]) -> None:
        if (mark, lines) != (self.mark, self.mark_lines):
            self.mark, self.mark_lines = mark, list(lines)
            self._refresh_tooltip()
            self.update()

    def set_plan_tag(self, tag: str) -> None:
        if tag != self.plan_tag:
            self.plan_tag = tag
            self.update()

    def set_shape_text(self, text: str) -> None:
        if text != self.shape_text:
            self.shape_text = text
            self._refresh_tooltip()

    # -- NodeGraphQt hooks ----------------------------------------------------------------------
    def calc_size(self, add_w: float = 0.0, add_h: float = 0.0):
        width, height = super().calc_size(add_w, add_h + CAPTION_HEIGHT)
        return max(width, 150.0), height

    def _tooltip_disable(self, state: bool) -> None:  # NodeGraphQt sets the tooltip here
        self._refresh_tooltip()

    def _refresh_tooltip(self) -> None:
        parts = [f"<b>{self.name}</b>"]
        if self.caption:
            parts.append(self.caption)
        if self.shape_text:
            parts.append(f"shape {self.shape_text}")
        color = {"error": "#f07060", "warning": "#f0c040"}.get(self.mark or "", "")
        for line in self.mark_lines:
            parts.append(f'<span style="color:{color}">{line}</span>')
        self.setToolTip("<br/>".join(parts))

    def _paint_horizontal(self, painter, option, widget) -> None:
        painter.save()
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        rect = self.boundingRect().adjusted(1.0, 1.0, -1.0, -1.0)
        body = QtGui.QPainterPath()
        body.addRoundedRect(rect, RADIUS, RADIUS)

        painter.setPen(QtCore.Qt.PenStyle.NoPen)
        painter.fillPath(body, theme.qcolor(theme.NODE_BODY, 245))

        # Header band in the kind's colour.
        header_h = self._text_item.boundingRect().height() + 2.0
        painter.save()
        painter.setClipPath(body)
        header = QtCore.QRectF(rect.left(), rect.top(), rect.width(), header_h)
        kind = theme.qcolor(self.kind_rgb)
        painter.fillRect(header, kind.darker(135))
        painter.fillRect(QtCore.QRectF(rect.left(), rect.top() + header_h - 1.5, rect.width(), 1.5), kind)
        painter.restore()

        # Caption line at the bottom.
        font = painter.font()
        font.setPointSizeF(max(6.5, font.pointSizeF() - 1.5))
        painter.setFont(font)
        caption_rect = QtCore.QRectF(rect.left() + 8.0, rect.bottom() - CAPTION_HEIGHT - 2.0,
                                     rect.width() - 16.0, CAPTION_HEIGHT)
        if self.caption:
            painter.setPen(QtGui.QColor(150, 154, 164))
            painter.drawText(caption_rect, QtCore.Qt.AlignmentFlag.AlignLeft
                             | QtCore.Qt.AlignmentFlag.AlignVCenter, self.caption)
        if self.plan_tag:
            metrics = QtGui.QFontMetricsF(font)
            w = metrics.horizontalAdvance(self.plan_tag) + 10.0
            tag = QtCore.QRectF(rect.right() - w - 6.0, caption_rect.top() + 1.0, w, CAPTION_HEIGHT - 2.0)
            painter.setPen(QtCore.Qt.PenStyle.NoPen)
            painter.setBrush(theme.qcolor(theme.HOISTED_COLOR, 220))
            painter.drawRoundedRect(tag, 6.0, 6.0)
            painter.setPen(QtGui.QColor(40, 34, 10))
            painter.drawText(tag, QtCore.Qt.AlignmentFlag.AlignCenter, self.plan_tag)

        # Border: the problem's colour (or the kind's), and the selection as a ring outside it.
        if self.mark == "error":
            pen = QtGui.QPen(theme.qcolor(theme.ERROR_COLOR), 2.2)
        elif self.mark == "warning":
            pen = QtGui.QPen(theme.qcolor(theme.WARNING_COLOR), 1.8)
        else:
            pen = QtGui.QPen(kind.darker(160), 1.0)
        painter.setBrush(QtCore.Qt.BrushStyle.NoBrush)
        if self.selected:
            ring = QtGui.QPainterPath()
            ring.addRoundedRect(rect.adjusted(-0.5, -0.5, 0.5, 0.5), RADIUS + 0.5, RADIUS + 0.5)
            painter.setPen(QtGui.QPen(theme.qcolor(theme.SELECTED_COLOR), 2.0))
            painter.drawPath(ring)
            if self.mark:
                inner = QtGui.QPainterPath()
                inner.addRoundedRect(rect.adjusted(2.0, 2.0, -2.0, -2.0), RADIUS - 1.5, RADIUS - 1.5)
                painter.setPen(pen)
                painter.drawPath(inner)
        else:
            painter.setPen(pen)
            painter.drawPath(body)

        if self.mark:
            rgb = theme.ERROR_COLOR if self.mark == "error" else theme.WARNING_COLOR
            size = min(15.0, header_h - 4.0)
            badge = QtCore.QRectF(rect.right() - size - 5.0, rect.top() + (header_h - size) / 2.0,
                                  size, size)
            painter.setPen(QtGui.QPen(QtGui.QColor(20, 20, 22), 1.2))
            painter.setBrush(theme.qcolor(rgb))
            painter.drawEllipse(badge)
            bold = painter.font()
            bold.setBold(True)
            painter.setFont(bold)
            painter.setPen(QtGui.QColor(20, 20, 22))
            painter.drawText(badge, QtCore.Qt.AlignmentFlag.AlignCenter, "!")
        painter.restore()
