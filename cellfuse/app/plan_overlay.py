"""The plan drawn on the canvas: a coloured outline around the nodes of each GEMM group and of each
fused kernel, with its name, and a "hoisted" tag on the matmuls computed once before the loop.

Every launch has a colour of its own (theme.launch_colors), the one the plan panel lists it with. A
region whose nodes lie apart on the canvas is drawn as several pieces, each labelled with its part
("k0 (1/3)"), so that no piece is left unnamed.

A label is a tab in its launch's colour on the edge of its piece's outline, its text LABEL_PX pixels
high on screen at any zoom (at the default zoom at 1366x768 a label sized in the scene was 6 pixels
high). Where the zoom leaves a label no room clear of the nodes and of the labels before it, it is
shown only while its outline is hovered, or its row in the plan panel. An outline's tooltip says why
the launch begins and ends where it does (plan_reasons).

A canvas node that shows nodes of several launches (a closed group's node: a gate holds a matmul of
each GEMM and the ops of a kernel or more) is outlined by each of them side by side, its outline cut
into one slice per launch from left to right, in the plan's order: the colour of every launch shows
on it, and a launch that covers a column of groups reads as one band down their slices.

While the cell has no plan (an error, a node being wired), the last valid plan stays drawn, grey,
dashed and labelled "out of date", as the plan panel and the CUDA view keep it: it is what the user
was working from, and a node deleted since simply drops out of it.

The outlines are plain scene items behind the nodes, the labels above them; they are not nodes of the
graph and never reach the undo stack or the file.
"""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass, field

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import analyze
from . import plan_reasons, theme
from .cell_adapter import CellAdapter
from .node_types import CellNode

PAD = 8.0
NODE_CLEARANCE = 4.0  # a label keeps this far from any node, so that it never touches a title bar
Z_VALUE = -5.0
LABEL_Z = 5.0  # above the nodes: a label shown on hover may lie over one
LABEL_PX = 11  # a label's text height on screen, in pixels, at any zoom
TAB_PAD = 4.0  # pixels left and right of a label's text on its tab
LABEL_GAP = 3.0  # pixels kept between two labels
SPOT_NODES = 3  # the top (bottom, ...) nodes of a piece whose edges a label may sit on
PLACE_DELAY_MS = 60
HANG_PX = 18.0  # pixels of its edge a label hanging past the edge's end keeps
MAX_MOVED = 2  # labels moved to make room for one that finds every spot taken
GRID = 256.0  # the side of a cell of the index of boxes, in the scene, at least
GRID_PX = 64.0  # and at least this many pixels on screen: zoomed far out, a label is thousands wide
LIT_PEN = 2.2  # how much wider a region's outline is drawn while brought out
BASE_WIDTH, BASE_ALPHA = 0, 1  # keys of an outline's own pen width and fill alpha (QGraphicsItem.data)
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
    tensor_cores: bool = False  # a GEMM run on tensor cores with float32's accuracy


@dataclass(frozen=True)
class PlacedLabel:
    """A label on the canvas: which piece of which region it names, and where it is in the scene at the
    view's zoom; `shown` False: only on hover, there was no room for it."""

    region: str
    nodes: tuple[str, ...]
    text: str
    rect: QtCore.QRectF
    shown: bool
    piece: QtCore.QRectF  # the outline of the piece it names, as a bounding rectangle


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _gemm_region(i: int, g: dict, rgb: theme.RGB) -> PlanRegion:
    name = g.get("name", f"gemm{i}")
    matmuls = list(g.get("matmuls", []))
    folded = list(g.get("folded", []))
    where = "hoisted: once for all steps" if g.get("hoisted") else "every step"
    if g.get("tensor_cores"):
        where += ", on tensor cores (3xFP16)"
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


def _united(rects: list[QtCore.QRectF]) -> QtCore.QRectF:
    out = QtCore.QRectF(rects[0])
    for r in rects[1:]:
        out = out.united(r)
    return out


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


