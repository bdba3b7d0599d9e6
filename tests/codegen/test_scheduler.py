"""The scheduler: the plans of the templates are the ones an expert draws by hand, every rung of the
ladder does what it promises, and the plans of random cells keep the scheduler's invariants."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from random_cells import random_cell, random_cells

from cellfuse.codegen import SCHEDULES, GemmLaunch, KernelLaunch, Plan, generate_cuda, make_plan
from cellfuse.codegen.plan import Access
from cellfuse.graph_model import (
    Cell,
    CellBuilder,
    CellError,
    Sizes,
    analyze,
    init_params,
    load_template,
    sigmoid,
    tanh,
    template_names,
)
from cellfuse.graph_model.builder import apply
from cellfuse.graph_model.ops import OPS

SIZES = Sizes(seq=3, batch=2, input=6, hidden=5, layers=1)
TEMPLATES = template_names()
RUNGS = list(zip(SCHEDULES, SCHEDULES[1:], strict=False))


# A Plan is closed (it does not hold its cell); the checks below read the cell it was made from.
_CELL_OF: dict[int, tuple[Plan, Cell]] = {}


def plan_of(cell: Cell, schedule: str, layers: int = 1) -> Plan:
    s = SIZES if not analyze(cell).ties else replace(SIZES, input=SIZES.hidden)  # runs only at equal widths
    plan = make_plan(cell, Sizes(s.seq, s.batch, s.input, s.hidden, layers), schedule)
    _CELL_OF[id(plan)] = (plan, cell)  # the plan is kept too, so that its id is not reused
    return plan


def cell_of(plan: Plan) -> Cell:
    return _CELL_OF[id(plan)][1]


# -- reading a plan --------------------------------------------------------------------------------
def elementwise_nodes(cell: Cell) -> list[str]:
    """The nodes a kernel computes: elementwise ops and row reductions."""
    nodes = cell.by_id()
    return [n for n in analyze(cell).order if OPS[nodes[n].op].in_kernel]


def matmul_nodes(cell: Cell) -> list[str]:
    nodes = cell.by_id()
    return [n for n in analyze(cell).order if nodes[n].op == "matmul"]


def step_of(plan: Plan, layer: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    """A layer's step as ("gemm", matmuls) and ("kernel", nodes) entries, in launch order."""
    out = []
    for launch in plan.layers[layer].step:
        if isinstance(launch, GemmLaunch):
            out.append(("gemm", tuple(plan.group(launch.group).matmuls)))
        else:
            out.append(("kernel", tuple(plan.island(launch.island).nodes)))
    return out


def gemm_launches(launches) -> int:
    return sum(isinstance(x, GemmLaunch) for x in launches)


def kernel_launches(launches) -> int:
    return sum(isinstance(x, KernelLaunch) for x in launches)


def depends_on_state(cell: Cell, root: str) -> bool:
    nodes = cell.by_id()
    stack, seen = [root], set()
    while stack:
        n = stack.pop()
        if nodes[n].op == "state":
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(nodes[n].args)
    return False


def live_consumers(cell: Cell) -> dict[str, list[str]]:
    info = analyze(cell)
    nodes = cell.by_id()
    out: dict[str, list[str]] = {n: [] for n in info.order}
    for n in info.order:
        for a in nodes[n].args:
            if n not in out[a]:
                out[a].append(n)
    return out


# -- the invariants every plan keeps ------------------------------------------------------------------
def check_groups(plan: Plan) -> None:
    cell = cell_of(plan)
    nodes = cell.by_id()
    level = SCHEDULES.index(plan.schedule)
    seen = [m for g in plan.groups for m in g.matmuls]
    assert sorted(seen) == sorted(matmul_nodes(cell)), "every live matmul in exactly one group"
    for g in plan.groups:
        assert g.matmuls, g.name
        assert {nodes[m].args[0] for m in g.matmuls} == {g.left}, f"{g.name}: one left operand"
        assert g.weights == [nodes[m].args[1] for m in g.matmuls]
        if level == 0:
            assert len(g.matmuls) == 1, "naive: one GEMM per matmul"
    if level >= 1:
        lefts = [g.left for g in plan.groups]
        assert len(lefts) == len(set(lefts)), "matmuls that share their left operand are one GEMM"


