"""The plain-data parts of the editor: the canvas layout and clipboard fragments."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cellfuse.app.canvas_layout import layered_layout, nearest_free
from cellfuse.app.fragments import fragment_from_text, fragment_of, fragment_to_text, plan_paste
from cellfuse.graph_model import load_template, template_names


@st.composite
def dags(draw):
    n = draw(st.integers(1, 25))
    edges = []
    for b in range(1, n):
        for a in draw(st.lists(st.integers(0, b - 1), max_size=3, unique=True)):
            edges.append((a, b))
    sizes = {k: (draw(st.floats(60, 220)), draw(st.floats(40, 120))) for k in range(n)}
    # Sinks (update and output nodes) only have inputs.
    sinks = [k for k in draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True))
             if all(a != k for a, _ in edges)]
    return list(range(n)), edges, sizes, sinks


@settings(max_examples=60, deadline=None)
@given(dags())
def test_layout_places_every_node_without_overlap_and_left_to_right(graph):
    keys, edges, sizes, sinks = graph
    pos = layered_layout(keys, edges, sizes, sinks)
    assert set(pos) == set(keys)
    rects = [(pos[k][0], pos[k][1], sizes[k][0], sizes[k][1]) for k in keys]
    for i, (x, y, w, h) in enumerate(rects):
        for x2, y2, w2, h2 in rects[i + 1:]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, "nodes overlap"
    for a, b in edges:
        assert pos[a][0] < pos[b][0]
    if sinks:
        last = max(p[0] for p in pos.values())
        assert all(pos[s][0] == last for s in sinks)


def test_layout_survives_cycles():
    pos = layered_layout(["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "a")], {})
    assert set(pos) == {"a", "b", "c"}


def test_fragment_round_trip_renames_clashes_and_drops_outside_links():
    cell = load_template("lstm")
    frag = fragment_of(cell, ["h", "hi", "U_i", "c", "fc"], {"h": [10.0, 20.0]})
    again = fragment_from_text(fragment_to_text(frag))
    assert again == frag
    plan = plan_paste(cell, again)
    by_id = {p.id: p for p in plan.nodes}
    assert set(by_id) == {"h1", "hi1", "U_i1", "c1", "fc1"}
    assert by_id["hi1"].args == ["h1", "U_i1"]
    assert by_id["fc1"].args == [None, "c1"]  # f was not copied; its port stays empty
    assert plan.states == ["h1", "c1"] and plan.updates == {}
    assert plan.update_pos == {"h1": (50.0, 60.0)}


def test_fragment_of_a_whole_template_pastes_into_an_empty_cell_unchanged():
    from cellfuse.graph_model import Cell

    for name in template_names():
        cell = load_template(name)
        plan = plan_paste(Cell(name="empty"), fragment_of(cell, [n.id for n in cell.nodes]))
        assert [p.id for p in plan.nodes] == [n.id for n in cell.nodes]
        assert plan.updates == cell.updates


def test_text_that_is_not_a_fragment():
    for text in ["", "hello", "[1, 2]", '{"format": "cellfuse.cell/1", "nodes": []}', "{" * 5000]:
        assert fragment_from_text(text) is None


@settings(max_examples=60, deadline=None)
@given(dags(), st.data())
def test_layout_keeps_each_group_together_in_its_column_without_overlap(graph, data):
    keys, edges, sizes, sinks = graph
    groups = [data.draw(st.lists(st.sampled_from(keys), max_size=5, unique=True)) for _ in range(3)]
    pos = layered_layout(keys, edges, sizes, sinks, groups=groups)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            (xa, ya), (xb, yb) = pos[a], pos[b]
            if xa == xb:
                assert ya + sizes[a][1] <= yb or yb + sizes[b][1] <= ya, "nodes overlap"
    owner: dict[int, int] = {}
    for g, group in enumerate(groups):
        for k in group:
            owner.setdefault(k, g)
    for g in set(owner.values()):
        members = [k for k in keys if owner.get(k) == g]
        for x in {pos[k][0] for k in members}:
            ys = [pos[k][1] for k in members if pos[k][0] == x]
            inside = [k for k in keys if pos[k][0] == x and owner.get(k) != g
                      and min(ys) <= pos[k][1] <= max(ys)]
            assert not inside, "a node between the members of a group"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-500, 500), st.floats(-500, 500)), max_size=30),
       st.floats(-300, 300), st.floats(-300, 300))
def test_a_node_asked_for_where_nodes_are_goes_to_the_nearest_free_place(corners, x, y):
    taken = [(cx, cy, 160.0, 70.0) for cx, cy in corners]

    def clear(px: float, py: float) -> bool:  # 10 apart from every node taken
        return all(px + 170.0 <= tx or tx + 170.0 <= px or py + 90.0 <= ty or ty + 80.0 <= py
                   for tx, ty, _w, _h in taken)

    fx, fy = nearest_free((x, y, 160.0, 80.0), taken, gap=10.0)
    assert clear(fx, fy)
    if clear(x, y):
        assert (fx, fy) == (x, y)  # free already: where it was asked for


def test_a_node_asked_for_in_a_crowd_wider_than_the_search_lands_clear_of_every_node():
    # Rows of nodes too close for a node between them, far past the places tried around the one asked
    # for: it goes below the crowd, clear of the nodes beyond the reach of the search too.
    taken = [(i * 240.0, j * 96.0, 160.0, 70.0) for i in range(36) for j in range(36)]
    fx, fy = nearest_free((18 * 240.0 + 10.0, 18 * 96.0 + 10.0, 160.0, 80.0), taken)
    assert all(fx + 180.0 <= tx or tx + 180.0 <= fx or fy + 100.0 <= ty or ty + 90.0 <= fy
               for tx, ty, _w, _h in taken)


def test_the_nodes_a_formula_adds_are_named_after_what_they_compute():
    from cellfuse.app.formula_names import name_nodes
    from cellfuse.graph_model import plan_formula

    cell = load_template("lstm")
    edit = name_nodes(plan_formula(cell, "z = relu(x @ W_z + b_z) * sigmoid(h @ U_z)"), cell)
    assert [n.id for n in edit.nodes] == ["W_z", "xW_z", "b_z", "xW_z_plus_b_z", "z_relu", "U_z", "hU_z",
                                          "sigmoid_hU_z", "z"]
    assert edit.nodes[-1].args == ["z_relu", "sigmoid_hU_z"]  # the wires follow the names
    edit = name_nodes(plan_formula(cell, "h' = o * tanh(c_new)"), cell)
    assert [n.id for n in edit.nodes] == ["tanh_c_new", "h_new1"] and edit.updates == {"h": "h_new1"}
    cell.nodes.extend(name_nodes(plan_formula(cell, "p = o * tanh(c_new)"), cell).nodes)
    again = name_nodes(plan_formula(cell, "r = o * tanh(c_new)"), cell)
    assert again.nodes[0].id == "tanh_c_new2"  # a name the cell has already: numbered
