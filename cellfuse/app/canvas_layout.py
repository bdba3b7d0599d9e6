"""A layered left-to-right layout for the canvas: data flows from the sources on the left to the
updates and the output on the right, and each column is ordered to keep wires short and straight.

Nodes may come in groups (the matmuls of one GEMM, the ops of one fused kernel): within a column, a
group's nodes are stacked together, one under the other, so that the outline drawn around the group
is one area and no other node sits between its members.

A wire that skips columns keeps a lane in each column it crosses: a thin stand-in for it is ordered and
stacked with the column's nodes (Sugiyama's dummy nodes), so that no node is put where the wire runs
and the wire runs straight where its ends let it.

Plain Python on plain data: node keys, edges (source, consumer) and node sizes in, top-left
positions out.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

Key = Hashable

COLUMN_GAP = 80.0
ROW_GAP = 26.0
SWEEPS = 6
LANE = 4.0  # the height of a lane kept for a wire in a column it crosses (a ROW_GAP either side)


class _Lane(tuple):
    """A wire's stand-in in a column it crosses: (source, consumer, column)."""


def _layers(keys: list[Key], preds: dict[Key, list[Key]], succs: dict[Key, list[Key]],
            sinks: set[Key]) -> dict[Key, int]:
    layer: dict[Key, int] = {}
    visiting: set[Key] = set()

    def depth(k: Key) -> int:
        if k in layer:
            return layer[k]
        if k in visiting:  # a cycle: the edge that closes it does not push the layer
            return 0
        visiting.add(k)
        d = 1 + max((depth(p) for p in preds[k]), default=-1) if preds[k] else 0
        visiting.discard(k)
        layer[k] = d
        return d

    for k in keys:
        depth(k)
    # A source sits one column left of its first consumer, not far left at column 0.
    for k in keys:
        if not preds[k] and succs[k] and k not in sinks:
            layer[k] = max(0, min(layer[s] for s in succs[k]) - 1)
    if sinks:
        last = max((layer[k] for k in keys if k not in sinks), default=-1) + 1
        for k in sinks:
            layer[k] = max(last, layer[k])
    return layer


def _runs(col: list[Key], group_of: dict[Key, int]) -> list[list[Key]]:
    """The column cut into what stays together: the members of one group, or a lone node; in the
    order each first appears."""
    runs: dict[tuple[str, Key], list[Key]] = {}
    for k in col:
        runs.setdefault(("group", group_of[k]) if k in group_of else ("node", k), []).append(k)
    return list(runs.values())


def _order(col: list[Key], group_of: dict[Key, int], near: dict[Key, float]) -> None:
    """Sorts a column by where its nodes want to be, a group by where its members want to be on
    average, keeping each group's members next to each other."""
    runs = _runs(col, group_of)
    for run in runs:
        run.sort(key=lambda k: near[k])
    runs.sort(key=lambda run: sum(near[k] for k in run) / len(run))
    col[:] = [k for run in runs for k in run]