def check_hoisting(plan: Plan) -> None:
    cell = cell_of(plan)
    level = SCHEDULES.index(plan.schedule)
    for g in plan.groups:
        if g.hoisted:
            assert level >= 3
            assert not depends_on_state(cell, g.left), f"{g.name} is hoisted but reads a state"
        elif level >= 3:
            assert depends_on_state(cell, g.left), f"{g.name} depends on no state but is not hoisted"
    if level < 3:
        assert not plan.layers[0].prologue and not any(i.hoisted for i in plan.islands)
    rows = plan.sizes.seq * plan.sizes.batch
    for lp in plan.layers:  # a hoisted GEMM is one [T*B, K] x [K, N] GEMM; a step's GEMM has B rows
        for launch in [*lp.prologue, *lp.step]:
            if isinstance(launch, GemmLaunch):
                hoisted = plan.group(launch.group).hoisted
                assert launch.m == (rows if hoisted else plan.sizes.batch)
                assert launch.k == (lp.input_size if plan.group(launch.group).k_dim == "input"
                                    else plan.sizes.hidden)
        before = {x.group if isinstance(x, GemmLaunch) else x.island for x in lp.prologue}
        during = {x.group if isinstance(x, GemmLaunch) else x.island for x in lp.step}
        hoisted = {x.name for x in [*plan.groups, *plan.islands] if x.hoisted}
        looped = {x.name for x in [*plan.groups, *plan.islands] if not x.hoisted}
        assert before == hoisted
        assert during == looped
    assert plan.cuda_graph == (plan.schedule in ("graph", "wavefront", "persistent", "tensor"))
    assert plan.layer_streams == (plan.schedule == "wavefront" and plan.sizes.layers > 1
                                  and 0 < plan.chunk_steps < plan.sizes.seq)
    assert plan.tensor_cores == (plan.schedule == "tensor")
    assert (plan.target is not None) == (plan.schedule in ("persistent", "tensor"))


def check_folding(plan: Plan) -> None:
    cell = cell_of(plan)
    nodes = cell.by_id()
    consumers = live_consumers(cell)
    targets = set(cell.updates.values()) | {cell.output}
    folded = {a: g for g in plan.groups for a in g.folded}
    for add, g in folded.items():
        m = g.folded[add]
        assert g.hoisted and m in g.matmuls
        assert nodes[add].op == "add" and m in nodes[add].args
        bias = g.bias_of(add)
        assert nodes[bias].op == "weight" and len(nodes[bias].shape) == 1
        assert consumers[m] == [add] and m not in targets, f"{add}: its matmul {m} has another use"
    if SCHEDULES.index(plan.schedule) >= 3:  # every bias that can fold does
        for g in plan.groups:
            for m in g.matmuls if g.hoisted else ():
                if len(consumers[m]) != 1 or m in targets:
                    continue
                c = consumers[m][0]
                other = [a for a in nodes[c].args if a != m]
                if nodes[c].op == "add" and len(other) == 1 and nodes[other[0]].op == "weight":
                    assert c in g.folded, f"{c} = {m} + {other[0]} should fold into {g.name}"


def check_islands(plan: Plan) -> None:
    cell = cell_of(plan)
    level = SCHEDULES.index(plan.schedule)
    order = analyze(cell).order
    consumers = live_consumers(cell)
    targets = set(cell.updates.values()) | {cell.output}
    folded = [a for g in plan.groups for a in g.folded]
    in_islands = [n for i in plan.islands for n in i.nodes]
    assert sorted(in_islands + folded) == sorted(elementwise_nodes(cell)), \
        "every live elementwise node in exactly one kernel or folded"
    for isl in plan.islands:
        assert isl.nodes == sorted(isl.nodes, key=order.index), f"{isl.name}: topological order"
        if level < 2:
            assert len(isl.nodes) <= 1, "below fused: one kernel per elementwise node"
        # Values inside a kernel stay in registers: it stores only what others read.
        needed = [n for n in isl.nodes if n in targets or any(c not in isl.nodes for c in consumers[n])]
        if isl.nodes:
            assert isl.outputs == needed, f"{isl.name} stores {isl.outputs}, needs {needed}"
        else:  # the kernel that stores updates and the output no other step kernel writes
            assert not isl.hoisted and set(isl.outputs) <= targets


def _elements(acc: Access, t: int, batch: int, rows: int, width: int) -> set[int]:
    start = acc.offset(t, batch)
    if acc.kind == "scalar":
        return {start}
    if acc.kind == "vec":
        return set(range(start, start + width))
    if acc.kind == "col":
        return {start + r * acc.ld for r in range(rows)}
    return {start + r * acc.ld + c for r in range(rows) for c in range(width)}


def _reads(launch, t: int, batch: int) -> list[tuple[str, set[int]]]:
    if isinstance(launch, GemmLaunch):
        out = [(launch.a.buffer, _elements(launch.a, t, batch, launch.m, launch.k)), (launch.w, None)]
        return out + ([(launch.bias, None)] if launch.bias else [])
    return [(acc.buffer, _elements(acc, t, batch, launch.rows, launch.width)) for _, acc in launch.inputs]


