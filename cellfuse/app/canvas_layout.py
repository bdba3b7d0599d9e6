"""A layered left-to-right layout for the canvas: data flows from the sources on the left to the
updates and the output on the right, and each column is ordered to keep wires short and straight.

Plain Python on plain data: node keys, edges (source, consumer) and node sizes in, top-left
positions out.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

Key = Hashable

COLUMN_GAP = 80.0
ROW_GAP = 26.0
SWEEPS = 6


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


def layered_layout(keys: Iterable[Key], edges: Iterable[tuple[Key, Key]],
                   sizes: dict[Key, tuple[float, float]], sinks: Iterable[Key] = (),
                   origin: tuple[float, float] = (0.0, 0.0)) -> dict[Key, tuple[float, float]]:
    """Top-left positions for every key. `sinks` (updates, the output) go to the last column."""
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
    layer = _layers(keys, preds, succs, sink_set)
    n_layers = max(layer.values()) + 1
    columns: list[list[Key]] = [[] for _ in range(n_layers)]
    for k in keys:
        columns[layer[k]].append(k)

    def height(k: Key) -> float:
        return sizes.get(k, (160.0, 70.0))[1]

    y: dict[Key, float] = {}

    def stack(col: list[Key], wanted: dict[Key, float] | None = None) -> None:
        """Places a column top to bottom, each node as near its wanted centre as order allows."""
        top = 0.0
        for k in col:
            centre = wanted.get(k) if wanted else None
            t = top if centre is None else max(top, centre - height(k) / 2.0)
            y[k] = t
            top = t + height(k) + ROW_GAP

    for col in columns:
        stack(col)

    def centre(k: Key) -> float:
        return y[k] + height(k) / 2.0

    def barycentre(k: Key, neighbours: list[Key]) -> float | None:
        if not neighbours:
            return None
        return sum(centre(n) for n in neighbours) / len(neighbours)

    for sweep in range(SWEEPS):
        forward = sweep % 2 == 0
        order = range(n_layers) if forward else range(n_layers - 1, -1, -1)
        for i in order:
            col = columns[i]
            near = {k: barycentre(k, preds[k] if forward else succs[k]) for k in col}
            fallback = {k: centre(k) for k in col}
            col.sort(key=lambda k: near[k] if near[k] is not None else fallback[k])
            stack(col, {k: v for k, v in near.items() if v is not None})

    # Shift everything so the top is at the origin; columns as wide as their widest node.
    widths = [max((sizes.get(k, (160.0, 70.0))[0] for k in col), default=160.0) for col in columns]
    xs: list[float] = []
    x = origin[0]
    for w in widths:
        xs.append(x)
        x += w + COLUMN_GAP
    top = min(y.values())
    return {k: (xs[layer[k]], origin[1] + y[k] - top) for k in keys}