def layered_layout(keys: Iterable[Key], edges: Iterable[tuple[Key, Key]],
                   sizes: dict[Key, tuple[float, float]], sinks: Iterable[Key] = (),
                   origin: tuple[float, float] = (0.0, 0.0),
                   groups: Iterable[Iterable[Key]] = ()) -> dict[Key, tuple[float, float]]:
    """Top-left positions for every key. `sinks` (updates, the output) go to the last column; the
    keys of each of `groups` (disjoint; a key of a second group counts in its first) stay together
    in their column."""
    keys = list(dict.fromkeys(keys))
    sink_set = set(sinks) & set(keys)
    preds: dict[Key, list[Key]] = {k: [] for k in keys}
    succs: dict[Key, list[Key]] = {k: [] for k in keys}
    for a, b in edges:
        if a in preds and b in preds and a != b:
            preds[b].append(a)
            succs[a].append(b)
    if not keys:
        return {}
    group_of: dict[Key, int] = {}
    for i, group in enumerate(groups):
        for k in group:
            if k in preds:
                group_of.setdefault(k, i)
    layer = _layers(keys, preds, succs, sink_set)
    real = list(keys)
    for a, b in [(u, v) for u in real for v in succs[u] if layer[v] - layer[u] > 1]:
        chain = [a, *(_Lane((a, b, i)) for i in range(layer[a] + 1, layer[b])), b]
        succs[a].remove(b)
        preds[b].remove(a)
        for u, v in zip(chain, chain[1:], strict=False):
            if isinstance(v, _Lane):
                layer[v] = v[2]
                keys.append(v)
                preds[v], succs[v] = [], []
            succs[u].append(v)
            preds[v].append(u)
    n_layers = max(layer.values()) + 1
    columns: list[list[Key]] = [[] for _ in range(n_layers)]
    for k in keys:
        columns[layer[k]].append(k)

    def height(k: Key) -> float:
        return LANE if isinstance(k, _Lane) else sizes.get(k, (160.0, 70.0))[1]

    y: dict[Key, float] = {}

    def stack(col: list[Key], wanted: dict[Key, float] | None = None) -> None:
        """Places a column top to bottom, each group as one block (its members a row gap apart) and
        each block as near its members' wanted centre as order allows."""
        top = 0.0
        for run in _runs(col, group_of):
            extent = sum(height(k) for k in run) + ROW_GAP * (len(run) - 1)
            centres = [wanted[k] for k in run if wanted and k in wanted]
            t = top if not centres else max(top, sum(centres) / len(centres) - extent / 2.0)
            for k in run:
                y[k] = t
                t += height(k) + ROW_GAP
            top = t

    for col in columns:
        _order(col, group_of, {k: float(i) for i, k in enumerate(col)})
        stack(col)

    def centre(k: Key) -> float:
        return y[k] + height(k) / 2.0

    def barycentre(neighbours: list[Key]) -> float | None:
        if not neighbours:
            return None
        return sum(centre(n) for n in neighbours) / len(neighbours)

    for sweep in range(SWEEPS):
        forward = sweep % 2 == 0
        order = range(n_layers) if forward else range(n_layers - 1, -1, -1)
        for i in order:
            col = columns[i]
            near = {k: barycentre(preds[k] if forward else succs[k]) for k in col}
            _order(col, group_of, {k: centre(k) if v is None else v for k, v in near.items()})
            stack(col, {k: v for k, v in near.items() if v is not None})

    # Shift everything so the top is at the origin; columns as wide as their widest node.
    widths = [max((sizes.get(k, (160.0, 70.0))[0] for k in col if not isinstance(k, _Lane)), default=160.0)
              for col in columns]
    xs: list[float] = []
    x = origin[0]
    for w in widths:
        xs.append(x)
        x += w + COLUMN_GAP
    top = min(y[k] for k in real)
    return {k: (xs[layer[k]], origin[1] + y[k] - top) for k in real}


Rect = tuple[float, float, float, float]  # left, top, width, height