def _writes(launch, t: int, batch: int) -> list[tuple[str, set[int]]]:
    if isinstance(launch, GemmLaunch):
        return [(launch.c.buffer, _elements(launch.c, t, batch, launch.m, launch.n))]
    return [(acc.buffer, _elements(acc, t, batch, launch.rows, launch.width)) for _, acc in launch.outputs]


def check_launch_order(plan: Plan) -> None:
    """Runs the plan's launches symbolically: no launch reads memory that no earlier launch of its step
    (or the prologue, or the previous step for states) wrote, nothing is written twice in one step, the
    prologue's results and the states being read are never overwritten, and each step stores every
    state the next step reads."""
    T, B, H = plan.sizes.seq, plan.sizes.batch, plan.sizes.hidden
    constant = {"weight", "stacked", "bias"}
    for lp in plan.layers:
        upstream = "x" if lp.layer == 0 else plan.layers[lp.layer - 1].output_seq
        up_row = 0 if lp.layer == 0 else 1  # the previous layer's output of step t is its row block t+1
        width_in = lp.input_size
        up_all = set(range((up_row * B) * width_in, (up_row + T) * B * width_in))
        pro: dict[str, set[int]] = defaultdict(set)
        for launch in lp.prologue:
            for buf, idx in _reads(launch, 0, B):
                if plan.buffers[buf].role in constant:
                    continue
                allowed = up_all if buf == upstream else pro[buf]
                assert idx <= allowed, f"prologue {launch} reads {buf} before it is written"
            for buf, idx in _writes(launch, 0, B):
                assert plan.buffers[buf].role in ("gemm", "value"), f"prologue writes {buf}"
                assert not idx & pro[buf], f"prologue writes {buf} twice"
                pro[buf] |= idx
        for t in range(T):
            state_now: dict[str, set[int]] = defaultdict(set)
            for acc in lp.state_read.values():
                state_now[acc.buffer] |= _elements(acc, t, B, B, H)
            up_now = set(range((up_row + t) * B * width_in, (up_row + t + 1) * B * width_in))
            fresh: dict[str, set[int]] = defaultdict(set)
            for launch in lp.step:
                for buf, idx in _reads(launch, t, B):
                    if plan.buffers[buf].role in constant:
                        continue
                    if buf == upstream:
                        assert idx <= up_now, f"step {t}: {launch} reads the input of another step"
                        continue
                    ok = idx <= fresh[buf] | pro[buf] | state_now[buf]
                    assert ok, f"step {t}: {launch} reads {buf} before a launch of the step writes it"
                for buf, idx in _writes(launch, t, B):
                    role = plan.buffers[buf].role
                    assert role not in constant and buf != upstream, f"step writes {buf}"
                    assert not idx & fresh[buf], f"step {t}: {buf} written twice"
                    assert not idx & pro[buf], f"step {t}: overwrites the prologue's {buf}"
                    assert not idx & state_now[buf], f"step {t}: overwrites a state it reads"
                    fresh[buf] |= idx
            for s, acc in lp.state_read.items():
                nxt = _elements(acc, t + 1, B, B, H)
                assert nxt <= fresh[acc.buffer], f"step {t} does not store the update of '{s}'"
            y = plan.buffers[lp.output_seq]
            assert y.role == "output"
            assert set(range((t + 1) * B * H, (t + 2) * B * H)) <= fresh[lp.output_seq], \
                f"step {t} does not store the output"


def check_plan(plan: Plan) -> None:
    check_groups(plan)
    check_hoisting(plan)
    check_folding(plan)
    check_islands(plan)
    check_launch_order(plan)


def check_ladder(cell: Cell) -> dict[str, Plan]:
    plans = {s: plan_of(cell, s) for s in SCHEDULES}
    nodes = cell.by_id()
    lefts = [nodes[m].args[0] for m in matmul_nodes(cell)]
    n = {s: p.launches_per_step for s, p in plans.items()}
    assert n["naive"] >= n["combined"] >= n["fused"] >= n["hoisted"] == n["graph"], n
    naive, combined = plans["naive"].layers[0].step, plans["combined"].layers[0].step
    if len(set(lefts)) < len(lefts):
        assert gemm_launches(combined) < gemm_launches(naive)
    else:
        assert gemm_launches(combined) == gemm_launches(naive)
    assert kernel_launches(plans["fused"].layers[0].step) <= kernel_launches(combined)
    hoisted, graph = plans["hoisted"], plans["graph"]
    assert step_of(hoisted) == step_of(graph) and hoisted.layers[0].prologue == graph.layers[0].prologue
    assert not hoisted.cuda_graph and graph.cuda_graph
    return plans


