"""Property tests: whatever text the loader is given, the only exception it raises is CellError, and
validation never raises at all. Inputs are random JSON, random cell-like objects, and the templates
mutated (nodes dropped, duplicated, renamed; ops, args, shapes and field types changed; text cut)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from cellfuse.graph_model import (
    FORMAT,
    OPS,
    CellError,
    analyze,
    auto_layout,
    cell_from_text,
    cell_to_text,
    init_params,
    load_template,
    run_reference,
    template_names,
)
from cellfuse.graph_model.templates import template_text

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300, max_value=10**310)
           | st.floats() | st.text(max_size=6))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
ids = (st.sampled_from(["x", "h", "c", "W", "U", "b", "a", "k", "h_new", "1x", "", "a b"])
       | st.text(max_size=4))
ops = st.sampled_from([*OPS, "nope", "", "Add"])
dims = st.sampled_from(["input", "hidden", "batch", "B"]) | scalars
# Cell-like objects of the right types, so that most of them get past the loader into validation;
# wrong types are what the random JSON and the template mutations bring.
near_ids = st.sampled_from(["x", "h", "c", "W", "U", "b", "a", "k", "h_new", "1x"])
nodes = st.fixed_dictionaries(
    {"id": near_ids, "op": st.sampled_from([*OPS, "nope"])},
    optional={
        "args": st.lists(near_ids, max_size=3),
        "shape": st.lists(st.sampled_from(["input", "hidden", "batch"]), max_size=3),
        "value": st.floats() | st.integers(-3, 3),
        "x-editor": json_values,
    },
)
cell_like = st.fixed_dictionaries(
    {"format": st.just(FORMAT), "nodes": st.lists(nodes, max_size=12)},
    optional={
        "name": st.text(max_size=5),
        "sizes": st.fixed_dictionaries({}, optional={"input": st.integers(1, 5),
                                                     "hidden": st.integers(1, 5)}),
        "updates": st.dictionaries(near_ids, near_ids, max_size=3),
        "output": near_ids,
        "layout": st.dictionaries(near_ids, st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=2),
                                  max_size=3),
        "x-note": json_values,
    },
)


def note(what: str) -> None:
    if currently_in_test_context():
        event(what)


def check_loader(text: str) -> None:
    """The property itself: CellError or a cell that every other entry point accepts without raising."""
    try:
        cell = cell_from_text(text, "fuzz")
    except CellError as e:
        assert str(e).startswith("fuzz")
        note("refused by the loader")
        return
    info = analyze(cell)  # never raises
    note("valid" if info.ok else "loaded, with errors")
    assert info.ok == (not info.errors)
    for p in info.problems:
        assert p.severity in ("error", "warning") and p.message
    for p in info.notes:
        assert p.severity == "info" and p.message and p.node
    cell.structure_hash()
    layout = auto_layout(cell)
    assert set(layout) == {n.id for n in cell.nodes}
    # Saving what was loaded and loading it again changes nothing.
    again = cell_from_text(cell_to_text(cell))
    assert cell_to_text(again) == cell_to_text(cell)
    if info.ok:
        width = 3 if info.ties else 2  # a cell that ties the input width to the hidden width needs them equal
        params = init_params(cell, 2, width, 3, seed=0)
        x = np.linspace(-1.0, 1.0, 2 * 2 * width, dtype=np.float32).reshape(2, 2, width)
        try:
            out = run_reference(cell, params, {"x": x})
        except CellError:
            note("run refused")
            return
        note("ran")
        assert out.y.shape == (2, 2, 3) and out.y.dtype == np.float32


@SETTINGS
@given(json_values)
def test_random_json(value):
    check_loader(json.dumps(value))


@SETTINGS
@given(cell_like)
def test_random_cell_like_objects(value):
    check_loader(json.dumps(value))


@SETTINGS
@given(st.text(max_size=40))
def test_random_text(text):
    check_loader(text)


def _mutate(data: dict[str, Any], draw) -> None:
    nodes = data["nodes"]
    kind = draw(st.sampled_from(["drop", "duplicate", "rename", "rename_all", "op", "args", "shape", "field",
                                 "swap", "updates", "output", "top", "sizes", "value"]))
    if not nodes or not all(isinstance(n, dict) for n in nodes):
        return
    i = draw(st.integers(0, len(nodes) - 1))
    node = nodes[i]
    node_ids = [n.get("id") for n in nodes if isinstance(n, dict)]
    some_id = st.sampled_from([x for x in node_ids if isinstance(x, str)] or ["x"]) | ids
    if kind == "drop":
        del nodes[i]
    elif kind == "duplicate":
        nodes.insert(draw(st.integers(0, len(nodes))), json.loads(json.dumps(node)))
    elif kind == "rename":
        node["id"] = draw(ids)
    elif kind == "rename_all":
        old, new = node.get("id"), draw(some_id)
        for n in nodes:
            if n.get("id") == old:
                n["id"] = new
            if isinstance(n.get("args"), list):
                n["args"] = [new if a == old else a for a in n["args"]]
        data["updates"] = {(new if s == old else s): (new if v == old else v)
                           for s, v in data["updates"].items()}
        if data.get("output") == old:
            data["output"] = new
    elif kind == "op":
        node["op"] = draw(ops)
    elif kind == "args":
        node["args"] = draw(st.lists(some_id, max_size=3))
    elif kind == "shape":
        node["shape"] = draw(st.lists(dims, max_size=3) | json_values)
    elif kind == "field":
        field = draw(st.sampled_from(["id", "op", "args", "shape", "value", "x-e", "bogus"]))
        node[field] = draw(json_values)
    elif kind == "swap":
        j = draw(st.integers(0, len(nodes) - 1))
        nodes[i], nodes[j] = nodes[j], nodes[i]
    elif kind == "updates":
        if data["updates"] and draw(st.booleans()):
            data["updates"].pop(draw(st.sampled_from(sorted(data["updates"]))))
        else:
            data["updates"][draw(some_id)] = draw(some_id)
    elif kind == "output":
        data["output"] = draw(some_id | json_values)
    elif kind == "top":
        data[draw(st.sampled_from(["format", "name", "description", "sizes", "nodes", "updates", "output",
                                   "layout", "x-k", "other"]))] = draw(json_values)
    elif kind == "sizes":
        data["sizes"] = {"input": draw(st.integers(-2, 4)), "hidden": draw(st.integers(-2, 4))}
    elif kind == "value":
        node["value"] = draw(st.floats() | st.integers() | st.just(10**400))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_templates(data):
    name = data.draw(st.sampled_from(template_names()))
    cell_json = json.loads(template_text(name))
    for _ in range(data.draw(st.integers(1, 4))):
        if not isinstance(cell_json.get("nodes"), list) or not isinstance(cell_json.get("updates"), dict):
            break
        _mutate(cell_json, data.draw)
    text = json.dumps(cell_json, indent=data.draw(st.sampled_from([None, 2])))
    if data.draw(st.booleans()):
        text = text[: data.draw(st.integers(0, len(text)))]
    check_loader(text)


def test_every_template_passes_the_property():
    for name in template_names():
        check_loader(template_text(name))
        assert analyze(load_template(name)).ok
