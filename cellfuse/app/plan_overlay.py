"""The plan drawn on the canvas: a coloured outline around the nodes of each GEMM group and of each
fused kernel, with its name, and a "hoisted" tag on the matmuls computed once before the loop.

Every launch has a colour of its own (theme.launch_colors), the one the plan panel lists it with. A
region whose nodes lie apart on the canvas is drawn as several pieces, each labelled with its part
("k0 (1/3)"), so that no piece is left unnamed.

A canvas node that shows nodes of several launches (a closed group's node: a gate holds a matmul of
each GEMM and the ops of a kernel or more) is outlined by each of them side by side, its outline cut
into one slice per launch from left to right, in the plan's order: the colour of every launch shows
on it, and a launch that covers a column of groups reads as one band down their slices.

While the cell has no plan (an error, a node being wired), the last valid plan stays drawn, grey,
dashed and labelled "out of date", as the plan panel and the CUDA view keep it: it is what the user
was working from, and a node deleted since simply drops out of it.

The outlines are plain scene items behind the nodes; they are not nodes of the graph and never
reach the undo stack or the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6 import QtCore, QtGui, QtWidgets

from . import theme
from .cell_adapter import CellAdapter
from .node_types import CellNode

PAD = 8.0
LABEL_BAND = 16.0
LABEL_INDENT = 6.0
NODE_CLEARANCE = 4.0  # a label keeps this far from any node, so that it never touches a title bar
Z_VALUE = -5.0
STALE_RGB: theme.RGB = (128, 132, 140)  # every region of an out-of-date plan, in one quiet grey
STALE_TAG = "out of date"


@dataclass(frozen=True)
class PlanRegion:
    """One outlined set of nodes."""

    name: str
    label: str
    brief: str  # the label without the words, for a piece too narrow for the whole label
    nodes: tuple[str, ...]
    rgb: theme.RGB
    kind: str  # "gemm" or "fused"
    hoisted: bool
    tensor_cores: bool = False  # a GEMM run as 3xTF32 on tensor cores


@dataclass(frozen=True)
class PlacedLabel:
    """A label on the canvas: which piece of which region it names, and where it is."""

    region: str
    nodes: tuple[str, ...]
    text: str
    rect: QtCore.QRectF


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _gemm_region(i: int, g: dict, rgb: theme.RGB) -> PlanRegion:
    name = g.get("name", f"gemm{i}")
    matmuls = list(g.get("matmuls", []))
    folded = list(g.get("folded", []))
    where = "hoisted: once for all steps" if g.get("hoisted") else "every step"
    if g.get("tensor_cores"):
        where += ", on tensor cores (3xTF32)"
    label = f"{name} · {_plural(len(matmuls), 'matmul')} as one GEMM · {where}"
    if folded:
        label += f" · +{len(folded)} bias folded"
    brief = f"{_plural(len(matmuls), 'matmul')} · {'hoisted' if g.get('hoisted') else 'every step'}"
    return PlanRegion(name, label, brief, tuple(matmuls + folded), rgb, "gemm", bool(g.get("hoisted")),
                      bool(g.get("tensor_cores")))


def _fused_region(i: int, k: dict, rgb: theme.RGB) -> PlanRegion:
    name = k.get("name", f"k{i}")
    nodes = list(k.get("nodes", []))
    where = "hoisted" if k.get("hoisted") else "every step"
    label = f"{name} · {_plural(len(nodes), 'op')} fused · {where}"
    brief = f"{_plural(len(nodes), 'op')} · {where}"
    return PlanRegion(name, label, brief, tuple(nodes), rgb, "fused", bool(k.get("hoisted")))


def regions_of(summary: dict) -> list[PlanRegion]:
    """The regions to outline for a plan summary (see codegen's Plan.summary), one colour each."""
    groups = list(summary.get("gemm_groups", []))
    kernels = list(summary.get("fused_kernels", []))
    colors = theme.launch_colors(len(groups) + len(kernels))
    out = [_gemm_region(i, g, colors[i]) for i, g in enumerate(groups)]
    out += [_fused_region(i, k, colors[len(groups) + i]) for i, k in enumerate(kernels)]
    return out


Box = tuple[float, float, float, float]  # left, top, right, bottom: plain floats, quicker than QRectF's calls


def _box(r: QtCore.QRectF) -> Box:
    return r.left(), r.top(), r.right(), r.bottom()


def _bridge(a: Box, b: Box, column_gap: float, row_gap: float) -> QtCore.QRectF | None:
    """The rectangle joining two node outlines side by side in adjacent columns, or one above the
    other; None when they are too far apart (or overlap too little) to read as one area."""
    dx = max(b[0] - a[2], a[0] - b[2])
    dy = max(b[1] - a[3], a[1] - b[3])
    top, bottom = max(a[1], b[1]), min(a[3], b[3])
    left, right = max(a[0], b[0]), min(a[2], b[2])
    if 0.0 < dx <= column_gap and bottom - top > 20.0:
        x0 = min(a[2], b[2])
        return QtCore.QRectF(x0 - 1.0, top + 6.0, dx + 2.0, bottom - top - 12.0)
    if 0.0 < dy <= row_gap and right - left > 20.0:
        y0 = min(a[3], b[3])
        return QtCore.QRectF(left + 6.0, y0 - 1.0, right - left - 12.0, dy + 2.0)
    return None


def _near_pairs(boxes: list[Box], reach: float):
    """The index pairs (i < j) of boxes less than `reach` apart along x, found by a sweep in x: a region
    of a large cell has hundreds of nodes, and its far pairs can neither touch nor be bridged."""
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0])
    for n, i in enumerate(order):
        right = boxes[i][2] + reach
        for j in order[n + 1:]:
            if boxes[j][0] > right:
                break
            yield (i, j) if i < j else (j, i)