# -- the templates, as an expert schedules them -----------------------------------------------------------
def test_lstm_hoisted_is_one_hoisted_gemm_one_recurrent_gemm_and_one_kernel():
    cell = load_template("lstm")
    plan = plan_of(cell, "hoisted")
    assert [(g.matmuls, g.hoisted) for g in plan.groups] == [
        (["xi", "xf", "xo", "xg"], True),
        (["hi", "hf", "ho", "hg"], False),
    ]
    assert all(not g.folded for g in plan.groups)  # the biases are added to xW + hU, not to xW
    assert len(plan.islands) == 1 and not plan.islands[0].hoisted
    assert sorted(plan.islands[0].nodes) == sorted(elementwise_nodes(cell))
    assert plan.islands[0].outputs == ["c_new", "h_new"]
    assert plan.launches_per_step == 2
    assert step_of(plan) == [("gemm", ("hi", "hf", "ho", "hg")), ("kernel", tuple(plan.islands[0].nodes))]
    (pro,) = plan.layers[0].prologue
    assert isinstance(pro, GemmLaunch) and plan.group(pro.group).matmuls == ["xi", "xf", "xo", "xg"]
    s = SIZES
    assert (pro.m, pro.k, pro.n) == (s.seq * s.batch, s.input, 4 * s.hidden)


@pytest.mark.parametrize("name, gate_product, gated_matmul, first, second", [
    ("gru_cho", "rh", "hn", ("hr", "hz"), ("hn",)),
    ("mgu", "fh", "hh", ("hf",), ("hh",)),
])
@pytest.mark.parametrize("schedule", ["fused", "hoisted", "graph"])
def test_a_matmul_of_a_gate_product_waits_for_the_kernel_that_computes_it(
        name, gate_product, gated_matmul, first, second, schedule):
    cell = load_template(name)
    plan = plan_of(cell, schedule)
    recurrent = [tuple(g.matmuls) for g in plan.groups if depends_on_state(cell, g.left)]
    assert recurrent == [first, second]
    assert plan.group(next(g.name for g in plan.groups if gated_matmul in g.matmuls)).left == gate_product
    steps = step_of(plan)
    kernels = [nodes for kind, nodes in steps if kind == "kernel"]
    assert len(kernels) == 2
    first_kernel, second_kernel = kernels
    assert gate_product in first_kernel and cell.output in second_kernel
    assert sorted(first_kernel + second_kernel) == sorted(elementwise_nodes(cell))
    want = [("gemm", first), ("kernel", first_kernel), ("gemm", second), ("kernel", second_kernel)]
    if schedule == "fused":  # the input GEMM is in the step too, with the first recurrent one
        x_group = tuple(g.matmuls for g in plan.groups if g.left == "x")[0]
        want.insert(0, ("gemm", tuple(x_group)))
    assert steps == want
    assert plan.launches_per_step == len(want)
    gate_kernel = plan.layers[0].step[[k for k, _ in steps].index("kernel")]
    assert gate_product in dict(gate_kernel.outputs)


@pytest.mark.parametrize("name, x_group", [("gru_cho", ["xr", "xz", "xn"]), ("mgu", ["xf", "xh"])])
def test_gru_cho_and_mgu_hoist_every_input_matmul_into_one_gemm(name, x_group):
    plan = plan_of(load_template(name), "hoisted")
    assert [g.matmuls for g in plan.groups if g.hoisted] == [x_group]
    assert plan.launches_per_step == 4


def test_indrnn_hoisted_has_no_recurrent_gemm_and_one_launch_per_step():
    cell = load_template("indrnn")
    plan = plan_of(cell, "hoisted")
    assert [(g.matmuls, g.hoisted) for g in plan.groups] == [(["xw"], True)]
    assert plan.launches_per_step == 1
    assert step_of(plan) == [("kernel", ("uh", "a", "a_b", "h_new"))]
    assert [type(x) for x in plan.layers[0].prologue] == [GemmLaunch]