def make_room(grown: dict[Key, tuple[Rect, tuple[float, float]]], others: dict[Key, Rect]
              ) -> dict[Key, tuple[float, float]]:
    """Top-left corners for boxes that grow in place (a group's node opened into its members: `grown`
    maps it to its old rectangle and its new size, its top left kept) and for the `others` around
    them, so that nothing overlaps and the layout stays as it was where it can: first every box right
    of a column of grown boxes moves right by as much as that column grew wider, then, top to bottom,
    a box that overlaps one above it moves down below it."""
    # Columns of grown boxes: those whose old rectangles share some x.
    columns: list[list[float]] = []  # [left, old right, new right]
    for (x, _y, w, _h), (new_w, _new_h) in sorted(grown.values(), key=lambda g: g[0][0]):
        if columns and x < columns[-1][1]:
            columns[-1][1] = max(columns[-1][1], x + w)
            columns[-1][2] = max(columns[-1][2], x + new_w)
        else:
            columns.append([x, x + w, x + new_w])

    def shift(left: float) -> float:
        return sum(max(0.0, new_right - right) for _l, right, new_right in columns if left >= right)

    boxes: dict[Key, Rect] = {k: (x + shift(x), y, w, h) for k, (x, y, w, h) in others.items()}
    boxes.update({k: (x + shift(x), y, new_w, new_h)
                  for k, ((x, y, _w, _h), (new_w, new_h)) in grown.items()})

    def overlap(a: Rect, b: Rect) -> bool:
        return (a[0] < b[0] + b[2] and b[0] < a[0] + a[2]
                and a[1] - ROW_GAP / 2 < b[1] + b[3] and b[1] - ROW_GAP / 2 < a[1] + a[3])

    placed: list[Rect] = []
    out: dict[Key, tuple[float, float]] = {}
    for k in sorted(boxes, key=lambda k: (boxes[k][1], boxes[k][0])):
        x, y, w, h = boxes[k]
        while hits := [p for p in placed if overlap((x, y, w, h), p)]:
            y = max(p[1] + p[3] for p in hits) + ROW_GAP
        placed.append((x, y, w, h))
        out[k] = (x, y)
    return out


FREE_STEP = (40.0, 30.0)  # how far apart, in x and y, the places tried for a new node are
FREE_REACH = 30  # steps tried in each direction before giving up on a free place near the one asked for
# The steps, nearest first; sorted once, not on each new node.
_FREE_STEPS = sorted(((i, j) for i in range(-FREE_REACH, FREE_REACH + 1)
                      for j in range(-FREE_REACH, FREE_REACH + 1)),
                     key=lambda s: (s[0] * FREE_STEP[0]) ** 2 + (s[1] * FREE_STEP[1]) ** 2)


def nearest_free(box: Rect, taken: list[Rect], gap: float = 20.0, within: Rect | None = None
                 ) -> tuple[float, float]:
    """The top-left corner nearest to `box`'s where a box of its size overlaps none of `taken`, `gap`
    apart: a node added where the user asked (the Tab search at the cursor, a drop) lands beside the
    nodes there rather than on them. The box's own corner where it is free already. With `within` (the
    view), the places inside it come first, nearest first, so that a new node does not land out of sight
    while there is room in sight."""
    x, y, w, h = box
    sx, sy = FREE_STEP
    # Each row of places tried is checked only against the nodes that can meet it, so that a crowded
    # stretch of a large cell costs a few nodes a place, not all of them.
    rows: dict[int, list[Rect]] = {}
    for t in taken:
        if abs(t[0] - x) < FREE_REACH * sx + w + t[2] + gap:
            first = max(-FREE_REACH, math.floor((t[1] - h - gap - y) / sy))
            last = min(FREE_REACH, math.ceil((t[1] + t[3] + gap - y) / sy))
            for j in range(first, last + 1):
                rows.setdefault(j, []).append(t)

    def free(cx: float, cy: float, near: list[Rect]) -> bool:
        return all(cx + w + gap <= tx or tx + tw + gap <= cx or cy + h + gap <= ty or ty + th + gap <= cy
                   for tx, ty, tw, th in near)

    steps = _FREE_STEPS
    if within is not None:
        vx, vy, vw, vh = within

        def outside(step: tuple[int, int]) -> bool:
            cx, cy = x + step[0] * sx, y + step[1] * sy
            return cx < vx or cy < vy or cx + w > vx + vw or cy + h > vy + vh

        steps = sorted(steps, key=outside)  # stable: nearest first on either side
    for i, j in steps:
        if free(x + i * sx, y + j * sy, rows.get(j, [])):
            return x + i * sx, y + j * sy
    # Crowded all round: below every node of its column (all of them, not only those near), where it
    # meets none. The column has a node, or the box's own corner would have been free.
    column = [t for t in taken if x < t[0] + t[2] + gap and t[0] < x + w + gap]
    return x, max(t[1] + t[3] for t in column) + gap
