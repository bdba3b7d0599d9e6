"""The built-in cells: all there, all valid, laid out, and exactly what scripts/make_templates.py writes."""

from __future__ import annotations

import pytest

from cellfuse.graph_model import CellError, analyze, load_template, template_names
from cellfuse.graph_model.templates import template_text

NAMES = ["cifg_lstm", "elman", "gru", "gru_cho", "indrnn", "lstm", "mgu", "peephole_lstm"]


def test_template_names():
    assert template_names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_template_validates_without_problems(name):
    cell = load_template(name)
    info = analyze(cell)
    assert info.problems == []
    assert cell.name and cell.description
    assert cell.sizes == {"input": 512, "hidden": 512}
    assert len(cell.of_op("input")) == 1


@pytest.mark.parametrize("name", NAMES)
def test_layout_places_every_node_once(name):
    cell = load_template(name)
    ids = {n.id for n in cell.nodes}
    assert set(cell.layout) == ids
    positions = [tuple(p) for p in cell.layout.values()]
    assert len(set(positions)) == len(positions), "two nodes at the same position"


def test_shipped_files_are_what_the_script_writes(tmp_path, make_templates_module):
    make_templates_module.write_all(tmp_path)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [f"{n}.cell.json" for n in NAMES]
    for name in NAMES:
        assert (tmp_path / f"{name}.cell.json").read_text("utf-8") == template_text(name), name


def test_script_covers_every_template(make_templates_module):
    assert sorted(make_templates_module.TEMPLATES) == NAMES


def test_unknown_template():
    with pytest.raises(CellError) as e:
        load_template("lstmm")
    assert "'lstmm'" in str(e.value) and "lstm" in str(e.value)


def test_templates_are_independent_copies():
    a = load_template("lstm")
    a.nodes.pop()
    assert len(load_template("lstm").nodes) == len(a.nodes) + 1


# Shapes of the parameters, as the papers name them (checked against the reference in test_reference).
EXPECTED_WEIGHTS = {
    "lstm": {f"{m}_{g}" for m in "WUb" for g in "ifog"},
    "peephole_lstm": {f"{m}_{g}" for m in "WUb" for g in "ifog"} | {"p_i", "p_f", "p_o"},
    "cifg_lstm": {f"{m}_{g}" for m in "WUb" for g in "iog"},
    "gru": {f"{m}_{s}{g}" for m in "Wb" for s in "ih" for g in "rzn"},
    "gru_cho": {f"{m}_{g}" for m in "WUb" for g in "rzn"},
    "mgu": {f"{m}_{g}" for m in "WUb" for g in "fh"},
    "indrnn": {"W", "u", "b"},
    "elman": {"W", "U", "b"},
}


@pytest.mark.parametrize("name", NAMES)
def test_weights(name):
    cell = load_template(name)
    assert {w.id for w in cell.of_op("weight")} == EXPECTED_WEIGHTS[name]
    for w in cell.of_op("weight"):
        if w.id.startswith("W"):
            assert w.shape in (["input", "hidden"], ["hidden", "hidden"])
        elif w.id.startswith("U"):
            assert w.shape == ["hidden", "hidden"]
        else:
            assert w.shape == ["hidden"]