def test_gru_hoisted_folds_the_input_biases_into_the_hoisted_gemm():
    cell = load_template("gru")
    plan = plan_of(cell, "hoisted")
    x_group, h_group = plan.groups
    assert x_group.hoisted and x_group.matmuls == ["xr", "xz", "xn"]
    assert x_group.folded == {"xr_b": "xr", "xz_b": "xz", "xn_b": "xn"}
    assert [x_group.bias_of(a) for a in ("xr_b", "xz_b", "xn_b")] == ["b_ir", "b_iz", "b_in"]
    assert not h_group.hoisted and h_group.matmuls == ["hr", "hz", "hn"] and not h_group.folded
    (isl,) = plan.islands
    assert sorted(isl.nodes) == sorted(set(elementwise_nodes(cell)) - {"xr_b", "xz_b", "xn_b"})
    # The hoisted GEMM adds the packed biases; the kernel reads x W + b straight from its output.
    (pro,) = plan.layers[0].prologue
    assert pro.bias is not None
    assert plan.buffers[pro.bias].sources == ("l0.b_ir", "l0.b_iz", "l0.b_in")
    params = init_params(cell, 1, SIZES.input, SIZES.hidden, seed=3)
    packed = plan.weight_arrays(params, np.float64)[pro.bias]
    np.testing.assert_array_equal(packed, np.concatenate([params["l0.b_ir"], params["l0.b_iz"],
                                                          params["l0.b_in"]]))
    assert {"xr_b", "xz_b", "xn_b"} <= set(isl.inputs)
    assert plan.launches_per_step == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("schedule", ["hoisted", "graph", "persistent", "tensor"])
def test_a_16_bit_plan_folds_no_bias_and_its_kernel_adds_them(schedule, precision):
    """cublasGemmEx adds no bias as it writes: the GRU's input biases are added by its step's kernel."""
    plan = make_plan(load_template("gru"), SIZES, schedule, precision=precision)
    assert all(not g.folded for g in plan.groups)
    assert all(launch.bias is None for lp in plan.layers for launch in (*lp.prologue, *lp.step)
               if isinstance(launch, GemmLaunch))
    (step_kernel,) = [i for i in plan.islands if not i.hoisted]
    assert {"xr_b", "xz_b", "xn_b"} <= set(step_kernel.nodes)
    assert {"b_ir", "b_iz", "b_in"} <= set(step_kernel.inputs)


def test_no_bias_folds_below_hoisted():
    for name in TEMPLATES:
        for schedule in ("naive", "combined", "fused"):
            plan = plan_of(load_template(name), schedule)
            assert all(not g.folded and not g.hoisted for g in plan.groups), (name, schedule)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_ladder_of_every_template(name):
    cell = load_template(name)
    plans = check_ladder(cell)
    matmuls, elementwise = matmul_nodes(cell), elementwise_nodes(cell)
    naive, combined, fused, hoisted = (plans[s] for s in ("naive", "combined", "fused", "hoisted"))
    # naive: one GEMM per matmul and one kernel per elementwise node, every step.
    assert gemm_launches(naive.layers[0].step) == len(matmuls)
    assert kernel_launches(naive.layers[0].step) == len(elementwise)
    assert naive.launches_per_step == len(matmuls) + len(elementwise)
    # combined: the x-matmuls and the h-matmuls of a gate cell each share a left operand.
    nodes = cell.by_id()
    shared = len({nodes[m].args[0] for m in matmuls}) < len(matmuls)
    assert shared == (name not in ("elman", "indrnn"))
    # fused: fewer kernels than combined; hoisted: fewer launches per step than fused.
    assert kernel_launches(fused.layers[0].step) < kernel_launches(combined.layers[0].step)
    assert hoisted.launches_per_step < fused.launches_per_step
    counts = [plans[s].launches_per_step for s in plans]
    assert counts == sorted(counts, reverse=True)
    for plan in plans.values():
        check_plan(plan)


@pytest.mark.parametrize("name", TEMPLATES)
def test_gate_cells_step_in_two_launches_when_hoisted(name):
    plan = plan_of(load_template(name), "hoisted")
    expected = {"lstm": 2, "peephole_lstm": 2, "cifg_lstm": 2, "gru": 2, "elman": 2, "indrnn": 1,
                "gru_cho": 4, "mgu": 4, "sru": 1, "residual_lstm": 2, "slstm": 2, "layernorm_lstm": 2}
    assert plan.launches_per_step == expected[name]
    assert len(plan.layers[0].prologue) == 1


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_layers_chain_outputs_into_inputs(name, schedule):
    cell = load_template(name)
    plan = plan_of(cell, schedule, layers=2)
    check_plan(plan)
    l0, l1 = plan.layers
    assert (l0.input_size, l1.input_size) == (plan.sizes.input, SIZES.hidden)
    assert l0.x.buffer == "x" and l1.x.buffer == l0.output_seq
    assert step_of(plan, 0) == step_of(plan, 1)
    for launch in [*l1.prologue, *l1.step]:
        if isinstance(launch, GemmLaunch) and plan.group(launch.group).hoisted:
            assert launch.a.buffer == l0.output_seq and launch.k == SIZES.hidden
    names0 = {b for x in [*l0.prologue, *l0.step] for b, _ in _writes(x, 0, SIZES.batch)}
    names1 = {b for x in [*l1.prologue, *l1.step] for b, _ in _writes(x, 0, SIZES.batch)}
    assert not names0 & names1, "layers keep their own buffers"