class PlanLabel(QtWidgets.QGraphicsItem):
    """A piece's name on a tab in its launch's colour, the same size on screen at any zoom (it ignores the
    view's scale): set at a corner or an edge of the piece's outline (`anchor`, in the scene), the tab
    beside it at `offset` (in pixels of the screen)."""

    def __init__(self, color: QtGui.QColor, tooltip: str) -> None:
        super().__init__()
        self.setFlag(QtWidgets.QGraphicsItem.GraphicsItemFlag.ItemIgnoresTransformations, True)
        self.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)
        self.setToolTip(tooltip)
        self.setZValue(LABEL_Z)
        self.font = QtGui.QFont()
        self.font.setPixelSize(LABEL_PX)
        self.font.setBold(True)
        self._metrics = QtGui.QFontMetricsF(self.font)
        self.color = color
        self.text = ""
        self.offset = QtCore.QPointF()
        self.shown = True  # placed clear of nodes and other labels; else shown only on hover
        self._size = QtCore.QSizeF()

    def size_of(self, text: str) -> QtCore.QSizeF:
        """The tab's size on screen, in pixels, with `text` on it."""
        return QtCore.QSizeF(self._metrics.horizontalAdvance(text) + 2 * TAB_PAD, self._metrics.height() + 2)

    def place(self, text: str, anchor: QtCore.QPointF, offset: QtCore.QPointF, shown: bool) -> None:
        self.prepareGeometryChange()
        self.text, self.offset, self.shown = text, QtCore.QPointF(offset), shown
        self._size = self.size_of(text)
        self.setPos(anchor)
        self.setVisible(shown)

    def boundingRect(self) -> QtCore.QRectF:  # noqa: N802 (Qt's name)
        return QtCore.QRectF(self.offset, self._size)

    def screen_rect(self, view: QtWidgets.QGraphicsView) -> QtCore.QRectF:
        """Where the tab is in the view's viewport, in pixels."""
        return self.deviceTransform(view.viewportTransform()).mapRect(self.boundingRect())

    def paint(self, painter: QtGui.QPainter, option, widget=None) -> None:
        rect = self.boundingRect()
        painter.save()
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        painter.setPen(QtCore.Qt.PenStyle.NoPen)
        painter.setBrush(self.color)
        painter.drawRoundedRect(rect, 3.0, 3.0)
        fill = (self.color.red(), self.color.green(), self.color.blue())
        light, dark = (240, 241, 244), (20, 20, 22)
        ink = dark if theme.contrast(dark, fill) >= theme.contrast(light, fill) else light
        painter.setPen(theme.qcolor(ink))
        painter.setFont(self.font)
        painter.drawText(rect, QtCore.Qt.AlignmentFlag.AlignCenter, self.text)
        painter.restore()


class _Outline(QtWidgets.QGraphicsPathItem):
    """A region's outline; hovering it shows its labels where they had no room."""

    def __init__(self, path: QtGui.QPainterPath, on_hover) -> None:
        super().__init__(path)
        self._on_hover = on_hover
        self.setAcceptHoverEvents(True)
        self.setAcceptedMouseButtons(QtCore.Qt.MouseButton.NoButton)

    def hoverEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._on_hover(True)
        super().hoverEnterEvent(event)

    def hoverLeaveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._on_hover(False)
        super().hoverLeaveEvent(event)


@dataclass(frozen=True)
class _Spot:
    """A place a label may take: `offset` (in pixels) from `anchor` (a point of a node's outline, in the
    scene)."""

    anchor: QtCore.QPointF
    offset: QtCore.QPointF
    hangs: bool = False  # past the end of an edge or beside the outline: a longer text leads it away

    def rect(self, size: QtCore.QSizeF, zoom: float) -> QtCore.QRectF:
        """The label's rectangle in the scene at this spot, at the view's zoom."""
        return QtCore.QRectF(self.anchor + self.offset / zoom, size / zoom)


