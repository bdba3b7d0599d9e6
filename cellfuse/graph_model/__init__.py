"""The cell model: a typed dataflow graph of one time step, its file format, validation, templates,
a Python builder, the cell as equations and formulas typed into it, the numpy reference interpreter and
its backward pass. Imports nothing else of CellFuse."""

from .backward import Gradients, Tape, backward, record_forward, run_reference_backward
from .builder import CellBuilder, Value, auto_layout, exp, relu, sigmoid, tanh
from .cell import FORMAT, Cell, Group, Node
from .cellfile import (
    CellFileError,
    atomic_write,
    cell_from_json,
    cell_from_text,
    cell_to_text,
    group_name_problem,
    load_cell,
    save_cell,
)
from .equations import Equation, Term, equations, equations_latex, equations_text
from .formula import FormulaEdit, FormulaError, apply_formula, plan_formula
from .ops import OPS, OpSpec
from .params import (
    NpzArrays,
    Sizes,
    check_inputs,
    check_params,
    check_sizes,
    expected_params,
    init_params,
    input_key_check,
    load_npz,
    param_key,
    param_key_check,
    param_layers,
    save_npz,
)
from .reference import Forward, resolve_run, run_reference
from .templates import load_template, template_names
from .validate import CellError, CellInfo, Problem, analyze, require_valid, shape_str, state_dependent

__all__ = [
    "Gradients", "Tape", "backward", "record_forward", "run_reference_backward",
    "CellBuilder", "Value", "auto_layout", "exp", "relu", "sigmoid", "tanh",
    "FORMAT", "Cell", "Group", "Node",
    "CellFileError", "atomic_write", "cell_from_json", "cell_from_text", "cell_to_text", "load_cell",
    "save_cell", "group_name_problem",
    "Equation", "Term", "equations", "equations_latex", "equations_text",
    "FormulaEdit", "FormulaError", "apply_formula", "plan_formula",
    "OPS", "OpSpec",
    "NpzArrays", "Sizes", "check_inputs", "check_params", "check_sizes", "expected_params", "init_params",
    "input_key_check", "load_npz", "param_key", "param_key_check", "param_layers", "save_npz",
    "Forward", "resolve_run", "run_reference",
    "load_template", "template_names",
    "CellError", "CellInfo", "Problem", "analyze", "require_valid", "shape_str", "state_dependent",
]