# -- cases a user can draw that the templates do not ------------------------------------------------------
def test_a_matmul_that_is_an_update_keeps_its_own_value_when_its_bias_could_fold():
    # m = x @ W is the update of c and is used once more, in m + b. Folding b into the hoisted GEMM
    # would make c take m + b.
    b = CellBuilder("fold-target")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    W, U, bias = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("b", "hidden")
    m = (x @ W).named("m")
    h_new = tanh(m + bias + c @ U).named("h_new")
    b.update(h, h_new)
    b.update(c, m)
    b.output(h_new)
    plan = plan_of(b.build(), "hoisted")
    assert all(not g.folded for g in plan.groups)
    check_plan(plan)


def test_a_weight_may_be_named_like_a_buffer():
    b = CellBuilder("names")
    x, h = b.input("x"), b.state("h")
    W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
    y, v, state = b.weight("y", "hidden"), b.weight("v", "hidden"), b.weight("state", "hidden")
    h_new = tanh(x @ W + h @ U + y * v - state).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    for schedule in SCHEDULES:
        plan = plan_of(cell, schedule, layers=2)
        weights = {f"l{layer}.{w}": plan.buffers.get(f"l{layer}.{w}") for layer in (0, 1)
                   for w in ("y", "v", "state")}
        assert all(buf is not None and buf.role == "weight" for buf in weights.values()), weights
        assert plan.buffers[plan.layers[0].output_seq].role == "output"
        check_plan(plan)


@pytest.mark.parametrize("weight", ["v_a", "gemm0_out", "out_y"])
def test_every_buffer_of_the_exported_source_has_its_own_variable(weight):
    # Buffer names become C identifiers; the value buffer of node `a` ("l0.v.a") and the weight "v_a"
    # ("l0.v_a") must not become one variable.
    b = CellBuilder("c-names")
    x, h = b.input("x"), b.state("h")
    W, U, p = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight(weight, "hidden")
    a = tanh(x @ W + h @ U).named("a")
    h_new = (a * p).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    source = generate_cuda(b.build(), SIZES, "naive").text
    declared = re.findall(r"^\s*(?:const\s+)?float\s*\*\s*(\w+)\s*=", source, re.MULTILINE)
    assert declared
    twice = sorted({v for v in declared if declared.count(v) > 1})
    assert not twice, f"declared more than once: {twice}"


def test_states_that_feed_each_other_and_an_output_that_is_a_state():
    b = CellBuilder("shift")
    x, h, c, m = b.input("x"), b.state("h"), b.state("c"), b.state("m")
    W = b.weight("W", "input", "hidden")
    b.update(h, tanh(x @ W + m))
    b.update(c, h)
    b.update(m, c)
    b.output(c)
    for schedule in SCHEDULES:
        check_plan(plan_of(b.build(), schedule, layers=2))


def test_a_state_independent_value_read_before_and_inside_the_loop():
    # t = tanh(x W) feeds a hoisted GEMM (so it is computed before the loop) and is the output.
    b = CellBuilder("pro-output")
    x, h = b.input("x"), b.state("h")
    W, W2, U = b.weight("W", "input", "hidden"), b.weight("W2", "hidden", "hidden"), b.weight("U", "hidden",
                                                                                                "hidden")
    t = tanh(x @ W).named("t")
    b.update(h, sigmoid(t @ W2 + h @ U))
    b.output(t)
    cell = b.build()
    plan = plan_of(cell, "hoisted")
    assert [g.hoisted for g in plan.groups] == [True, True, False]
    assert any(i.hoisted and "t" in i.nodes for i in plan.islands)
    check_ladder(cell)
    for schedule in SCHEDULES:
        check_plan(plan_of(cell, schedule, layers=2))


def test_unknown_schedule_and_invalid_cell_are_errors():
    with pytest.raises(CellError, match="unknown schedule"):
        plan_of(load_template("lstm"), "fastest")
    cell = load_template("lstm")
    cell.updates.pop("c")
    with pytest.raises(CellError):
        plan_of(cell, "naive")


# -- random cells ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reductions", [False, True])
@pytest.mark.parametrize("seed", [*range(15),
                                  *(pytest.param(s, marks=pytest.mark.slow) for s in range(15, 60))])