@dataclass
class _Piece:
    """One outlined area of a region and its label."""

    region: PlanRegion
    texts: list[str]  # what its label may say, longest first
    rects: list[QtCore.QRectF]  # the outlines of the nodes in it
    nodes: tuple[str, ...]
    label: PlanLabel
    _spots: dict = field(default_factory=dict, repr=False, compare=False)  # (w, h, zoom) -> spots()

    @functools.cached_property
    def _ends(self) -> tuple[list[QtCore.QRectF], ...]:
        """Its top, bottom, right and left nodes' outlines, SPOT_NODES of each."""
        return (sorted(self.rects, key=lambda r: (r.top(), r.left()))[:SPOT_NODES],
                sorted(self.rects, key=lambda r: (-r.bottom(), r.left()))[:SPOT_NODES],
                sorted(self.rects, key=lambda r: (-r.right(), r.top()))[:SPOT_NODES],
                sorted(self.rects, key=lambda r: (r.left(), r.top()))[:SPOT_NODES])

    def spots(self, size: QtCore.QSizeF, zoom: float) -> list[_Spot]:
        """Each place the label may take, best first: on the outline's top edge above a top node, then on
        its bottom edge below a bottom node, at the edge's left end, at its right end, or hanging past
        either end (two launches side by side on a column of nodes share its edges: a label wider than its
        own slice must leave room for its neighbour's); last, beside the outline at a node's top, outside
        it, right or left."""
        w, h = size.width(), size.height()
        known = self._spots.get((w, h, zoom))
        if known is not None:  # a label tries the spots of a text again and again
            return known
        top, bottom, right, left = self._ends
        P = QtCore.QPointF  # noqa: N806
        out = []
        for edge, dy in [*((r, -h) for r in top), *((r, 0.0) for r in bottom)]:
            y = edge.top() if dy < 0 else edge.bottom()
            hang = min(HANG_PX / zoom, edge.width())  # how much of the edge a hanging label keeps
            out += [_Spot(P(edge.left(), y), P(0.0, dy)), _Spot(P(edge.right(), y), P(-w, dy)),
                    _Spot(P(edge.left() + hang, y), P(-w, dy), True),
                    _Spot(P(edge.right() - hang, y), P(0.0, dy), True)]
        out += [_Spot(r.topRight(), P(0.0, 0.0), True) for r in right]
        out += [_Spot(r.topLeft(), P(-w, 0.0), True) for r in left]
        self._spots[(w, h, zoom)] = out
        return out


_NOBODY = object()  # the owner no rectangle has


