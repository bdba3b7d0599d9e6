"""The canvas's node classes, generated from the op table.

Every op of `OPS` gets one NodeGraphQt class whose input ports are named after the op's args and
whose colour says its kind. Two classes are not ops: a state's update (the value written at t, one
input port; the state node itself is the value read at t-1) and the cell's output sink. A group
node stands for a group of the cell's nodes (see cell_adapter); it is no node of the cell.

A canvas node's role says how the adapter reads it: `op` (a node of the cell, its name is the
cell id), `update` (linked to its state node), `output`, or `group` (its name is the group's).
"""

from __future__ import annotations

from NodeGraphQt import BaseNode

from ..graph_model import OPS, OpSpec
from . import theme
from .node_item import CellNodeItem, GroupNodeItem

OUTPUT_PORT = "out"
SINK_PORT = "value"
ROLE_OP = "op"
ROLE_UPDATE = "update"
ROLE_OUTPUT = "output"
ROLE_GROUP = "group"

# Hidden properties the adapter keeps on canvas nodes (never shown by NodeGraphQt).
PROP_SHAPE = "cell_shape"
PROP_VALUE = "cell_value"
PROP_EXTRA = "cell_extra"
PROP_STATE_LINK = "state_link"  # on update nodes: the canvas id of their state node
PROP_MEMBERS = "group_members"  # on group nodes: the canvas ids of the cell's nodes they hold

DEFAULT_WEIGHT_SHAPE = ["hidden", "hidden"]
DEFAULT_CONST_VALUE = 1.0

INPUT_PORT_COLOR = (70, 74, 84)


def caption_for(op: str, shape: list[str] | None = None, value: float | None = None) -> str:
    """The one-line caption under a node's title: what the node is."""
    if op == "weight":
        return f"weight [{', '.join(shape or [])}]"
    if op == "const":
        return f"const = {value:g}" if value is not None else "const"
    if op == "state":
        return "state: value from step t-1"
    if op == "input":
        return "input x_t"
    if op == ROLE_UPDATE:
        return "state: new value at step t"
    if op == ROLE_OUTPUT:
        return "the layer's output"
    if op == ROLE_GROUP:
        return "group: double-click to open"
    spec = OPS.get(op)
    return f"{op}: {spec.doc}" if spec and spec.in_kernel else op


class CellNode(BaseNode):
    """Base of CellFuse's canvas nodes."""

    ROLE = ROLE_OP
    OP = ""
    KIND = "elementwise"
    ITEM_CLASS: type[CellNodeItem] = CellNodeItem

    def __init__(self) -> None:
        super().__init__(qgraphics_item=self.ITEM_CLASS)
        self.create_property(PROP_EXTRA, {})

    @property
    def item(self) -> CellNodeItem:
        return self.view


def port_color(kind: str) -> tuple[int, int, int]:
    r, g, b = theme.KIND_COLORS[kind]
    return (int(r * 0.7), int(g * 0.7), int(b * 0.7))


def make_op_node_class(spec: OpSpec) -> type[CellNode]:
    """One canvas node class for one op of the op table."""
    kind = theme.op_kind(spec.name)

    def __init__(self) -> None:
        CellNode.__init__(self)
        for arg in spec.args:
            self.add_input(arg, color=INPUT_PORT_COLOR)
        self.add_output(OUTPUT_PORT, color=port_color(kind))
        if spec.name == "weight":
            self.create_property(PROP_SHAPE, list(DEFAULT_WEIGHT_SHAPE))
        if spec.name == "const":
            self.create_property(PROP_VALUE, DEFAULT_CONST_VALUE)
        self.item.set_style(theme.KIND_COLORS[kind], caption_for(
            spec.name, DEFAULT_WEIGHT_SHAPE, DEFAULT_CONST_VALUE))

    name = "".join(part.capitalize() for part in spec.name.split("_")) + "Node"
    return type(name, (CellNode,), {
        "__identifier__": f"cellfuse.{theme.KIND_LABELS[kind]}",
        "__init__": __init__,
        "__doc__": f"The '{spec.name}' op: {spec.doc}.",
        "NODE_NAME": spec.name,
        "OP": spec.name,
        "KIND": kind,
    })


class StateUpdateNode(CellNode):
    """The value a state takes for the next step (the update written at t)."""

    __identifier__ = "cellfuse.State"
    NODE_NAME = "update"
    ROLE = ROLE_UPDATE
    OP = "state"
    KIND = "state"

    def __init__(self) -> None:
        super().__init__()
        self.add_input(SINK_PORT, color=INPUT_PORT_COLOR)
        self.create_property(PROP_STATE_LINK, "")
        self.item.set_style(theme.KIND_COLORS["state"], caption_for(ROLE_UPDATE))
        self.item.text_item.set_locked(True)


class OutputNode(CellNode):
    """The cell's output: the value its input port receives is the layer's output."""

    __identifier__ = "cellfuse.Cell"
    NODE_NAME = "output"
    ROLE = ROLE_OUTPUT
    OP = "output"
    KIND = "output"

    def __init__(self) -> None:
        super().__init__()
        self.add_input(SINK_PORT, color=INPUT_PORT_COLOR)
        self.item.set_style(theme.KIND_COLORS["output"], caption_for(ROLE_OUTPUT))
        self.item.text_item.set_locked(True)


class CellGroupNode(CellNode):
    """Nodes of the cell shown as one. Its ports name the values that enter the group and leave it;
    they are drawn, never wired: the cell's wires stay between the cell's own nodes."""

    __identifier__ = "cellfuse.Group"
    NODE_NAME = "group"
    ROLE = ROLE_GROUP
    OP = "group"
    KIND = "group"
    ITEM_CLASS = GroupNodeItem

    def __init__(self) -> None:
        super().__init__()
        self.create_property(PROP_MEMBERS, [])
        self.set_port_deletion_allowed(True)  # its ports follow the wires in and out of the group
        self.item.set_style(theme.GROUP_COLOR, caption_for(ROLE_GROUP))
        self.item.text_item.set_locked(True)  # a double-click opens the group


OP_NODE_CLASSES: dict[str, type[CellNode]] = {name: make_op_node_class(spec) for name, spec in OPS.items()}
ALL_NODE_CLASSES: list[type[CellNode]] = [*OP_NODE_CLASSES.values(), StateUpdateNode, OutputNode]


def node_type_of(cls: type[CellNode]) -> str:
    """NodeGraphQt's type string of a class (identifier + class name)."""
    return f"{cls.__identifier__}.{cls.__name__}"


