"""How a node of the cell looks on the canvas: a coloured header by kind, a caption saying what the
node is, and a red or amber border and badge for a problem validation found in it, a blue "i" badge
alone for a note (a condition the cell runs under, no problem).

Zoomed out far enough to see a whole cell, the title and captions would be a few pixels high; below
COMPACT_BELOW a node draws as a compact block instead: its kind's colour, its name in a large font,
and its problem mark, border and badge kept at a size the eye finds on screen. This is NodeGraphQt's
proxy mode (which hides the port names and the title item), switched at one zoom for every node.
"""

from __future__ import annotations

from NodeGraphQt.qgraphics.node_base import NodeItem
from PySide6 import QtCore, QtGui, QtWidgets

from . import theme

CAPTION_HEIGHT = 16.0
RADIUS = 6.0
# Below this zoom the 9-pt title would be under 8 pixels high on screen.
COMPACT_BELOW = 0.65
# Sizes on screen, in pixels, of what a compact node draws whatever the zoom (as far as the node fits).
COMPACT_TITLE_PX = 13.0
COMPACT_MIN_TITLE_PX = 9.0
COMPACT_BADGE_PX = 12.0


class CellNodeItem(NodeItem):
    """NodeGraphQt's node item, painted in CellFuse's style. The marks are view state only."""

    def __init__(self, name: str = "node", parent=None):
        super().__init__(name, parent)
        self.kind_rgb: theme.RGB = theme.KIND_COLORS["elementwise"]
        self.caption = ""
        self.mark: str | None = None  # "error" | "warning" | "info" | None
        self.mark_lines: list[str] = []
        self.plan_tag = ""  # e.g. "hoisted", drawn bottom right
        self.shape_text = ""
        self._icon_item.setPixmap(QtGui.QPixmap())
        self._icon_item.setVisible(False)
        self._zoom = 1.0  # the scale the node was last painted at
        self.compact_title_px = 0.0  # the compact title's height on screen as last drawn
        # Wires drawn to this node's ports besides NodeGraphQt's own (a group's), redrawn as it moves.
        self.wires: list = []
        self.setFlag(QtWidgets.QGraphicsItem.GraphicsItemFlag.ItemSendsGeometryChanges, True)

    @property
    def compact(self) -> bool:
        """Whether the node draws as a compact block (zoomed out below COMPACT_BELOW)."""
        return self._proxy_mode

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

    def paint(self, painter, option, widget) -> None:
        # Qt's level of detail: the scale this paint draws at, in whichever view (or image) draws it.
        self._zoom = option.levelOfDetailFromTransform(painter.worldTransform())
        super().paint(painter, option, widget)

    def itemChange(self, change, value):  # noqa: N802 (Qt's name)
        if change == QtWidgets.QGraphicsItem.GraphicsItemChange.ItemPositionHasChanged:
            for wire in self.wires:
                wire.redraw()
        return super().itemChange(change, value)

    def auto_switch_mode(self) -> None:
        # NodeGraphQt switches by each node's width on screen, so that a wide node would keep its
        # small title while its narrower neighbours turn compact; here they all switch at one zoom.
        self.set_proxy_mode(self._zoom < COMPACT_BELOW)

    def set_proxy_mode(self, mode: bool) -> None:
        super().set_proxy_mode(mode)
        # CellFuse's nodes have no icon, but NodeGraphQt shows its icon item again on zooming back in.
        self._icon_item.setVisible(False)

    def _tooltip_disable(self, state: bool) -> None:  # NodeGraphQt sets the tooltip here
        self._refresh_tooltip()

    def _refresh_tooltip(self) -> None:
        parts = [f"<b>{self.name}</b>"]
        if self.caption:
            parts.append(self.caption)
        if self.shape_text:
            parts.append(f"shape {self.shape_text}")
        color = theme.SEVERITY_TEXT.get(self.mark or "", "")
        for line in self.mark_lines:
            parts.append(f'<span style="color:{color}">{line}</span>')
        self.setToolTip("<br/>".join(parts))

    def _paint_horizontal(self, painter, option, widget) -> None:
        if self._proxy_mode:
            self._paint_compact(painter)
            return
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

        self._draw_border(painter, rect, kind, 1.0)
        if self.mark:
            size = min(15.0, header_h - 4.0)
            self._draw_badge(painter, QtCore.QRectF(rect.right() - size - 5.0,
                                                    rect.top() + (header_h - size) / 2.0, size, size), 1.0)
        painter.restore()

    def _paint_compact(self, painter) -> None:
        """The node as one block of its kind's colour with its name large: sizes in pixels of the
        screen, each `unit` long in the scene, as far as the block holds them."""
        unit = 1.0 / max(self._zoom, 1e-3)
        painter.save()
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        rect = self.boundingRect().adjusted(1.0, 1.0, -1.0, -1.0)
        body = QtGui.QPainterPath()
        body.addRoundedRect(rect, RADIUS, RADIUS)
        kind = theme.qcolor(self.kind_rgb)
        fill = kind.darker(135)
        painter.setPen(QtCore.Qt.PenStyle.NoPen)
        painter.fillPath(body, fill)

        pad = 4.0 * unit
        title_rect = rect.adjusted(pad, 0.0, -pad, 0.0)
        if self.mark:
            size = min(COMPACT_BADGE_PX * unit, rect.height() * 0.45)
            badge = QtCore.QRectF(rect.right() - size - pad, rect.top() + pad, size, size)
            title_rect.setRight(badge.left() - pad / 2.0)
        font = QtGui.QFont(self._text_item.font())
        font.setBold(True)
        self.compact_title_px = self._fit_title_px(font, title_rect)
        font.setPixelSize(max(1, round(self.compact_title_px * unit)))
        painter.setFont(font)
        text = QtGui.QFontMetricsF(font).elidedText(self.name, QtCore.Qt.TextElideMode.ElideRight,
                                                     title_rect.width())
        light, dark = (235, 237, 240), (20, 20, 22)
        fill_rgb = (fill.red(), fill.green(), fill.blue())
        ink = light if theme.contrast(light, fill_rgb) >= theme.contrast(dark, fill_rgb) else dark
        painter.setPen(theme.qcolor(ink))
        painter.drawText(title_rect, QtCore.Qt.AlignmentFlag.AlignCenter, text)

        self._draw_border(painter, rect, kind, unit)
        if self.mark:
            font.setPixelSize(max(1, round(badge.height() * 0.7)))
            painter.setFont(font)
            self._draw_badge(painter, badge, unit)
        painter.restore()

    def _fit_title_px(self, font: QtGui.QFont, room: QtCore.QRectF) -> float:
        """The compact title's height on screen, in pixels: COMPACT_TITLE_PX, less where the name is too
        wide for the block at this zoom but not under COMPACT_MIN_TITLE_PX (it is elided then), and
        never taller than the block holds."""
        zoom = max(self._zoom, 1e-3)
        probe = QtGui.QFont(font)
        probe.setPixelSize(100)
        per_px = QtGui.QFontMetricsF(probe).horizontalAdvance(self.name) / 100.0  # width per pixel
        # A little less than the width measured at 100 pixels: small text is hinted wider.
        fit_width = 0.92 * room.width() / max(per_px, 1e-3) * zoom
        return min(max(min(COMPACT_TITLE_PX, fit_width), COMPACT_MIN_TITLE_PX), room.height() * 0.6 * zoom)

    def _draw_border(self, painter, rect: QtCore.QRectF, kind: QtGui.QColor, unit: float) -> None:
        """The problem's colour (or the kind's, for a note or nothing) around the node, and the
        selection as a ring outside it; `unit` is the scene length of one pen width unit."""
        if self.mark == "error":
            pen = QtGui.QPen(theme.qcolor(theme.ERROR_COLOR), 2.2 * unit)
        elif self.mark == "warning":
            pen = QtGui.QPen(theme.qcolor(theme.WARNING_COLOR), 1.8 * unit)
        else:
            pen = QtGui.QPen(kind.darker(160), 1.0 * unit)
        painter.setBrush(QtCore.Qt.BrushStyle.NoBrush)
        if self.selected:
            ring = QtGui.QPainterPath()
            out = 0.5 * unit
            ring.addRoundedRect(rect.adjusted(-out, -out, out, out), RADIUS + out, RADIUS + out)
            painter.setPen(QtGui.QPen(theme.qcolor(theme.SELECTED_COLOR), 2.0 * unit))
            painter.drawPath(ring)
            if self.mark in ("error", "warning"):
                inset = 2.0 * unit
                inner = QtGui.QPainterPath()
                inner.addRoundedRect(rect.adjusted(inset, inset, -inset, -inset), RADIUS - 1.5, RADIUS - 1.5)
                painter.setPen(pen)
                painter.drawPath(inner)
        else:
            body = QtGui.QPainterPath()
            body.addRoundedRect(rect, RADIUS, RADIUS)
            painter.setPen(pen)
            painter.drawPath(body)

    def _draw_badge(self, painter, badge: QtCore.QRectF, unit: float) -> None:
        """The mark's round badge with its "!" (a problem) or "i" (a note), in the painter's font made
        bold."""
        rgb = {"error": theme.ERROR_COLOR, "warning": theme.WARNING_COLOR}.get(self.mark, theme.INFO_COLOR)
        painter.setPen(QtGui.QPen(QtGui.QColor(20, 20, 22), 1.2 * unit))
        painter.setBrush(theme.qcolor(rgb))
        painter.drawEllipse(badge)
        bold = QtGui.QFont(painter.font())
        bold.setBold(True)
        painter.setFont(bold)
        painter.setPen(QtGui.QColor(20, 20, 22))
        painter.drawText(badge, QtCore.Qt.AlignmentFlag.AlignCenter, "i" if self.mark == "info" else "!")


class GroupNodeItem(CellNodeItem):
    """A group's node: a double-click anywhere on it, its title included, opens the group."""

    def mouseDoubleClickEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        viewer = self.viewer()
        if event.button() == QtCore.Qt.MouseButton.LeftButton and viewer is not None:
            viewer.node_double_clicked.emit(self.id)
            event.accept()
            return
        super().mouseDoubleClickEvent(event)
