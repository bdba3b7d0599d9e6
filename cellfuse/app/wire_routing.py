"""Where a wire runs on the canvas: NodeGraphQt's curve from an output port to an input port where that
curve passes no other node, else a route of straight runs around the nodes in its way.

A curve that slips under a node reads as if that node fed the port (the LSTM's output gate's wire to
h_new ran under tc): the route leaves the output port level, turns into a free lane above or below the
nodes between the two ends, runs along it, and turns back level just before the input port.

Plain Python on plain data: points, and boxes (left, top, right, bottom) for the nodes in the way.
"""

from __future__ import annotations

Point = tuple[float, float]
Box = tuple[float, float, float, float]  # left, top, right, bottom

LEAD = 22.0  # the level run out of a port before a route turns
CLEARANCE = 10.0  # how far a lane keeps from a node
SAMPLES = 40  # points of the curve tested against the nodes
TURN_COST = 40.0  # a turn counts as this much detour: of two lanes as near, the one with fewer turns


def curve(a: Point, b: Point, tangent_room: float) -> tuple[Point, Point, Point, Point]:
    """The cubic NodeGraphQt draws from output port `a` to input port `b` (its horizontal layout): it
    leaves and enters level, its tangents as long as the ends are apart, at most `tangent_room`."""
    tangent = min(abs(b[0] - a[0]), tangent_room)
    return a, (a[0] + tangent, a[1]), (b[0] - tangent, b[1]), b


def _cubic_points(c: tuple[Point, Point, Point, Point], n: int = SAMPLES) -> list[Point]:
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = c
    out = []
    for i in range(1, n):
        t = i / n
        u = 1.0 - t
        w0, w1, w2, w3 = u * u * u, 3 * u * u * t, 3 * u * t * t, t * t * t
        out.append((w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3, w0 * y0 + w1 * y1 + w2 * y2 + w3 * y3))
    return out


def _inside(p: Point, box: Box) -> bool:
    return box[0] < p[0] < box[2] and box[1] < p[1] < box[3]


def curve_crossings(c: tuple[Point, Point, Point, Point], boxes: list[Box]) -> list[int]:
    """The indices of the boxes the curve passes through."""
    points = _cubic_points(c)
    return [i for i, box in enumerate(boxes) if any(_inside(p, box) for p in points)]


def _segment_hits(p: Point, q: Point, box: Box) -> bool:
    """Whether the level or upright segment p-q passes through the box."""
    left, right = min(p[0], q[0]), max(p[0], q[0])
    top, bottom = min(p[1], q[1]), max(p[1], q[1])
    return left < box[2] and box[0] < right and top < box[3] and box[1] < bottom


def polyline_crossings(points: list[Point], boxes: list[Box]) -> list[int]:
    return [i for i, box in enumerate(boxes)
            if any(_segment_hits(p, q, box) for p, q in zip(points, points[1:], strict=False))]


def route(a: Point, b: Point, boxes: list[Box], tangent_room: float) -> list[Point] | None:
    """The corners of a route from output port `a` to input port `b` around `boxes` (the nodes near the
    wire, but its own two), or None where NodeGraphQt's curve crosses none of them, or no route crosses
    fewer. The route: level out of `a`, up or down to a lane, along the lane, up or down to `b`'s level
    just before it, level into `b`; the lane is the one that crosses fewest boxes, then the one nearest
    the ends with fewest turns."""
    crossed = curve_crossings(curve(a, b, tangent_room), boxes)
    if not crossed:
        return None
    xa, xb = a[0] + LEAD, b[0] - LEAD
    lanes = {a[1], b[1]}
    span = min(xa, xb), max(xa, xb)
    for box in boxes:
        if box[0] < span[1] and span[0] < box[2]:
            lanes.update((box[1] - CLEARANCE, box[3] + CLEARANCE))
    # Lanes in the order of their detour; the first that crosses nothing is the one (a crossing outweighs
    # any detour), else the one that crosses fewest.
    tries = []
    for y in lanes:
        points = _corners([a, (xa, a[1]), (xa, y), (xb, y), (xb, b[1]), b])
        tries.append((abs(y - a[1]) + abs(y - b[1]) + TURN_COST * (len(points) - 2), y, points))
    best: tuple[int, list[Point]] | None = None
    for _detour, _y, points in sorted(tries):
        hits = len(polyline_crossings(points, boxes))
        if best is None or hits < best[0]:
            best = (hits, points)
        if hits == 0:
            break
    assert best is not None
    return best[1] if best[0] < len(crossed) else None


def _corners(points: list[Point]) -> list[Point]:
    """The points without repeats and without points in the middle of a straight run."""
    out: list[Point] = []
    for p in points:
        if out and abs(out[-1][0] - p[0]) < 1e-6 and abs(out[-1][1] - p[1]) < 1e-6:
            continue
        if len(out) >= 2:
            (x0, y0), (x1, y1) = out[-2], out[-1]
            if (abs(x0 - x1) < 1e-6 and abs(x1 - p[0]) < 1e-6) or (abs(y0 - y1) < 1e-6
                                                                   and abs(y1 - p[1]) < 1e-6):
                out[-1] = p
                continue
        out.append(p)
    return out