class _Boxes:
    """Rectangles of the scene in square cells of a grid `grid` wide, each of an owner, for asking quickly
    which meet a rectangle (columns alone held hundreds of a large cell's nodes each)."""

    def __init__(self, rects: list[QtCore.QRectF] = (), grid: float = GRID) -> None:
        self._grid = grid
        self._cells: dict[tuple[int, int], list[list]] = {}
        self._owned: dict[object, list[list]] = {}
        for r in rects:
            self.add(r)

    def add(self, r: QtCore.QRectF, owner: object = None) -> None:
        entry = [r.left(), r.top(), r.right(), r.bottom(), owner, True]
        grid = self._grid
        self._owned.setdefault(owner, []).append(entry)
        cells = self._cells
        rows = range(int(entry[1] // grid), int(entry[3] // grid) + 1)
        for kx in range(int(entry[0] // grid), int(entry[2] // grid) + 1):
            for ky in rows:
                cells.setdefault((kx, ky), []).append(entry)

    def remove(self, owner: object) -> None:
        for entry in self._owned.pop(owner, []):
            entry[5] = False

    def owners(self, r: QtCore.QRectF, skip: object = _NOBODY) -> set:
        """The owners of the rectangles that meet `r`, but `skip`."""
        left, top, right, bottom = r.left(), r.top(), r.right(), r.bottom()
        cells, grid = self._cells, self._grid
        rows = range(int(top // grid), int(bottom // grid) + 1)
        out = set()
        for kx in range(int(left // grid), int(right // grid) + 1):
            for ky in rows:
                for e in cells.get((kx, ky), ()):
                    if e[0] < right and left < e[2] and e[1] < bottom and top < e[3] and e[5] \
                            and e[4] is not skip:
                        out.add(e[4])
        return out

    def meets(self, r: QtCore.QRectF, skip: object = _NOBODY) -> bool:
        left, top, right, bottom = r.left(), r.top(), r.right(), r.bottom()
        cells, grid = self._cells, self._grid
        rows = range(int(top // grid), int(bottom // grid) + 1)
        for kx in range(int(left // grid), int(right // grid) + 1):
            for ky in rows:
                for e in cells.get((kx, ky), ()):
                    if e[0] < right and left < e[2] and e[1] < bottom and top < e[3] and e[5] \
                            and e[4] is not skip:
                        return True
        return False


class PlanOverlay:
    """Draws plan regions in the adapter's canvas scene."""

    def __init__(self, adapter: CellAdapter) -> None:
        self._adapter = adapter
        self._regions: list[PlanRegion] = []
        self._reasons: dict[str, list[str]] = {}
        self._items: list[QtWidgets.QGraphicsItem] = []
        self._outlines: dict[str, _Outline] = {}
        self._pieces: list[_Piece] = []
        self._node_rects: list[QtCore.QRectF] = []  # the nodes shown, a label's clearance around each
        self._nodes = _Boxes()  # those, while the labels are placed (place_labels)
        self._zoom = 0.0  # the zoom the labels were placed for
        self._visible = True
        self._stale = False
        self._tagged: set[str] = set()
        self._lit: str | None = None  # the region the plan panel points at
        self._hovered: str | None = None  # the region under the cursor
        self._placed = _Boxes()  # the labels placed, while they are placed (place_labels)
        self._where: dict[int, tuple[str, _Spot]] = {}  # a piece's index -> its label's text and spot
        # A region's node outlines -> its pieces and outline, as drawn by the last refresh (_shapes_of)
        self._shape_cache: dict[tuple, tuple[list[list[int]], QtGui.QPainterPath]] = {}
        self._shapes_kept: dict[tuple, tuple[list[list[int]], QtGui.QPainterPath]] = {}
        self.viewer = adapter.graph.viewer()
        # Labels are placed again a moment after the view changes, once for a run of wheel steps.
        self._place_timer = QtCore.QTimer(self.viewer)  # dies with the canvas
        self._place_timer.setSingleShot(True)
        self._place_timer.setInterval(PLACE_DELAY_MS)
        self._place_timer.timeout.connect(self._on_view_settled)
        self._placed_for = QtCore.QRectF()  # the part of the scene the labels were placed for
        self.viewer.view_changed.connect(self._place_timer.start)

    @property
    def regions(self) -> list[PlanRegion]:
        return list(self._regions)

    @property
    def labels(self) -> list[PlacedLabel]:
        zoom = self._view_zoom()
        return [PlacedLabel(p.region.name, p.nodes, p.label.text,
                            QtCore.QRectF(p.label.pos() + p.label.offset / zoom,
                                          p.label.boundingRect().size() / zoom),
                            p.label.shown, _united(p.rects)) for p in self._pieces]

    @property
    def placed_zoom(self) -> float:
        """The view's scale the labels were last placed for."""
        return self._zoom

    def label_items(self) -> list[PlanLabel]:
        return [p.label for p in self._pieces]

    def outline_of(self, region: str) -> QtWidgets.QGraphicsPathItem | None:
        return self._outlines.get(region)

    def set_visible(self, visible: bool) -> None:
        self._visible = visible
        self.refresh()

    @property
    def out_of_date(self) -> bool:
        return self._stale and bool(self._regions)

    def show_summary(self, summary: dict | None) -> None:
        self._regions = regions_of(summary) if summary else []
        self._reasons = {}
        if summary:
            cell = self._adapter.cell
            shapes: dict = {}

            def cell_shapes() -> dict:  # validated once, where a reason needs a width
                if not shapes:
                    shapes.update(analyze(cell).shapes)
                return shapes

            self._reasons = plan_reasons.reasons(summary, cell, cell_shapes)
        self._stale = False
        self.refresh()

    def mark_out_of_date(self) -> None:
        """Keeps the last plan drawn, marked as out of date, while the cell has none."""
        self._stale = True
        self.refresh()

    def clear(self) -> None:
        self.show_summary(None)

    def highlight(self, region: str | None) -> None:
        """Brings out one region's outline and shows its labels (the plan panel's row under the cursor);
        None: none."""
        if region != self._lit:
            old, self._lit = self._lit, region
            self._emphasise(old)
            self._emphasise(region)

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
        self._node_rects = [n.view.sceneBoundingRect().adjusted(-NODE_CLEARANCE, -NODE_CLEARANCE,
                                                                NODE_CLEARANCE, NODE_CLEARANCE)
                            for n in self._adapter.graph.all_nodes() if n.view.isVisible()]
        self._shapes_kept = {}
        for region, rects in zip(self._regions, region_rects, strict=True):
            if rects:
                self._draw_region(region, rects)
        self._shape_cache, self._shapes_kept = self._shapes_kept, {}
        self.place_labels()

    # -- labels ---------------------------------------------------------------------------------------
    def _on_view_settled(self) -> None:
        if self._pieces and (self._view_zoom() != self._zoom
                             or not self._placed_for.contains(self.viewer.visible_scene_rect())):
            self.place_labels()

    def _view_zoom(self) -> float:
        return max(self.viewer.transform().m11(), 1e-3)

    def place_labels(self) -> None:
        """Places every piece's label for the view's zoom at the first of its spots (see _Piece.spots)
        that covers no node and no other label: first every label with its name alone (where a label
        finds every spot taken by labels, one placed before it moves to another spot of its own if it
        can), then each with the longest text that still fits. Where no spot is free, the label is shown
        only while its outline is hovered, or its row in the plan panel."""
        self._place_timer.stop()
        self._zoom = self._view_zoom()
        # The pieces in and around the view: a cell of a thousand launches has labels far out of sight.
        seen = self.viewer.visible_scene_rect()
        self._placed_for = seen.adjusted(-seen.width(), -seen.height(), seen.width(), seen.height())
        grid = max(GRID, GRID_PX / self._zoom)  # a label's size in the scene goes as 1 / zoom
        self._nodes = _Boxes(self._node_rects, grid)
        self._placed = _Boxes(grid=grid)
        self._where = {}
        for i, piece in enumerate(self._pieces):
            if self._placed_for.intersects(_united(piece.rects)) and not self._settle(i, piece.texts[-1]):
                self._make_room(i, piece.texts[-1])
        for i in list(self._where):
            spot = self._where[i][1]
            for text in self._pieces[i].texts[:-1] if not spot.hangs else ():
                if self._settle(i, text, at=spot.anchor):
                    break
        for i, piece in enumerate(self._pieces):
            if i in self._where:
                text, spot = self._where[i]
                piece.label.place(text, spot.anchor, spot.offset, True)
            else:
                spot = piece.spots(piece.label.size_of(piece.texts[0]), self._zoom)[0]
                piece.label.place(piece.texts[0], spot.anchor, spot.offset, False)
        for region in {self._lit, self._hovered} - {None}:
            self._emphasise(region)

    def _spaced(self, rect: QtCore.QRectF) -> QtCore.QRectF:
        gap = LABEL_GAP / self._zoom
        return rect.adjusted(-gap, -gap, gap, gap)

    def _settle(self, i: int, text: str, at: QtCore.QPointF | None = None,
                avoid: QtCore.QRectF | None = None) -> bool:
        """Puts label `i` with `text` at its first spot that is free (and clear of `avoid`), of those at
        anchor `at` only where given (a label given a longer text stays where it is). False where none
        is."""
        piece = self._pieces[i]
        size = piece.label.size_of(text)
        spots = [s for s in piece.spots(size, self._zoom) if at is None or (s.anchor == at and not s.hangs)]
        for spot in spots:
            rect = spot.rect(size, self._zoom)
            if self._nodes.meets(rect) or self._placed.meets(rect, skip=i):
                continue
            if avoid is not None and rect.intersects(avoid):
                continue
            self._placed.remove(i)
            self._placed.add(self._spaced(rect), i)
            self._where[i] = (text, spot)
            return True
        return False

    def _make_room(self, i: int, text: str) -> bool:
        """Label `i` at a spot that only labels placed before it block, each of them moved to another spot
        of its own; False where no spot can be freed so."""
        piece = self._pieces[i]
        size = piece.label.size_of(text)
        for spot in piece.spots(size, self._zoom):
            rect = spot.rect(size, self._zoom)
            if spot.hangs or self._nodes.meets(rect):
                continue  # (a label made room for sits flush on its edge)
            blocking = self._placed.owners(rect, skip=i)
            if len(blocking) > MAX_MOVED:
                continue
            kept = {j: self._where[j] for j in blocking}
            if all(self._settle(j, self._where[j][0], avoid=self._spaced(rect)) for j in blocking):
                if not self._placed.meets(rect, skip=i):
                    self._placed.add(self._spaced(rect), i)
                    self._where[i] = (text, spot)
                    return True
            for j, (old_text, old_spot) in kept.items():  # put them back
                self._placed.remove(j)
                self._placed.add(self._spaced(old_spot.rect(self._pieces[j].label.size_of(old_text),
                                                            self._zoom)), j)
                self._where[j] = (old_text, old_spot)
        return False

    def _emphasise(self, region: str | None) -> None:
        """The look of a region's outline and labels: brought out while the plan panel points at it or the
        cursor is on it, as drawn otherwise."""
        if region is None:
            return
        on = region in (self._lit, self._hovered)
        for piece in self._pieces:
            if piece.region.name == region:
                piece.label.setVisible(on or piece.label.shown)
        item = self._outlines.get(region)
        if item is not None:
            pen = item.pen()
            base = item.data(BASE_WIDTH)
            pen.setWidthF(base * LIT_PEN if on else base)
            item.setPen(pen)
            fill = item.brush().color()
            fill.setAlpha(item.data(BASE_ALPHA) * (3 if on else 1))
            item.setBrush(fill)
            item.setZValue(Z_VALUE + (0.4 if on else 0.0))

    def _hover(self, region: str, on: bool) -> None:
        old, self._hovered = self._hovered, region if on else None
        self._emphasise(old)
        self._emphasise(self._hovered)

    # -- drawing ----------------------------------------------------------------------------------------
    def _color(self, region: PlanRegion) -> QtGui.QColor:
        return theme.qcolor(STALE_RGB if self._stale else region.rgb)

    def _remove_items(self) -> None:
        scene = self.viewer.scene()
        for item in self._items:
            scene.removeItem(item)
        self._items.clear()
        self._outlines.clear()
        self._pieces.clear()
        self._hovered = None
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

    def _shapes_of(self, shapes: list[QtCore.QRectF]) -> tuple[list[list[int]], QtGui.QPainterPath]:
        """The pieces and the outline of a region's node outlines, kept from the refresh before where
        they are the same (an edit moves a node or two: most regions are as they were)."""
        key = tuple(_box(r) for r in shapes)
        known = self._shape_cache.get(key)
        if known is None:
            known = (pieces(shapes), outline([*shapes, *bridges(shapes)]))
        self._shapes_kept[key] = known
        return known

    def _draw_region(self, region: PlanRegion, rects: list[tuple[QtCore.QRectF, str]]) -> None:
        color = self._color(region)
        shapes = [r for r, _ in rects]
        parts, path = self._shapes_of(shapes)
        tooltip = self._tooltip(region)
        for part, members in enumerate(parts, start=1):
            texts = label_texts(region, part, len(parts))
            if self._stale:
                texts = [f"{STALE_TAG} · {text}" for text in texts]
            label = PlanLabel(color, tooltip)
            self.viewer.scene().addItem(label)
            self._items.append(label)
            self._pieces.append(_Piece(region, texts, [shapes[i] for i in members],
                                       tuple(rects[i][1] for i in members), label))
        self._add_outline(region, color, path, tooltip)

    def _tooltip(self, region: PlanRegion) -> str:
        """The region's label and, below it, why it begins and ends where it does (plan_reasons)."""
        head = html.escape(region.label)
        if self._stale:
            head = f"Out of date: the last valid plan. {head}"
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in self._reasons.get(region.name, []))
        return f"<qt><b>{head}</b>" + (f"<ul style='margin:0'>{lines}</ul>" if lines else "") + "</qt>"

    def _add_outline(self, region: PlanRegion, color: QtGui.QColor, path: QtGui.QPainterPath,
                     tooltip: str) -> None:
        item = _Outline(path, lambda on: self._hover(region.name, on))
        fill = QtGui.QColor(color)
        alpha = 14 if self._stale else 30 if region.kind == "fused" else 44
        fill.setAlpha(alpha)
        item.setBrush(fill)
        width = 2.0 if region.kind == "gemm" else 1.6
        pen = QtGui.QPen(color, width)
        style = QtCore.Qt.PenStyle
        pen.setStyle(style.DotLine if self._stale else style.DashLine if region.kind == "gemm"
                     else style.SolidLine)
        pen.setCosmetic(True)
        pen.setJoinStyle(QtCore.Qt.PenJoinStyle.RoundJoin)
        item.setPen(pen)
        item.setData(BASE_WIDTH, width)
        item.setData(BASE_ALPHA, alpha)
        item.setZValue(Z_VALUE)
        item.setToolTip(tooltip)
        self.viewer.scene().addItem(item)
        self._items.append(item)
        self._outlines[region.name] = item