def test_plans_of_random_cells_keep_the_invariants(seed, reductions):
    cell = random_cell(np.random.default_rng(seed), reductions=reductions)
    check_ladder(cell)
    for schedule in SCHEDULES:
        check_plan(plan_of(cell, schedule, layers=1 + seed % 2))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells(reductions=True))
def test_plans_of_drawn_cells_keep_the_invariants(cell):
    check_ladder(cell)
    for schedule in SCHEDULES:
        check_plan(plan_of(cell, schedule))


def test_random_cells_cover_what_the_scheduler_must_find():
    """The generator draws every feature the scheduler handles, so the property tests exercise them."""
    seen: dict[str, int] = defaultdict(int)
    for seed in range(150):
        cell = random_cell(seed, reductions=seed % 2 == 1)
        nodes = cell.by_id()
        plan = plan_of(cell, "hoisted")
        seen["combined"] += any(len(g.matmuls) > 1 for g in plan.groups)
        seen["dependent"] += len({g.stage for g in plan.groups if not g.hoisted}) > 1
        seen["folded"] += any(g.folded for g in plan.groups)
        seen["hoisted kernel"] += any(i.hoisted for i in plan.islands)
        seen["input island"] += any(i.width_dim == "input" for i in plan.islands)
        seen["copy kernel"] += any(not i.nodes for i in plan.islands)
        seen["update is a matmul"] += any(nodes[v].op == "matmul" for v in cell.updates.values())
        seen["update is a state"] += any(nodes[v].op == "state" for v in cell.updates.values())
        seen["shared update"] += len(set(cell.updates.values())) < len(cell.updates)
        seen["dead node"] += bool(analyze(cell).dead)
        shapes = analyze(cell).shapes
        seen["vector value"] += any(len(shapes[n]) == 1 and nodes[n].op != "weight" for n in shapes)
        seen["scalar value"] += any(shapes[n] == () and nodes[n].op != "const" for n in shapes)
        launches = [k for k in (*plan.layers[0].prologue, *plan.layers[0].step)
                    if isinstance(k, KernelLaunch)]
        seen["one column between kernels"] += any(acc.kind == "col" for k in launches for _, acc in k.inputs)
        seen["hoisted reduction"] += any(i.hoisted and any(OPS[nodes[n].op].is_reduction for n in i.nodes)
                                         for i in plan.islands)
        for op in OPS:
            seen[op] += any(n.op == op for n in cell.nodes)
    missing = [k for k, v in seen.items() if v < 5]
    assert not missing, dict(seen)


@pytest.mark.parametrize("change", [{"seq": -1}, {"hidden": 0}, {"batch": 0}, {"layers": -1},
                                    {"layers": 10**9}, {"input": 2.5}, {"seq": True}])
def test_a_plan_of_impossible_sizes_is_refused(change):
    from dataclasses import replace

    with pytest.raises(CellError):
        make_plan(load_template("gru"), replace(SIZES, **change), "hoisted")


# -- row reductions ---------------------------------------------------------------------------------------
def run_on_numpy(cell: Cell, schedule: str, layers: int, seed: int) -> float:
    """The largest difference between the numpy executor's run of the schedule's plan and the reference,
    in float64, with initial states."""
    from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
    from cellfuse.graph_model import run_reference

    s = replace(SIZES, layers=layers, input=SIZES.hidden if analyze(cell).ties else SIZES.input)
    rng = np.random.default_rng(seed)
    params = init_params(cell, layers, s.input, s.hidden, seed)
    x = rng.uniform(-1, 1, (s.seq, s.batch, s.input))
    initial = {st: rng.uniform(0.5, 1.0, (layers, s.batch, s.hidden)) for st in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, layers)
    got = NumpyExecutor(make_plan(cell, s, schedule), params, np.float64).run(x, initial)
    return max(float(np.abs(got.y - ref.y).max()),
               *(float(np.abs(got.final[k] - ref.final[k]).max()) for k in ref.final))


@pytest.mark.parametrize("seed", [*range(10),
                                  *(pytest.param(s, marks=pytest.mark.slow) for s in range(10, 40))])
def test_random_cells_that_reduce_rows_match_the_reference_under_every_schedule(seed):
    cell = random_cell(seed, reductions=True)
    for schedule in SCHEDULES:
        assert run_on_numpy(cell, schedule, 1 + seed % 2, seed) < 1e-9, schedule


