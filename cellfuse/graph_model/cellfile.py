"""Reading and writing cell files (`*.cell.json`), and atomic file writes.

Loading checks the file's structure (JSON syntax, format version, the type of every field) and
raises CellError naming the line, node or key at fault. Whether the graph makes sense is
`validate.analyze`'s job: the editor must be able to hold a cell that still has problems.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

from .cell import DEFAULT_SIZES, FORMAT, GROUPS_VERSION, Cell, Group, Node
from .limits import MAX_CELL_FILE_BYTES, MAX_EDITOR_DATA_DEPTH, MAX_GROUP_NAME, MAX_WIDTH
from .validate import CellError, check_count, is_finite_number, shown

_NODE_KEYS = {"id", "op", "args", "shape", "value"}
_TOP_KEYS = {"format", "name", "description", "sizes", "nodes", "updates", "output", "groups", "layout"}
_GROUPS_KEYS = {"version", "list"}
_GROUP_KEYS = {"name", "nodes"}
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # none on Windows, where FIFOs are not files


class CellFileError(CellError, OSError):
    """A file that cannot be read or written as asked. A CellError, as every fault a user can cause is,
    and an OSError, for callers that handle trouble with files as such."""


def as_path(path: object, where: str = "") -> Path:
    """`path` as a Path; CellFileError for what names no file (the wrong type, a NUL character).
    `where` starts the message (e.g. "parameters ")."""
    try:
        p = Path(path) if isinstance(path, (str, os.PathLike)) else None
    except TypeError:  # an os.PathLike that gives bytes
        p = None
    if p is None:
        raise CellFileError(f"{where}a file name must be a string or a path, got {shown(path)}")
    if "\0" in str(p):
        raise CellFileError(f"{where}{shown(str(p))}: a file name cannot hold a NUL character")
    return p


def open_regular(path: Path, where: str, kind: str) -> BinaryIO:
    """Opens a regular file for reading; CellFileError starting with `where` for anything else.

    The file is opened without blocking and checked before anything is read: opening a FIFO for reading
    waits for a writer, and a device may never end, so neither is ever read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise CellFileError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise CellFileError(f"{where}: is a directory, not {kind}") from None
    except OSError as e:
        raise CellFileError(f"{where}: cannot read: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise CellFileError(f"{where}: is a directory, not {kind}")
        if not stat.S_ISREG(mode):
            raise CellFileError(f"{where}: not a regular file (a FIFO, device or socket), not {kind}")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _mode_to_keep(path: Path) -> int | None:
    """The permissions of the file that `path` names, which a save keeps (None: no such file yet).
    Refuses a target that a new file must not replace: a directory, a FIFO, a device."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # a new file; if it cannot be made, the write says why
    if stat.S_ISDIR(st.st_mode):
        raise CellFileError(f"{path}: is a directory; name the file to write")
    if not stat.S_ISREG(st.st_mode):
        raise CellFileError(f"{path}: exists and is not a regular file (a FIFO, device or socket); "
                            "it is left as it is")
    return stat.S_IMODE(st.st_mode)


def write_target(path: Path) -> Path:
    """The file a write to `path` replaces: `path` itself, or, where `path` is a symbolic link, the file
    it points to (through any chain of links).

    A write goes through a link rather than replacing it: replacing it would turn the link into a
    regular file and leave the file it pointed to stale. A link whose target does not exist yet names
    the file to create, which needs the target's folder to exist; a loop of links names no file."""
    if not os.path.islink(path):
        return path
    target = Path(os.path.realpath(path))
    if os.path.islink(target):  # realpath stops where the links go round
        raise CellFileError(f"{path}: is a loop of symbolic links; it names no file to write")
    if not target.parent.is_dir():
        raise CellFileError(f"{path}: is a symbolic link to {target}, whose folder does not exist")
    return target


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes a file so that it is either the old one or the whole new one, never a torn mix.

    The data goes to a temporary file beside the target, which then replaces it; where `path` is a
    symbolic link, the target is the file it points to and the link stays (see write_target). A new file
    gets the permissions a plain open() would give it; an existing file keeps its own. Any failure is a
    CellFileError naming `path`.
    """
    path = as_path(path)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CellError(f"{path}: the data to write must be bytes, got a {type(data).__name__}")
    target = write_target(path)
    mode = _mode_to_keep(path)  # stat follows the link: the target's permissions, named as given
    try:
        _write_beside_and_replace(target, data, mode)
    except OSError as e:
        raise CellFileError(f"{path}: cannot write: {e.strerror or e}") from None


def _write_beside_and_replace(path: Path, data: bytes, mode: int | None) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
        except FileExistsError:
            continue
        except BaseException:  # a signal's (the CLI raises SIGTERM's), as the call that made the file ends
            tmp.unlink(missing_ok=True)
            raise
        break
    else:
        raise OSError("cannot create a temporary file beside it")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _where(i: int, raw: Any) -> str:
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        return f"node '{raw['id']}'"
    return f"node #{i + 1}"


def _unknown_keys(raw: dict[Any, Any], known: set[str]) -> list[Any]:
    return [k for k in raw if not isinstance(k, str) or (k not in known and not k.startswith("x-"))]


def _check_editor_data(where: str, value: Any) -> None:
    """Editor data is kept as it is, so it must be what a cell file can hold and give back: objects with
    string keys, lists, strings, finite numbers, true, false and null. Its nesting is bounded, as the
    editor copies it recursively (and a list that holds itself must not walk us round for ever)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_EDITOR_DATA_DEPTH:
                raise CellError(f"{where} is nested more than {MAX_EDITOR_DATA_DEPTH} levels deep")
            if isinstance(v, dict) and not all(isinstance(k, str) for k in v):
                raise CellError(f"{where} holds an object with a key that is not a string")
            stack.extend((item, depth + 1) for item in (v.values() if isinstance(v, dict) else v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise CellError(f"{where} holds {v}, which is not a JSON number")
        elif v is not None and not isinstance(v, (str, int, float)):
            raise CellError(f"{where} holds a {type(v).__name__}, which a cell file cannot hold")


def _editor_data(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    extra = {k: v for k, v in raw.items() if k.startswith("x-")}
    for key, value in extra.items():
        _check_editor_data(f"{where}'{key}'", value)
    return extra


def _node_from_json(i: int, raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise CellError(f"node #{i + 1} must be an object with 'id' and 'op', got {shown(raw)}")
    where = _where(i, raw)
    for key in ("id", "op"):
        if not isinstance(raw.get(key), str):
            raise CellError(f"{where}: '{key}' must be a string, got {shown(raw.get(key))}")
    unknown = _unknown_keys(raw, _NODE_KEYS)
    if unknown:
        raise CellError(f"{where}: unknown key(s) {shown(unknown)} (editor data must start with 'x-')")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise CellError(f"{where}: 'args' must be a list of node ids, got {shown(args)}")
    shape = raw.get("shape")
    if shape is not None and (not isinstance(shape, list)
                              or not all(isinstance(d, str) for d in shape)):
        raise CellError(f"{where}: 'shape' must be a list like [\"input\", \"hidden\"], got {shown(shape)}")
    value = raw.get("value")
    if value is not None and not is_finite_number(value):
        raise CellError(f"{where}: 'value' must be a finite number, got {shown(value)}")
    return Node(
        id=raw["id"], op=raw["op"], args=list(args), shape=list(shape) if shape is not None else None,
        value=float(value) if value is not None else None,
        extra=_editor_data(f"{where}: ", raw),
    )


def _sizes_from_json(sizes: Any) -> dict[str, int]:
    if not isinstance(sizes, dict) or any(k not in ("input", "hidden") for k in sizes):
        raise CellError(f"'sizes' must map 'input' and 'hidden' to positive integers, got {shown(sizes, 80)}")
    return {k: check_count(f"'sizes': '{k}'", v, MAX_WIDTH) for k, v in sizes.items()}


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _layout_from_json(layout: Any) -> dict[str, list[float]]:
    if not isinstance(layout, dict) or not all(
        isinstance(k, str) and isinstance(p, list) and len(p) == 2 and all(is_finite_number(c) for c in p)
        for k, p in layout.items()
    ):
        raise CellError("'layout' must map node ids to [x, y] positions")
    return {k: [float(p[0]), float(p[1])] for k, p in layout.items()}


def group_name_problem(name: Any) -> str | None:
    """What is wrong with the name of a group, or None: it is one line of printable text of 1 to
    MAX_GROUP_NAME characters, as the canvas draws it in a node's title."""
    if not isinstance(name, str):
        return f"a group's name must be a string, got {shown(name)}"
    if len(name) > MAX_GROUP_NAME:
        return f"a group's name has {len(name)} characters, above the limit of {MAX_GROUP_NAME}"
    if not name.strip():
        return "a group's name cannot be empty"
    if not name.isprintable():
        return f"a group's name must be one line of printable text, got {shown(name)}"
    return None


def _groups_from_json(raw: Any, ids: set[str]) -> list[Group]:
    """The groups of the optional 'groups' field: each names nodes of the file, and no node is in two."""
    like = f'{{"version": {GROUPS_VERSION}, "list": [{{"name": "forget gate", "nodes": ["f", ...]}}]}}'
    if not isinstance(raw, dict):
        raise CellError(f"'groups' must be an object like {like}, got {shown(raw)}")
    unknown = [k for k in raw if k not in _GROUPS_KEYS]
    if unknown:
        raise CellError(f"'groups': unknown key(s) {shown(unknown)} (it holds 'version' and 'list')")
    version = raw.get("version")
    if type(version) is not int or version != GROUPS_VERSION:  # not True, which == 1
        raise CellError(f"'groups': 'version' must be {GROUPS_VERSION}, the version of groups this "
                        f"version of CellFuse reads, got {shown(version)}")
    items = raw.get("list")
    if not isinstance(items, list):
        raise CellError(f"'groups': 'list' must be a list of groups, got {shown(items)}")
    owner: dict[str, int] = {}
    groups: list[Group] = []
    for i, item in enumerate(items):
        where = f"'groups': group #{i + 1}"
        if not isinstance(item, dict):
            raise CellError(f"{where} must be an object with 'name' and 'nodes', got {shown(item)}")
        unknown = [k for k in item if k not in _GROUP_KEYS]
        if unknown:
            raise CellError(f"{where}: unknown key(s) {shown(unknown)} (a group has 'name' and 'nodes')")
        problem = group_name_problem(item.get("name"))
        if problem is not None:
            raise CellError(f"{where}: {problem}")
        name = item["name"]
        where = f"'groups': group {shown(name)}"
        nodes = item.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
            raise CellError(f"{where}: 'nodes' must be a list of one or more node ids, got {shown(nodes)}")
        for node_id in nodes:
            if node_id not in ids:
                raise CellError(f"{where}: there is no node {shown(node_id)} in 'nodes'")
            if owner.get(node_id) == i:
                raise CellError(f"{where}: names node {shown(node_id)} twice")
            if node_id in owner:
                raise CellError(f"{where}: node {shown(node_id)} is in group "
                                f"{shown(groups[owner[node_id]].name)} too; a node is in one group at most")
            owner[node_id] = i
        groups.append(Group(name, list(nodes)))
    return groups


def cell_from_json(data: Any) -> Cell:
    """A Cell from the parsed JSON of a cell file; raises CellError on a structural fault."""
    if not isinstance(data, dict):
        raise CellError("a cell file must hold one JSON object")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise CellError(f"unknown format {shown(fmt)}: this version of CellFuse reads '{FORMAT}'")
    unknown = _unknown_keys(data, _TOP_KEYS)
    if unknown:
        raise CellError(f"unknown top-level key(s) {shown(unknown)} (editor data must start with 'x-')")
    name = data.get("name", "cell")
    if not isinstance(name, str):
        raise CellError(f"'name' must be a string, got {shown(name)}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise CellError(f"'description' must be a string, got {shown(description)}")
    sizes = _sizes_from_json(data.get("sizes", {}))
    nodes_raw = data.get("nodes")
    if not isinstance(nodes_raw, list):
        raise CellError("'nodes' must be a list of nodes")
    nodes = [_node_from_json(i, raw) for i, raw in enumerate(nodes_raw)]
    updates = data.get("updates", {})
    if not _is_str_map(updates):
        raise CellError(f"'updates' must map state ids to node ids, got {shown(updates, 80)}")
    output = data.get("output")
    if output is not None and not isinstance(output, str):
        raise CellError(f"'output' must be a node id, got {shown(output)}")
    groups = _groups_from_json(data["groups"], {n.id for n in nodes}) if "groups" in data else []
    return Cell(
        name=name, nodes=nodes, updates=dict(updates), output=output, description=description,
        sizes={**DEFAULT_SIZES, **sizes}, layout=_layout_from_json(data.get("layout", {})),
        extra=_editor_data("", data), groups=groups,
    )


def _object_without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key it names twice: json.loads would keep the last silently."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            node_id = out.get("id")
            where = f"node '{node_id}': " if isinstance(node_id, str) else ""
            raise CellError(f"{where}the key {shown(key)} appears twice in one object; "
                            "a JSON object names each key once")
        out[key] = value
    return out


def cell_from_text(text: str, source: str = "<text>") -> Cell:
    if not isinstance(text, str):
        raise CellError(f"{source}: a cell file's text must be a str, got a {type(text).__name__}")
    try:
        data = json.loads(text, object_pairs_hook=_object_without_repeated_keys)
    except json.JSONDecodeError as e:
        raise CellError(f"{source}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise CellError(f"{source}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # an integer too long to convert, for one
        raise CellError(f"{source}: invalid JSON: {e}") from None
    except CellError as e:
        raise CellError(f"{source}: {e}") from None
    try:
        return cell_from_json(data)
    except CellError as e:
        raise CellError(f"{source}: {e}") from None


def load_cell(path: str | os.PathLike[str]) -> Cell:
    """Reads a cell file. Nothing in the file is ever executed."""
    path = as_path(path)
    with open_regular(path, str(path), "a cell file") as f:
        try:
            raw = f.read(MAX_CELL_FILE_BYTES + 1)
        except OSError as e:
            raise CellFileError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_CELL_FILE_BYTES:
        raise CellFileError(f"{path}: larger than {MAX_CELL_FILE_BYTES // 2**20} MiB, the limit for a "
                            "cell file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CellError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return cell_from_text(text, str(path))


def cell_to_text(cell: Cell) -> str:
    """The file's text: one node, and one layout position, per line, so that diffs stay readable.

    What loading would refuse (a NaN, a field of the wrong type in a Cell built by hand) is refused
    here, naming the node or key, rather than written into a file that would not load."""
    if not isinstance(cell, Cell):
        raise CellError(f"expected a Cell, got a {type(cell).__name__}")
    try:
        data = cell.to_json()
        cell_from_json(data)
        return _text_of(data)
    except (CellError, TypeError, ValueError, RecursionError) as e:
        raise CellError(f"cell {shown(cell.name)} cannot be written as a cell file: {e}") from None


def _text_of(data: dict[str, Any]) -> str:
    lines = ["{"]
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "groups":  # one group per line
            inner = [json.dumps(g) for g in value["list"]]
            lines.append(f'  "groups": {{"version": {json.dumps(value["version"])}, "list": [')
            lines.extend(f"    {line}{',' if j < len(inner) - 1 else ''}" for j, line in enumerate(inner))
            lines.append(f"  ]}}{comma}")
        elif key == "nodes" or (key == "layout" and value):
            inner = ([json.dumps(v) for v in value] if key == "nodes"
                     else [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()])
            opener, closer = ("[", "]") if key == "nodes" else ("{", "}")
            lines.append(f"  {json.dumps(key)}: {opener}")
            lines.extend(f"    {line}{',' if j < len(inner) - 1 else ''}" for j, line in enumerate(inner))
            lines.append(f"  {closer}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save_cell(cell: Cell, path: str | os.PathLike[str]) -> None:
    atomic_write(path, cell_to_text(cell).encode("utf-8"))