def bridges(rects: list[QtCore.QRectF], column_gap: float = 110.0, row_gap: float = 30.0
            ) -> list[QtCore.QRectF]:
    """Rectangles that join the outlines of neighbouring nodes of one region (side by side in
    adjacent columns, or one above the other), so that a region reads as one area."""
    boxes = [_box(r) for r in rects]
    out = []
    for i, j in sorted(_near_pairs(boxes, column_gap)):
        bridge = _bridge(boxes[i], boxes[j], column_gap, row_gap)
        if bridge is not None:
            out.append(bridge)
    return out


def pieces(rects: list[QtCore.QRectF], column_gap: float = 110.0, row_gap: float = 30.0
           ) -> list[list[int]]:
    """The indices of `rects` grouped into the areas the outline draws as one: rects that overlap or
    that a bridge joins. Pieces come top to bottom, then left to right."""
    parent = list(range(len(rects)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    boxes = [_box(r) for r in rects]
    for i, j in _near_pairs(boxes, column_gap):
        if rects[i].intersects(rects[j]) or _bridge(boxes[i], boxes[j], column_gap, row_gap) is not None:
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(rects)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: min((rects[i].top(), rects[i].left()) for i in g))


def outline(rects: list[QtCore.QRectF]) -> QtGui.QPainterPath:
    """The outline of the union of rectangles. The union is a QRegion's (bands of whole-pixel
    rectangles, made in time linear in their count), merged into polygons by simplified(), which is quick
    on straight edges: on rounded rectangles' curves it took seconds for a large fused region (the
    layer-normalised LSTM's, tens of seconds to open)."""
    region = QtGui.QRegion()
    for rect in rects:
        region = region.united(rect.toAlignedRect())
    path = QtGui.QPainterPath()
    path.addRegion(region)
    return path.simplified()


def share(rect: QtCore.QRectF, slot: int, slots: int) -> QtCore.QRectF:
    """The slice `slot` of `slots` side by side that a node's outline `rect` is cut into, for a node
    that shows nodes of several launches."""
    width = rect.width() / slots
    return QtCore.QRectF(rect.left() + slot * width, rect.top(), width, rect.height())


def label_texts(region: PlanRegion, part: int, parts: int) -> list[str]:
    """What a piece's label may say, longest first: the shorter ones are for crowded places."""
    name = region.name if parts == 1 else f"{region.name} ({part}/{parts})"
    if parts == 1:
        return [region.label, f"{name} · {region.brief}", name]
    return [f"{name} · {region.brief}", name]


class PlanOverlay:
    """Draws plan regions in the adapter's canvas scene."""

    def __init__(self, adapter: CellAdapter) -> None:
        self._adapter = adapter
        self._regions: list[PlanRegion] = []
        self._items: list[QtWidgets.QGraphicsItem] = []
        self._labels: list[PlacedLabel] = []
        self._visible = True
        self._stale = False
        self._tagged: set[str] = set()

    @property
    def regions(self) -> list[PlanRegion]:
        return list(self._regions)

    @property
    def labels(self) -> list[PlacedLabel]:
        return list(self._labels)

    def set_visible(self, visible: bool) -> None:
        self._visible = visible
        self.refresh()

    @property
    def out_of_date(self) -> bool:
        return self._stale and bool(self._regions)

    def show_summary(self, summary: dict | None) -> None:
        self._regions = regions_of(summary) if summary else []
        self._stale = False
        self.refresh()

    def mark_out_of_date(self) -> None:
        """Keeps the last plan drawn, marked as out of date, while the cell has none."""
        self._stale = True
        self.refresh()

    def clear(self) -> None:
        self.show_summary(None)

    def refresh(self) -> None:
        """Redraws the outlines where the nodes are now."""
        self._remove_items()
        if not self._visible:
            return
        shown = [self._shown_by(region) for region in self._regions]
        sharing: dict[str, list[int]] = {}  # a canvas node's id -> the regions it shows nodes of
        for index, pairs in enumerate(shown):
            for n, _node_id in pairs:
                if index not in sharing.setdefault(n.id, []):
                    sharing[n.id].append(index)
        region_rects = [[(share(n.view.sceneBoundingRect().adjusted(-PAD, -PAD, PAD, PAD),
                                sharing[n.id].index(index), len(sharing[n.id])), node_id)
                         for n, node_id in pairs] for index, pairs in enumerate(shown)]
        # A label may cover no node and no other region's outline.
        nodes = [n.view.sceneBoundingRect().adjusted(-NODE_CLEARANCE, -NODE_CLEARANCE, NODE_CLEARANCE,
                                                     NODE_CLEARANCE)
                 for n in self._adapter.graph.all_nodes() if n.view.isVisible()]
        placed: list[QtCore.QRectF] = []
        for index, (region, rects) in enumerate(zip(self._regions, region_rects, strict=True)):
            if not rects:
                continue
            others = [r for j, rs in enumerate(region_rects) if j != index for r, _ in rs]
            self._draw_region(region, rects, [*nodes, *others, *placed], placed)

    def _color(self, region: PlanRegion) -> QtGui.QColor:
        return theme.qcolor(STALE_RGB if self._stale else region.rgb)

    def _remove_items(self) -> None:
        scene = self._adapter.graph.viewer().scene()
        for item in self._items:
            scene.removeItem(item)
        self._items.clear()
        self._labels.clear()
        for node_id in self._tagged:
            for n in self._adapter.canvas_nodes(node_id):
                n.item.set_plan_tag("")
        self._tagged.clear()

    def _shown_by(self, region: PlanRegion) -> list[tuple[CellNode, str]]:
        """The canvas node that shows each node of the region (a closed group's node for its members),
        with that node's id; tags the hoisted matmuls."""
        out = []
        for node_id in region.nodes:
            for n in self._adapter.shown_nodes(node_id)[:1]:
                out.append((n, node_id))
                if n not in self._adapter.canvas_nodes(node_id):
                    continue  # a group's node: its members are not all hoisted matmuls
                if region.kind == "gemm" and region.hoisted and not self._stale:
                    n.item.set_plan_tag("hoisted")
                    self._tagged.add(node_id)
        return out

    def _draw_region(self, region: PlanRegion, rects: list[tuple[QtCore.QRectF, str]],
                     obstacles: list[QtCore.QRectF], placed: list[QtCore.QRectF]) -> None:
        color = self._color(region)
        shapes = [r for r, _ in rects]
        parts = pieces(shapes)
        for part, members in enumerate(parts, start=1):
            piece = [rects[i] for i in members]
            label = self._make_label(color)
            texts = label_texts(region, part, len(parts))
            if self._stale:
                texts = [f"{STALE_TAG} · {text}" for text in texts]
            spot = self._label_spot(label, texts, [r for r, _ in piece], [*obstacles, *placed])
            placed.append(spot.footprint)
            if spot.band is not None:
                shapes.append(spot.band)
            self._add_label(label, spot, region, tuple(node_id for _, node_id in piece))
        self._add_outline(region, color, shapes)

    def _tooltip(self, region: PlanRegion) -> str:
        if self._stale:
            return f"Out of date: the last valid plan. {region.label}"
        return region.label

    @staticmethod
    def _make_label(color: QtGui.QColor) -> QtWidgets.QGraphicsSimpleTextItem:
        label = QtWidgets.QGraphicsSimpleTextItem()
        font = label.font()
        font.setPointSizeF(8.0)
        font.setBold(True)
        label.setFont(font)
        label.setBrush(color.lighter(130))
        return label

    @staticmethod
    def _label_spot(label: QtWidgets.QGraphicsSimpleTextItem, texts: list[str], piece: list[QtCore.QRectF],
                    obstacles: list[QtCore.QRectF]) -> _Spot:
        """Where a piece's label goes: the longest text that fits in a band above one of the piece's
        top nodes or below one of its bottom nodes, the band joining the outline; else the name
        alone, level with a node's title just left or right of the outline (in the gap between
        columns, where only a short text fits), or just above or below the piece."""
        above = sorted(piece, key=lambda r: (r.top(), r.left()))
        below = sorted(piece, key=lambda r: (-r.bottom(), r.left()))
        for text in texts:
            label.setText(text)
            size = label.boundingRect().size()
            spots = [*(_Spot.banded(r, True, size, text) for r in above),
                     *(_Spot.banded(r, False, size, text) for r in below)]
            if text == texts[-1]:
                spots += [_Spot.side(r, left, size, text) for r in above for left in (True, False)]
            for spot in spots:
                if not any(spot.footprint.intersects(o) for o in obstacles):
                    return spot
        return _Spot.beside(piece, label.boundingRect().size(), texts[-1], obstacles)

    def _add_label(self, label: QtWidgets.QGraphicsSimpleTextItem, spot: _Spot, region: PlanRegion,
                   nodes: tuple[str, ...]) -> None:
        label.setText(spot.text)
        label.setPos(spot.box.topLeft())
        label.setZValue(Z_VALUE + 0.5)
        label.setToolTip(self._tooltip(region))
        label.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
        self._adapter.graph.viewer().scene().addItem(label)
        self._items.append(label)
        self._labels.append(PlacedLabel(region.name, nodes, spot.text, label.sceneBoundingRect()))

    def _add_outline(self, region: PlanRegion, color: QtGui.QColor, shapes: list[QtCore.QRectF]) -> None:
        item = QtWidgets.QGraphicsPathItem(outline([*shapes, *bridges(shapes)]))
        fill = QtGui.QColor(color)
        fill.setAlpha(14 if self._stale else 30 if region.kind == "fused" else 44)
        item.setBrush(fill)
        pen = QtGui.QPen(color, 2.0 if region.kind == "gemm" else 1.6)
        style = QtCore.Qt.PenStyle
        pen.setStyle(style.DotLine if self._stale else style.DashLine if region.kind == "gemm"
                     else style.SolidLine)
        pen.setCosmetic(True)
        pen.setJoinStyle(QtCore.Qt.PenJoinStyle.RoundJoin)
        item.setPen(pen)
        item.setZValue(Z_VALUE)
        item.setToolTip(self._tooltip(region))
        item.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
        self._adapter.graph.viewer().scene().addItem(item)
        self._items.append(item)


@dataclass(frozen=True)
class _Spot:
    """A label's place: its text box, the area it keeps clear, and the band that joins it to the
    outline (None for a label beside the piece)."""

    text: str
    box: QtCore.QRectF
    footprint: QtCore.QRectF
    band: QtCore.QRectF | None

    @staticmethod
    def banded(anchor: QtCore.QRectF, above: bool, size: QtCore.QSizeF, text: str) -> _Spot:
        y = anchor.top() - LABEL_BAND + 1.0 if above else anchor.bottom() - 1.0
        box = QtCore.QRectF(anchor.left() + LABEL_INDENT, y, size.width(), size.height())
        footprint = box.adjusted(-LABEL_INDENT, -1.0, LABEL_INDENT, 1.0)
        # The band overlaps the anchor's outline, so that the two merge into one shape.
        edge = anchor.top() if above else anchor.bottom() - 12.0
        band = footprint.united(QtCore.QRectF(anchor.left(), edge, footprint.width(), 12.0))
        return _Spot(text, box, footprint, band)

    @staticmethod
    def side(anchor: QtCore.QRectF, left: bool, size: QtCore.QSizeF, text: str) -> _Spot:
        x = anchor.left() - size.width() - 2.0 if left else anchor.right() + 2.0
        box = QtCore.QRectF(x, anchor.top() + PAD, size.width(), size.height())
        return _Spot(text, box, box.adjusted(-2.0, -1.0, 2.0, 1.0), None)

    @staticmethod
    def beside(piece: list[QtCore.QRectF], size: QtCore.QSizeF, text: str,
               obstacles: list[QtCore.QRectF]) -> _Spot:
        """The first free place going up from the piece's top, or down from its bottom, whichever is
        nearer; there is always one, past the last obstacle. The box jumps past each obstacle it meets
        (stepping a band at a time took seconds through the column of a 1,000-node cell)."""
        top = min(piece, key=lambda r: (r.top(), r.left()))
        bottom = max(piece, key=lambda r: (r.bottom(), -r.left()))
        tries = [(QtCore.QRectF(top.left() + LABEL_INDENT, top.top() - size.height() - 2.0, size.width(),
                                size.height()), -LABEL_BAND),
                 (QtCore.QRectF(bottom.left() + LABEL_INDENT, bottom.bottom() + 2.0, size.width(),
                                size.height()), LABEL_BAND)]
        found = []
        for box, step in tries:
            # the box moves up or down only: the obstacles in its column are the only ones it can meet
            left, right = box.left() - 2.0, box.right() + 2.0
            column = [o for o in obstacles if o.right() >= left and o.left() <= right]
            moved = 0.0
            while True:
                probe = box.adjusted(-2.0, -1.0, 2.0, 1.0)
                hit = next((o for o in column if probe.intersects(o)), None)
                if hit is None:
                    break
                dy = hit.top() - probe.bottom() - 0.5 if step < 0 else hit.bottom() - probe.top() + 0.5
                box = box.translated(0.0, dy)
                moved += abs(dy)
            found.append((moved, box))
        box = min(found, key=lambda f: f[0])[1]
        return _Spot(text, box, box.adjusted(-2.0, -1.0, 2.0, 1.0), None)