def test_a_layer_norm_is_one_kernel_with_its_reductions():
    """The layer-normalised LSTM's step: the recurrent GEMM, then one kernel that normalises x W, h U and
    the cell in passes over each row: no value of the norm goes through global memory."""
    plan = plan_of(load_template("layernorm_lstm"), "hoisted")
    assert [kind for kind, _ in step_of(plan)] == ["gemm", "kernel"]
    [kernel] = [k for k in plan.layers[0].step if isinstance(k, KernelLaunch)]
    assert kernel.width == SIZES.hidden and sum(i.op.is_reduction for i in kernel.body) == 18
    assert [v for v, _ in kernel.outputs] == ["c_new", "h_new"]
    assert all(acc.kind != "col" for _, acc in (*kernel.inputs, *kernel.outputs))


@pytest.mark.parametrize("schedule", ["persistent", "tensor"])
def test_a_persistent_step_leaves_the_layer_norm_of_x_w_to_a_kernel_before_the_loop(schedule):
    """The norm of x W depends on no state: one kernel before the loop normalises every step's rows, and
    the step's kernel, a block per row in the persistent kernel, reads the normalised x W in place of x W
    and normalises only h U and the cell. (`graph` keeps it in the step: see `_hoist_reductions`.)"""
    plan = plan_of(load_template("layernorm_lstm"), schedule)
    [kernel] = [k for k in plan.layers[0].step if isinstance(k, KernelLaunch)]
    [before] = [k for k in plan.layers[0].prologue if isinstance(k, KernelLaunch)]
    assert before.hoisted and before.row_kind == "seq" and sum(i.op.is_reduction for i in before.body) == 8
    assert sum(i.op.is_reduction for i in kernel.body) == 10
    assert [v for v, _ in before.outputs] == ["ln_xi", "ln_xf", "ln_xo", "ln_xg"]
    assert {v for v, _ in before.outputs} <= {v for v, _ in kernel.inputs}
    assert not {"xi", "xf", "xo", "xg"} & {v for v, _ in kernel.inputs}
    graph = plan_of(load_template("layernorm_lstm"), "graph")
    assert not any(isinstance(k, KernelLaunch) for k in graph.layers[0].prologue)


def test_a_row_reduction_before_the_loop_and_its_column_read_in_every_step():
    # m = row_mean(tanh(x W)) depends on no state and feeds a hoisted GEMM: it is computed before the loop,
    # and the step reads it as one number per row.
    b = CellBuilder("hoisted-mean")
    x, h = b.input("x"), b.state("h")
    W, W2, U = (b.weight("W", "input", "hidden"), b.weight("W2", "hidden", "hidden"),
                b.weight("U", "hidden", "hidden"))
    t = tanh(x @ W).named("t")
    m = apply("row_mean", t).named("m")
    b.update(h, tanh((t - m) @ W2 + h @ U + m).named("h_new"))
    b.output(h)
    cell = b.build()
    plan = plan_of(cell, "hoisted")
    assert any(i.hoisted and "m" in i.nodes for i in plan.islands)
    reads = [acc for k in plan.layers[0].step if isinstance(k, KernelLaunch)
             for v, acc in k.inputs if v == "m"]
    assert [(acc.kind, acc.ld, acc.slot) for acc in reads] == [("col", 1, "t")]
    for schedule in SCHEDULES:
        check_plan(plan_of(cell, schedule, layers=2))
        assert run_on_numpy(cell, schedule, 2, 0) < 1e-9, schedule


def test_an_input_wide_value_computed_in_the_step_runs_before_the_tie_that_reads_it():
    """d = h / (1 + sigmoid(x)) and m = min(h, relu(x)): the input-wide kernels of the stage must run
    before the hidden-wide ones that read them (sorted by width alone, they came after, and every
    schedule read values nothing had written yet)."""
    b = CellBuilder("tie in the step")
    x, h = b.input("x"), b.state("h")
    U = b.weight("U", "hidden", "hidden")
    d = (h / (b.const(1.0, "one") + sigmoid(x).named("s")).named("den")).named("d")
    m = apply("min", h, apply("relu", x).named("r")).named("m")
    h_new = tanh((sigmoid(d).named("g") @ U).named("hu") + m).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    for schedule in SCHEDULES:
        plan = plan_of(cell, schedule)
        order = [launch.island for launch in plan.layers[0].step if isinstance(launch, KernelLaunch)]
        written: set[str] = set()
        for launch in plan.layers[0].step:
            if isinstance(launch, KernelLaunch):
                reads = {v for v, acc in launch.inputs if acc.buffer.startswith("l0.v.")}
                assert reads <= written, f"{schedule}: {launch.island} of {order} reads {reads - written}"
                written |= {v for v, _ in launch.outputs}
        assert run_on_numpy(cell, schedule, 2, 0) < 1e-9, schedule
