"""The plan drawn on the canvas: a coloured outline around the nodes of each GEMM group and of each
fused kernel, with its name, and a "hoisted" tag on the matmuls computed once before the loop.

The outlines are plain scene items behind the nodes; they are not nodes of the graph and never
reach the undo stack or the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6 import QtCore, QtGui, QtWidgets

from . import theme
from .cell_adapter import CellAdapter

PAD = 8.0
LABEL_BAND = 16.0
Z_VALUE = -5.0


@dataclass(frozen=True)
class PlanRegion:
    """One outlined set of nodes."""

    name: str
    label: str
    nodes: tuple[str, ...]
    rgb: theme.RGB
    kind: str  # "gemm" or "fused"
    hoisted: bool


def regions_of(summary: dict) -> list[PlanRegion]:
    """The regions to outline for a plan summary (see codegen's Plan.summary)."""
    out: list[PlanRegion] = []
    for i, g in enumerate(summary.get("gemm_groups", [])):
        matmuls = list(g.get("matmuls", []))
        folded = list(g.get("folded", []))
        where = "hoisted: once for all steps" if g.get("hoisted") else "every step"
        n = len(matmuls)
        label = f"{g.get('name', f'gemm{i}')} · {n} matmul{'s' if n != 1 else ''} as one GEMM · {where}"
        if folded:
            label += f" · +{len(folded)} bias folded"
        out.append(PlanRegion(g.get("name", f"gemm{i}"), label, tuple(matmuls + folded),
                              theme.GEMM_GROUP_COLORS[i % len(theme.GEMM_GROUP_COLORS)], "gemm",
                              bool(g.get("hoisted"))))
    for i, k in enumerate(summary.get("fused_kernels", [])):
        nodes = list(k.get("nodes", []))
        where = "hoisted" if k.get("hoisted") else "every step"
        label = f"{k.get('name', f'k{i}')} · {len(nodes)} op{'s' if len(nodes) != 1 else ''} fused · {where}"
        out.append(PlanRegion(k.get("name", f"k{i}"), label, tuple(nodes),
                              theme.FUSED_COLORS[i % len(theme.FUSED_COLORS)], "fused",
                              bool(k.get("hoisted"))))
    return out


def bridges(rects: list[QtCore.QRectF], column_gap: float = 110.0, row_gap: float = 30.0
            ) -> list[QtCore.QRectF]:
    """Rectangles that join the outlines of neighbouring nodes of one region (side by side in
    adjacent columns, or one above the other), so that a region reads as one area."""
    out = []
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            dx = max(b.left() - a.right(), a.left() - b.right())
            dy = max(b.top() - a.bottom(), a.top() - b.bottom())
            top, bottom = max(a.top(), b.top()), min(a.bottom(), b.bottom())
            left, right = max(a.left(), b.left()), min(a.right(), b.right())
            if 0.0 < dx <= column_gap and bottom - top > 20.0:
                x0 = min(a.right(), b.right())
                out.append(QtCore.QRectF(x0 - 1.0, top + 6.0, dx + 2.0, bottom - top - 12.0))
            elif 0.0 < dy <= row_gap and right - left > 20.0:
                y0 = min(a.bottom(), b.bottom())
                out.append(QtCore.QRectF(left + 6.0, y0 - 1.0, right - left - 12.0, dy + 2.0))
    return out


class PlanOverlay:
    """Draws plan regions in the adapter's canvas scene."""

    def __init__(self, adapter: CellAdapter) -> None:
        self._adapter = adapter
        self._regions: list[PlanRegion] = []
        self._items: list[QtWidgets.QGraphicsItem] = []
        self._visible = True
        self._tagged: set[str] = set()

    @property
    def regions(self) -> list[PlanRegion]:
        return list(self._regions)

    def set_visible(self, visible: bool) -> None:
        self._visible = visible
        self.refresh()

    def show_summary(self, summary: dict | None) -> None:
        self._regions = regions_of(summary) if summary else []
        self.refresh()

    def clear(self) -> None:
        self.show_summary(None)

    def refresh(self) -> None:
        """Redraws the outlines where the nodes are now."""
        scene = self._adapter.graph.viewer().scene()
        for item in self._items:
            scene.removeItem(item)
        self._items.clear()
        for node_id in self._tagged:
            for n in self._adapter.canvas_nodes(node_id):
                n.item.set_plan_tag("")
        self._tagged.clear()
        if not self._visible:
            return
        node_rects = [n.view.sceneBoundingRect() for n in self._adapter.graph.all_nodes()]
        placed: list[QtCore.QRectF] = []
        region_rects: list[list[QtCore.QRectF]] = []
        for region in self._regions:
            rects: list[QtCore.QRectF] = []
            for node_id in region.nodes:
                for n in self._adapter.canvas_nodes(node_id)[:1]:
                    rects.append(n.view.sceneBoundingRect().adjusted(-PAD, -PAD, PAD, PAD))
                    if region.kind == "gemm" and region.hoisted:
                        n.item.set_plan_tag("hoisted")
                        self._tagged.add(node_id)
            region_rects.append(rects)
        for index, (region, rects) in enumerate(zip(self._regions, region_rects, strict=True)):
            if not rects:
                continue
            others = [r for j, rs in enumerate(region_rects) if j != index for r in rs]
            color = theme.qcolor(region.rgb)
            label = QtWidgets.QGraphicsSimpleTextItem(region.label)
            font = label.font()
            font.setPointSizeF(8.0)
            font.setBold(True)
            label.setFont(font)
            label.setBrush(color.lighter(130))
            size = label.boundingRect().size()
            # The label goes above the region's top node, or below its bottom one, where it hides
            # no node and no other label; where neither is free, the tooltip and the panel say it.
            top = min(rects, key=lambda r: (r.top(), r.left()))
            bottom = max(rects, key=lambda r: (r.bottom(), -r.left()))
            spot = None
            for anchor, above in ((top, True), (bottom, False)):
                y = anchor.top() - LABEL_BAND + 1.0 if above else anchor.bottom() + 1.0
                box = QtCore.QRectF(anchor.left() + 6.0, y, size.width(), size.height())
                if not any(box.intersects(r) for r in (*node_rects, *others, *placed)):
                    spot = (anchor, above, box)
                    break
            # All the shapes in one winding path, merged into one outline by simplified().
            path = QtGui.QPainterPath()
            path.setFillRule(QtCore.Qt.FillRule.WindingFill)
            for rect in [*rects, *bridges(rects)]:
                if spot is not None and rect is spot[0]:  # room for the label
                    rect = (rect.adjusted(0.0, -LABEL_BAND, 0.0, 0.0) if spot[1]
                            else rect.adjusted(0.0, 0.0, 0.0, LABEL_BAND))
                path.addRoundedRect(rect, 10.0, 10.0)
            item = QtWidgets.QGraphicsPathItem(path.simplified())
            fill = QtGui.QColor(color)
            fill.setAlpha(38 if region.kind == "fused" else 52)
            item.setBrush(fill)
            pen = QtGui.QPen(color, 2.0 if region.kind == "gemm" else 1.6)
            style = QtCore.Qt.PenStyle
            pen.setStyle(style.DashLine if region.kind == "gemm" else style.SolidLine)
            pen.setCosmetic(True)
            item.setPen(pen)
            item.setZValue(Z_VALUE)
            item.setToolTip(region.label)
            item.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
            scene.addItem(item)
            self._items.append(item)
            if spot is None:
                continue
            placed.append(spot[2])
            label.setPos(spot[2].topLeft())
            label.setZValue(Z_VALUE + 0.5)
            label.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
            scene.addItem(label)
            self._items.append(label)
