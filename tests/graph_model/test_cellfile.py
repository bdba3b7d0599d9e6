"""Reading and writing cell files: syntax errors with line numbers, version and type checks, round
trips, editor data, and atomic saves."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cellfuse.graph_model import (
    FORMAT,
    Cell,
    CellError,
    CellFileError,
    Node,
    atomic_write,
    cell_from_json,
    cell_from_text,
    cell_to_text,
    load_cell,
    load_template,
    save_cell,
    template_names,
)
from cellfuse.graph_model.templates import template_text


def elman_json() -> dict:
    return json.loads(template_text("elman"))


def test_truncated_json_reports_the_line():
    text = template_text("elman")
    lines = text.split("\n")
    cut = len("\n".join(lines[:9])) + 12  # in the middle of line 10
    with pytest.raises(CellError) as e:
        cell_from_text(text[:cut], "elman.cell.json")
    msg = str(e.value)
    assert msg.startswith("elman.cell.json: invalid JSON at line 10,"), msg


def test_truncated_after_a_complete_line_reports_a_line():
    text = template_text("elman")
    cut = text.index("\n", text.index('"nodes"')) + 1
    with pytest.raises(CellError, match=r"invalid JSON at line \d+"):
        cell_from_text(text[:cut])


def test_invalid_json_reports_the_line():
    lines = template_text("elman").split("\n")
    assert lines[7].rstrip().endswith(",")
    lines[7] = lines[7].rstrip().rstrip(",")  # drop a comma at the end of line 8
    with pytest.raises(CellError) as e:
        cell_from_text("\n".join(lines), "f.cell.json")
    assert "invalid JSON at line 9" in str(e.value) and "f.cell.json" in str(e.value)


@pytest.mark.parametrize("text", ["", "   ", "{", "[1, 2", "{'format': 1}", "nul", "{\"a\": 1,}"])
def test_not_json_at_all(text):
    with pytest.raises(CellError, match="invalid JSON at line 1"):
        cell_from_text(text)


def test_deeply_nested_json_is_a_cell_error():
    with pytest.raises(CellError):
        cell_from_text("[" * 100_000 + "]" * 100_000)


def test_an_integer_too_long_to_parse_is_a_cell_error():
    data = elman_json()
    text = json.dumps(data).replace('"sizes": {', '"sizes": {"hidden": ' + "9" * 5000 + ", ", 1)
    with pytest.raises(CellError):
        cell_from_text(text)


@pytest.mark.parametrize("fmt", ["cellfuse.cell/2", "cellfuse.cell/0", "", None, 1])
def test_unknown_format_version(fmt):
    data = elman_json()
    data["format"] = fmt
    with pytest.raises(CellError) as e:
        cell_from_json(data)
    assert "unknown format" in str(e.value) and repr(fmt) in str(e.value) and FORMAT in str(e.value)


def test_missing_format():
    data = elman_json()
    del data["format"]
    with pytest.raises(CellError, match="unknown format None"):
        cell_from_json(data)


def _node(data, nid):
    return next(n for n in data["nodes"] if n["id"] == nid)


# (change to the Elman file, words the message must hold)
TYPE_FAULTS = [
    (lambda d: d.update(nodes={"x": 1}), ["'nodes'"]),
    (lambda d: d.pop("nodes"), ["'nodes'"]),
    (lambda d: d["nodes"].insert(2, "W"), ["node #3"]),
    (lambda d: d["nodes"].insert(0, None), ["node #1"]),
    (lambda d: _node(d, "a").update(id=7), ["'id'", "node #"]),
    (lambda d: _node(d, "a").pop("op"), ["node 'a'", "'op'"]),
    (lambda d: _node(d, "a").update(op=["add"]), ["node 'a'", "'op'"]),
    (lambda d: _node(d, "a").update(args="xw hu"), ["node 'a'", "'args'"]),
    (lambda d: _node(d, "a").update(args=["xw", 3]), ["node 'a'", "'args'"]),
    (lambda d: _node(d, "a").update(args={"a": "xw"}), ["node 'a'", "'args'"]),
    (lambda d: _node(d, "W").update(shape="input,hidden"), ["node 'W'", "'shape'"]),
    (lambda d: _node(d, "W").update(shape=[512, 512]), ["node 'W'", "'shape'"]),
    (lambda d: _node(d, "W").update(value="1"), ["node 'W'", "'value'"]),
    (lambda d: _node(d, "W").update(value=True), ["node 'W'", "'value'"]),
    (lambda d: _node(d, "W").update(value=10**400), ["node 'W'", "'value'"]),
    (lambda d: _node(d, "W").update(colour="red"), ["node 'W'", "'colour'", "x-"]),
    (lambda d: d.update(sizes={"hidden": "512"}), ["'sizes'"]),
    (lambda d: d.update(sizes={"hidden": 0}), ["'sizes'"]),
    (lambda d: d.update(sizes={"hidden": 512.0}), ["'sizes'"]),
    (lambda d: d.update(sizes={"hidden": True}), ["'sizes'"]),
    (lambda d: d.update(sizes={"depth": 3}), ["'sizes'"]),
    (lambda d: d.update(sizes=[512, 512]), ["'sizes'"]),
    (lambda d: d.update(updates=[["h", "h_new"]]), ["'updates'"]),
    (lambda d: d.update(updates={"h": 3}), ["'updates'"]),
    (lambda d: d.update(updates={"h": None}), ["'updates'"]),
    (lambda d: d.update(output=3), ["'output'"]),
    (lambda d: d.update(output=["h_new"]), ["'output'"]),
    (lambda d: d.update(layout={"x": [1]}), ["'layout'"]),
    (lambda d: d.update(layout={"x": "0,0"}), ["'layout'"]),
    (lambda d: d.update(layout={"x": [0, True]}), ["'layout'"]),
    (lambda d: d.update(layout={"x": [0, 10**400]}), ["'layout'"]),
    (lambda d: d.update(layout=[[0, 0]]), ["'layout'"]),
    (lambda d: d.update(name=3), ["'name'"]),
    (lambda d: d.update(description=["a"]), ["'description'"]),
    (lambda d: d.update(colour="red"), ["'colour'", "x-"]),
]


@pytest.mark.parametrize("i", range(len(TYPE_FAULTS)))
def test_wrong_field_types_give_cell_errors(i):
    change, words = TYPE_FAULTS[i]
    data = elman_json()
    change(data)
    with pytest.raises(CellError) as e:
        cell_from_text(json.dumps(data), "f.cell.json")
    for w in words:
        assert w in str(e.value)
    assert str(e.value).startswith("f.cell.json: ")


@pytest.mark.parametrize("data", [None, [], 1, "cell", 1.5, True])
def test_a_file_that_is_not_an_object(data):
    with pytest.raises(CellError, match="one JSON object"):
        cell_from_text(json.dumps(data))


def test_graph_problems_load_and_are_left_to_validation():
    data = elman_json()
    _node(data, "a")["op"] = "frobnicate"
    _node(data, "a_b")["args"] = ["nope"]
    cell = cell_from_json(data)
    assert cell.node("a").op == "frobnicate"


def test_defaults():
    cell = cell_from_json({"format": FORMAT, "nodes": []})
    assert cell.name == "cell" and cell.description == "" and cell.updates == {} and cell.output is None
    assert cell.sizes == {"input": 512, "hidden": 512} and cell.layout == {}
    cell = cell_from_json({"format": FORMAT, "nodes": [], "sizes": {"hidden": 7}})
    assert cell.sizes == {"input": 512, "hidden": 7}


def rich_cell() -> Cell:
    cell = load_template("cifg_lstm")
    cell.description = "with editor data: ünïcode and \"quotes\""
    cell.extra = {"x-editor": {"zoom": 1.5, "theme": "dark"}, "x-note": [1, 2, None]}
    cell.node("i").extra = {"x-colour": "#ff0000", "x-collapsed": True}
    cell.sizes = {"input": 3, "hidden": 5}
    cell.layout["x"] = [-12.5, 3e-3]
    return cell


@pytest.mark.parametrize("name", ["rich", *template_names()])
def test_round_trip(tmp_path, name):
    cell = rich_cell() if name == "rich" else load_template(name)
    path = tmp_path / "c.cell.json"
    save_cell(cell, path)
    back = load_cell(path)
    assert back.to_json() == cell.to_json()
    assert back.structure_hash() == cell.structure_hash()
    save_cell(back, tmp_path / "again.cell.json")
    assert (tmp_path / "again.cell.json").read_text() == path.read_text()


def test_round_trip_of_a_cell_with_problems(tmp_path):
    cell = Cell("broken", nodes=[Node("x", "input"), Node("a", "nope", ["ghost", "x"]),
                                 Node("k", "const", value=2)], output="zz")
    save_cell(cell, tmp_path / "b.cell.json")
    assert load_cell(tmp_path / "b.cell.json").to_json() == cell.to_json()


def test_editor_keys_are_kept():
    back = cell_from_text(cell_to_text(rich_cell()))
    assert back.extra == {"x-editor": {"zoom": 1.5, "theme": "dark"}, "x-note": [1, 2, None]}
    assert back.node("i").extra == {"x-colour": "#ff0000", "x-collapsed": True}
    assert back.node("f").extra == {}


def test_layout_is_kept():
    cell = rich_cell()
    back = cell_from_text(cell_to_text(cell))
    assert back.layout == cell.layout
    assert back.layout["x"] == [-12.5, 3e-3]
    assert list(back.layout) == list(cell.layout)


def test_editor_data_does_not_change_the_structure_hash():
    plain = load_template("cifg_lstm")
    assert rich_cell().structure_hash() == plain.structure_hash()
    changed = load_template("cifg_lstm")
    changed.node("i").op = "tanh"
    assert changed.structure_hash() != plain.structure_hash()


def test_file_text_has_one_node_per_line():
    cell = load_template("lstm")
    text = cell_to_text(cell)
    node_lines = [ln for ln in text.splitlines() if ln.strip().startswith('{"id"')]
    assert len(node_lines) == len(cell.nodes)
    assert text.endswith("}\n")
    assert json.loads(text) == cell.to_json()


def test_load_a_missing_file(tmp_path):
    with pytest.raises(CellError, match="no such file"):
        load_cell(tmp_path / "nope.cell.json")


def test_load_a_directory(tmp_path):
    with pytest.raises(CellError, match="directory"):
        load_cell(tmp_path)


def test_load_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "bin.cell.json"
    path.write_bytes(b'{"format": "\xff\xfe"}')
    with pytest.raises(CellError, match="not UTF-8.*byte 12"):
        load_cell(path)


def test_load_names_the_file_in_errors(tmp_path):
    path = tmp_path / "bad.cell.json"
    path.write_text('{"format": "cellfuse.cell/1",\n "nodes": [\n}')
    with pytest.raises(CellError) as e:
        load_cell(path)
    assert str(path) in str(e.value) and "line 3" in str(e.value)


# -- atomic writes --------------------------------------------------------------------------------

def test_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "c.cell.json"
    save_cell(load_template("elman"), path)
    old = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        save_cell(load_template("lstm"), path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.cell.json"]


def test_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "c.bin"
    path.write_bytes(b"old")

    def broken_fsync(fd):
        raise OSError("no space left")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="no space"):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["c.bin"]


def test_atomic_write_replaces_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "c.bin"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["c.bin"]


def test_atomic_write_into_a_missing_folder_names_the_target(tmp_path):
    target = tmp_path / "missing" / "c.bin"
    with pytest.raises(OSError) as e:
        atomic_write(target, b"x")
    assert str(target) in str(e.value)
    assert not (tmp_path / "missing").exists()


# -- writes through symbolic links ----------------------------------------------------------------------

def _tree(*folders: Path) -> dict[str, bytes | str]:
    """Every entry of the folders: a link as where it points, a file as its bytes."""
    return {str(p): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for folder in folders for p in sorted(folder.iterdir())}


def test_a_write_through_a_symlink_keeps_the_link_and_replaces_its_target(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "c.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link = tmp_path / "c.bin"
    link.symlink_to(Path("data") / "c.bin")  # relative, as links often are
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append((Path(src), Path(dst))),
                                                         real_replace(src, dst)))
    atomic_write(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(Path("data") / "c.bin")
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    # atomically still: a temporary file beside the target, renamed onto it
    [(src, dst)] = replaced
    assert dst == target.resolve() and src.parent == target.parent.resolve()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["c.bin"]


def test_a_write_through_a_chain_of_links_reaches_the_last_target(tmp_path):
    target = tmp_path / "c.bin"
    target.write_bytes(b"old")
    (tmp_path / "one").symlink_to("c.bin")
    (tmp_path / "two").symlink_to("one")
    save_cell(load_template("elman"), tmp_path / "two")
    assert os.readlink(tmp_path / "two") == "one" and os.readlink(tmp_path / "one") == "c.bin"
    assert target.read_text() == cell_to_text(load_template("elman"))


def test_a_dangling_symlink_creates_the_file_it_names(tmp_path):
    link = tmp_path / "c.bin"
    link.symlink_to("new.bin")
    atomic_write(link, b"made")
    assert link.is_symlink() and (tmp_path / "new.bin").read_bytes() == b"made"


def test_a_symlink_into_a_missing_folder_is_refused_naming_both(tmp_path):
    link, target = tmp_path / "c.bin", tmp_path / "missing" / "c.bin"
    link.symlink_to(target)
    with pytest.raises(CellFileError) as e:
        atomic_write(link, b"x")
    assert str(e.value) == f"{link}: is a symbolic link to {target}, whose folder does not exist"
    assert _tree(tmp_path) == {str(link): str(target)}


def test_a_loop_of_symlinks_is_refused(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(CellFileError, match="loop of symbolic links"):
        atomic_write(tmp_path / "a", b"x")
    assert _tree(tmp_path) == {str(tmp_path / "a"): "b", str(tmp_path / "b"): "a"}


def test_a_failed_write_through_a_symlink_leaves_the_link_and_its_target(tmp_path, monkeypatch):
    target = tmp_path / "c.bin"
    target.write_bytes(b"old")
    (tmp_path / "link").symlink_to("c.bin")
    before = _tree(tmp_path)

    def broken_fsync(fd):
        raise OSError("no space left")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(CellFileError, match="link: cannot write: no space left"):
        atomic_write(tmp_path / "link", b"new")
    assert _tree(tmp_path) == before


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_new_file_gets_the_usual_permissions(tmp_path):
    path = tmp_path / "c.cell.json"
    save_cell(load_template("elman"), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()


def test_an_existing_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "c.cell.json"
    path.write_text("old")
    path.chmod(0o640)
    save_cell(load_template("elman"), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert Path(path).read_text().startswith("{")


# -- groups (the optional "groups" field) -----------------------------------------------------------

def lstm_json() -> dict:
    return json.loads(template_text("lstm"))


def test_groups_round_trip_and_one_group_is_written_per_line(tmp_path):
    cell = load_template("lstm")
    assert [g.name for g in cell.groups] == ["input gate", "forget gate", "output gate", "candidate"]
    path = tmp_path / "lstm.cell.json"
    save_cell(cell, path)
    assert load_cell(path).groups == cell.groups
    lines = path.read_text().splitlines()
    start = lines.index('  "groups": {"version": 1, "list": [')
    assert json.loads(lines[start + 2].rstrip(",")) == {"name": "forget gate", "nodes": cell.groups[1].nodes}


def test_groups_are_not_part_of_the_structure_and_renames_follow():
    cell = load_template("lstm")
    flat = cell.copy()
    flat.groups = []
    assert cell.structure_hash() == flat.structure_hash()
    cell.rename("f", "forget")
    assert cell.groups[1].nodes[-1] == "forget"
    assert cell_from_text(cell_to_text(cell)).groups == cell.groups


def test_a_file_without_groups_has_none_and_writes_none():
    data = elman_json()
    assert "groups" not in data
    cell = cell_from_json(data)
    assert cell.groups == [] and "groups" not in cell.to_json()


HOSTILE_GROUPS = [
    ([], "'groups' must be an object"),
    ({"version": 1}, "'list' must be a list"),
    ({"version": 2, "list": []}, "'version' must be 1"),
    ({"version": True, "list": []}, "'version' must be 1"),
    ({"version": "1", "list": []}, "'version' must be 1"),
    ({"version": 1, "list": [], "extra": 1}, "unknown key(s) ['extra']"),
    ({"version": 1, "list": ["f"]}, "group #1 must be an object"),
    ({"version": 1, "list": [{"name": "g", "nodes": ["f"], "pos": [0, 0]}]}, "unknown key(s) ['pos']"),
    ({"version": 1, "list": [{"nodes": ["f"]}]}, "group #1: a group's name must be a string, got None"),
    ({"version": 1, "list": [{"name": 7, "nodes": ["f"]}]}, "a group's name must be a string, got 7"),
    ({"version": 1, "list": [{"name": "", "nodes": ["f"]}]}, "a group's name cannot be empty"),
    ({"version": 1, "list": [{"name": "a\nb", "nodes": ["f"]}]}, "one line of printable text"),
    ({"version": 1, "list": [{"name": "x" * 10**6, "nodes": ["f"]}]},
     "has 1000000 characters, above the limit of 80"),
    ({"version": 1, "list": [{"name": "g", "nodes": []}]}, "'nodes' must be a list of one or more"),
    ({"version": 1, "list": [{"name": "g", "nodes": "f"}]}, "group 'g': 'nodes' must be a list"),
    ({"version": 1, "list": [{"name": "g", "nodes": [1]}]}, "group 'g': 'nodes' must be a list"),
    ({"version": 1, "list": [{"name": "g", "nodes": ["nope"]}]}, "group 'g': there is no node 'nope'"),
    ({"version": 1, "list": [{"name": "g", "nodes": ["f", "f"]}]}, "group 'g': names node 'f' twice"),
    ({"version": 1, "list": [{"name": "a", "nodes": ["f"]}, {"name": "b", "nodes": ["i", "f"]}]},
     "group 'b': node 'f' is in group 'a' too; a node is in one group at most"),
]


@pytest.mark.parametrize("groups, expected", HOSTILE_GROUPS)
def test_hostile_or_inconsistent_groups_are_refused_naming_the_file_and_field(tmp_path, groups, expected):
    data = lstm_json()
    data["groups"] = groups
    path = tmp_path / "bad.cell.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CellError) as e:
        load_cell(path)
    message = str(e.value)
    assert message.startswith(f"{path}: 'groups'") and expected in message, message
    assert len(message) < 400  # a huge name is not repeated in full


def test_a_cell_with_a_group_of_a_deleted_node_is_not_saved(tmp_path):
    cell = load_template("lstm")
    cell.nodes = [n for n in cell.nodes if n.id != "W_f"]
    with pytest.raises(CellError, match="group 'forget gate': there is no node 'W_f'"):
        save_cell(cell, tmp_path / "x.cell.json")
    assert not (tmp_path / "x.cell.json").exists()
