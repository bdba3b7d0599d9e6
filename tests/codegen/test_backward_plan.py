"""The backward Plan's shape: a reverse loop per layer (the last layer first) of adjoint kernels and dA
GEMMs on the forward's stacked weights, then the weight gradients as GEMMs over all steps and column
sums; the adjoints of row reductions and of the columns they give; its kernels compile with nvcc. Its
gradients are checked in tests/gpu_runtime/test_numpy_backward.py."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from compile_cuda import nvcc_cubin
from random_cells import random_cell

from cellfuse.codegen import make_plan
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.kernel_set import backward_kernels, kernel_source
from cellfuse.codegen.lowering import Gemm, Kernel, Loop, Persistent
from cellfuse.codegen.plan import Access, GemmLaunch, Instr, KernelLaunch, grad_of, launch_name
from cellfuse.graph_model import OPS, CellError, Sizes, analyze, load_template, template_names

SIZES = Sizes(seq=5, batch=3, input=6, hidden=4, layers=2)


def plan_of(name: str, schedule: str, sizes: Sizes = SIZES):
    cell = load_template(name)
    if analyze(cell).ties:
        sizes = replace(sizes, input=sizes.hidden)
    return backward_plan(make_plan(cell, sizes, schedule, save_steps=True))


def test_the_lstm_step_is_its_kernel_then_one_gemm_on_the_stacked_recurrent_weights():
    plan = plan_of("lstm", "hoisted")
    assert [launch_name(launch) for launch in plan.layers[0].step] == ["k0_grad", "gemm1 dA"]
    (kernel, gemm) = plan.layers[0].step
    assert kernel.accumulate and kernel.rows == SIZES.batch
    # dh_{t-1} += d[hi hf ho hg]_t @ [U_i U_f U_o U_g]^T
    assert (gemm.trans_w, gemm.trans_a, gemm.accumulate) == (True, False, True)
    # (the gradient of h @ U is that of x @ W, their sum's: one buffer holds both, see the next test)
    assert gemm.w == "l1.gemm1.w" and gemm.a.buffer == grad_of("l1.gemm0.out")
    assert (gemm.m, gemm.n, gemm.k) == (SIZES.batch, SIZES.hidden, 4 * SIZES.hidden)
    assert gemm.c.buffer == grad_of("l1.out.y") and gemm.c.slot == "t"
    after = [launch_name(launch) for launch in plan.layers[0].after]
    # dx of the hoisted GEMM over all steps, both weight gradients, the four biases' column sums
    assert after[:3] == ["gemm0 dA", "gemm0 dW", "gemm1 dW"]
    assert sorted(after[3:]) == [f"sum k0.b_{g}" for g in "fgio"]
    dw = plan.layers[0].after[2]
    assert dw.trans_a and not dw.trans_w and dw.accumulate
    assert (dw.m, dw.n, dw.k) == (SIZES.hidden, 4 * SIZES.hidden, SIZES.seq * SIZES.batch)
    assert dw.a.buffer == "l1.out.y" and dw.a.slot == "all"  # h_{t-1} of every step: rows 0 .. T-1


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
def test_the_lstms_gradients_of_its_two_gemms_are_one_buffer_stored_once(schedule):
    # gates = x @ W + h @ U: the step kernel's gradients of both GEMM outputs are the gates' gradient
    plan = plan_of("lstm", schedule)
    assert grad_of("l0.gemm1.out") not in plan.buffers and grad_of("l0.gemm0.out") in plan.overwritten
    kernel = plan.layers[1].step[0]
    places = [(acc.buffer, acc.col) for _, acc in kernel.outputs if acc.buffer == grad_of("l0.gemm0.out")]
    assert sorted(places) == [(grad_of("l0.gemm0.out"), i * SIZES.hidden) for i in range(4)]
    stored = {v for v, _ in kernel.outputs}
    # what only the stores left out needed is not computed (the gradients named for h @ U's columns)
    assert all(v in stored or any(v in (i.args + ((i.dy, i.y) if hasattr(i, "dy") else ()))
                                  for i in kernel.body) for v in (i.result for i in kernel.body))
    weights = [g for g in plan.layers[1].after if isinstance(g, GemmLaunch) and g.group.endswith("dW")]
    assert [g.w for g in weights] == [grad_of("l0.gemm0.out")] * 2


def test_the_grus_gradients_of_its_gemms_stay_apart():
    # r * (h @ U_n): the gradient of h @ U_n is not that of x @ W_n
    plan = plan_of("gru", "graph")
    assert {grad_of("l0.gemm0.out"), grad_of("l0.gemm1.out")} <= plan.buffers.keys()


@pytest.mark.parametrize("schedule, where", [("hoisted", "after"), ("naive", "step")])
def test_the_pass_without_dx_leaves_out_the_first_layers_gemms_into_dx_only(schedule, where):
    whole = plan_of("lstm", schedule)
    without = whole.without_input_grad()
    assert [lb.layer for lb in without.layers] == [1, 0]
    assert without.layers[0] == whole.layers[0]  # the second layer's dA is the first layer's dy
    first, kept = getattr(whole.layers[1], where), getattr(without.layers[1], where)
    left_out = [launch for launch in first if launch not in kept]
    assert left_out and all(isinstance(launch, GemmLaunch) and launch.c.buffer == grad_of("x")
                            for launch in left_out)
    assert [launch for launch in first if launch not in left_out] == list(kept)
    other = "step" if where == "after" else "after"
    assert getattr(without.layers[1], other) == getattr(whole.layers[1], other)


def test_layers_run_last_first_each_a_reverse_loop_then_what_follows_it():
    plan = plan_of("gru", "graph")
    assert [lb.layer for lb in plan.layers] == [1, 0]
    instructions = plan.instructions()
    loops = [i for i, instr in enumerate(instructions) if isinstance(instr, Loop)]
    assert len(loops) == 2 and loops[0] == 0
    assert all(instructions[i].reverse for i in loops)
    assert list(instructions[0].steps(SIZES.seq)) == list(range(SIZES.seq - 1, -1, -1))
    assert all(isinstance(instr, Gemm | Kernel) for i, instr in enumerate(instructions) if i not in loops)
    # the layer below adds the gradient of its output where layer 1's dx goes
    dx = next(launch for launch in plan.layers[0].after if launch_name(launch) == "gemm0 dA")
    assert dx.c.buffer == grad_of("l0.out.y") and dx.c.slot == "all+1"


@pytest.mark.parametrize("schedule, gemms", [("naive", 6), ("combined", 3), ("hoisted", 2)])
def test_the_step_is_the_forward_step_in_reverse_with_one_dA_gemm_per_gemm_group(schedule, gemms):
    """Cho's GRU: x @ [W_r, W_z, W_n] (before the loop once hoisted), h @ [U_r, U_z] and (r*h) @ U_n,
    each matmul alone in `naive`."""
    plan = plan_of("gru_cho", schedule)
    step = plan.layers[0].step
    assert sum(isinstance(launch, GemmLaunch) for launch in step) == gemms
    # (r*h) @ U_n's dA before the adjoint of the kernel that computed r*h, which reads its gradient
    forward = plan.forward.layers[0].step
    assert [launch_name(b).split()[0].removesuffix("_grad") for b in step] == \
        [launch_name(f) for f in reversed(forward)]


def test_gradient_buffers_mirror_the_forward_buffers():
    plan = plan_of("lstm", "hoisted")
    fwd = plan.forward.buffers
    for name in ("l0.state.c", "l0.out.y", "l0.gemm0.out", "l0.gemm0.w", "x"):
        assert (plan.buffers[grad_of(name)].rows, plan.buffers[grad_of(name)].width) == (fwd[name].rows,
                                                                                          fwd[name].width)
        assert plan.buffers[grad_of(name)].role == "grad"
    assert plan.buffers[grad_of("l0.state.c")].rows == "seq+1"
    assert plan.buffers["ones"].role == "ones" and plan.buffer_elements("ones") == SIZES.seq * SIZES.batch
    # the per-row gradient of b_i, which each step of the loop adds into B rows, summed after the loop
    part = grad_of("l0.k0") + ".b_i"
    assert plan.buffers[part].rows == "batch"
    (kernel,) = [k for k in plan.layers[-1].step if isinstance(k, KernelLaunch)]
    assert [acc.slot for _, acc in kernel.outputs if acc.buffer == part] == ["fixed"] and kernel.adds(
        dict((acc.buffer, acc) for _, acc in kernel.outputs)[part])
    (total,) = [g for g in plan.layers[-1].after if g.c.buffer == grad_of("l0.b_i")]
    assert (total.w, total.m, total.k, total.n) == (part, 1, SIZES.batch, SIZES.hidden)


def test_a_plan_that_does_not_save_its_steps_is_refused():
    with pytest.raises(CellError, match="save_steps=True"):
        backward_plan(make_plan(load_template("lstm"), SIZES, "graph"))


def test_a_layer_norm_step_is_one_adjoint_kernel_that_sums_over_rows():
    """layernorm_lstm, hoisted: the adjoint of its one fused kernel (every layer norm of the step), then
    dh; the adjoint recomputes the norms, then sums the gradients of their means and spreads over rows."""
    plan = plan_of("layernorm_lstm", "hoisted")
    assert [launch_name(launch) for launch in plan.layers[0].step] == ["k0_grad", "gemm1 dA"]
    kernel = plan.layers[0].step[0]
    sums = {i.result.split("#")[0] for i in kernel.body if isinstance(i, Instr) and i.op.name == "row_sum"}
    assert {grad_of(v) for v in ("mu_x", "rstd_x", "mu_h", "rstd_h", "mu_c", "rstd_c")} <= sums
    # the gains and biases of the norms are [N] weights: per row, summed over all rows after the loop
    assert "sum k0.alpha_c" in [launch_name(launch) for launch in plan.layers[0].after]
    assert "__shared__ float cf_partial" in kernel_source(kernel, "cf_k0_grad")


def test_a_column_that_crosses_kernels_gets_its_gradient_per_row():
    """In `naive` mu_c = row_mean(c_new) is a kernel of its own and d_c = c_new - mu_c another: the adjoint
    of d_c's kernel adds the row sum of its gradient parts into mu_c's gradient buffer, one number per
    row and step, which the adjoint of mu_c's kernel reads and spreads back over the row of c_new."""
    plan = plan_of("layernorm_lstm", "naive")
    by_name = {launch_name(launch): launch for launch in plan.layers[0].step}
    forward = plan.forward.layers[plan.layers[0].layer]
    kernels = [launch for launch in forward.step if isinstance(launch, KernelLaunch)]
    mean = next(k for k in kernels if any(i.result == "mu_c" for i in k.body))
    sub = next(k for k in kernels if any(i.result == "d_c" for i in k.body))
    column = dict(mean.outputs)["mu_c"]
    assert column.kind == "col" and plan.buffers[grad_of(column.buffer)].width == 1
    stored = dict((v.split("#")[0], acc) for v, acc in by_name[f"{sub.island}_grad"].outputs)
    assert stored[grad_of("mu_c")] == Access(grad_of(column.buffer), "col", 1, 0, "t")
    read = dict(by_name[f"{mean.island}_grad"].inputs)
    assert read[grad_of("mu_c")] == stored[grad_of("mu_c")]
    step = [launch_name(launch) for launch in plan.layers[0].step]
    assert step.index(f"{sub.island}_grad") < step.index(f"{mean.island}_grad")


def test_an_op_without_a_derivative_is_refused_by_node():
    forward = make_plan(load_template("gru"), SIZES, "fused", save_steps=True)
    lp = forward.layers[1]
    k = next(launch for launch in lp.step if isinstance(launch, KernelLaunch))
    no_grad = replace(k.body[-1].op, name="tanh_nograd", grad=None, cuda_grad=None)
    body = (*k.body[:-1], replace(k.body[-1], op=no_grad))
    lp.step[lp.step.index(k)] = replace(k, body=body)
    with pytest.raises(CellError, match=rf"node '{k.body[-1].result}' \(kernel {k.island}\): op "
                                        "'tanh_nograd' has no derivative"):
        backward_plan(forward)


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("schedule", ["naive", "hoisted", "persistent", "tensor"])
def test_backward_kernels_compile(name, schedule, tmp_path):
    check_backward_kernels(compile_plan(name, schedule), tmp_path)


def compile_plan(name: str, schedule: str):
    cell = load_template(name)
    sizes = Sizes(3, 2, 24, 40, 2)
    if analyze(cell).ties:
        sizes = replace(sizes, input=sizes.hidden)
    return make_plan(cell, sizes, schedule, save_steps=True)


@pytest.mark.parametrize("schedule", ["naive", "hoisted", "persistent", "tensor"])
def test_backward_kernels_of_every_template_add_into_their_gradients(schedule):
    """What test_backward_kernels_compile checks of the source before it compiles it (the slow tier);
    the default tier compiles a few of these kernels (test_cuda_compile)."""
    for name in template_names():
        backward_source(compile_plan(name, schedule))


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("seed", [0, 1, 2, 4])  # cells with row_mean, row_sum, or both
def test_backward_kernels_of_random_cells_that_reduce_rows_compile(seed, tmp_path):
    cell = random_cell(seed, reductions=True)
    assert any(OPS[n.op].is_reduction for n in cell.nodes)
    check_backward_kernels(make_plan(cell, Sizes(3, 2, 24, 40, 1), "fused", save_steps=True), tmp_path)


def check_backward_kernels(forward, tmp_path) -> None:
    nvcc_cubin(backward_source(forward), tmp_path)


def backward_source(forward) -> str:
    """The source of the backward kernels, each of whose launches adds into its gradients."""
    plan = backward_plan(forward)
    kernels = backward_kernels(plan)
    launches = [launch for lb in plan.layers for launch in (*(() if lb.persistent else lb.step), *lb.after)
                if isinstance(launch, KernelLaunch)]
    assert all(launch.accumulate for launch in launches)
    persistent = [lb.persistent for lb in plan.layers if lb.persistent]
    assert launches or persistent
    assert set(kernels.name_of) == {*launches, *persistent}
    source = kernels.module_source()
    assert "+= " in source
    return source


@pytest.mark.parametrize("name, waits, exchanged", [
    ("lstm", 1, True), ("gru", 1, True), ("gru_cho", 2, False), ("mgu", 2, True), ("sru", 0, False),
    ("layernorm_lstm", 2, False),
])
def test_a_persistent_forward_gets_a_persistent_reverse_loop_where_it_fits(name, waits, exchanged):
    """Each layer's reverse loop is one cooperative launch that waits as often per step as the forward:
    the adjoint kernels write dC, every block's, then dA += dC @ W^T. Where the adjoint writes the whole
    of dC in step with the GEMM (side by side, the gradients of the stacked gates), dC also goes through
    an exchange and no grid-wide barrier is left; Cho's GRU, whose second GEMM's dC comes from the step
    before in a reverse loop, keeps its barriers. The adjoint of a layer norm reduces rows: it runs a
    block per row, behind a barrier (it reads dh, which every block's dA GEMM added to), and writes dC,
    which the GEMM reads whole after one."""
    plan = plan_of(name, "persistent")
    program = plan.instructions()
    assert [i.launch for i in program if isinstance(i, Persistent)] == [lb.persistent for lb in plan.layers]
    assert not any(isinstance(i, Loop) for i in program)
    for lb in plan.layers:
        p = lb.persistent
        assert p.reverse and p.waits_per_step == waits and p.layer == lb.layer
        assert bool(p.exchange) == exchanged and p.barriers_per_step == (0 if exchanged else waits)
        assert [item.launch for item in p.items] == list(lb.step)
        gemms = [item.launch for item in p.items if isinstance(item.launch, GemmLaunch)]
        assert all(g.trans_w and g.accumulate for g in gemms)
        # a wait right before each dA GEMM, and before an adjoint that runs a block per row, none
        # elsewhere: what the adjoints write ahead of the first is a row block of dC that no block
        # still reads
        assert [item.barrier for item in p.items] == [isinstance(item.launch, GemmLaunch) or item.by_rows
                                                      for item in p.items]
        assert [item.by_rows for item in p.items] == [name == "layernorm_lstm" and not isinstance(
            item.launch, GemmLaunch) for item in p.items]
        for ex in p.exchange:  # dC, whole: the adjoint's outputs side by side, read in the same step
            assert ex.lag == 0 and ex.buffer.startswith("∂") and ex.width in {g.k for g in gemms}
    assert all(lb.persistent is not None for lb in plan.layers) and plan.launches_per_step == 0


def test_a_gradient_one_kernel_writes_whole_is_stored_not_added_to():
    """The LSTM's adjoint kernel is the only writer of its GEMM outputs' gradient (one buffer for both
    GEMMs; each step's rows, side by side across the width): it stores it, and it starts as NaN instead
    of zeros, so a read before the write would show. dc and dh are seeded and collect several launches'
    gradients, and the biases' per-row gradients every step's: added to."""
    plan = plan_of("lstm", "hoisted")
    kernel = plan.layers[0].step[0]
    expected = {grad_of("l1.gemm0.out")}
    assert grad_of("l0.gemm0.out") in plan.overwritten
    assert expected <= plan.overwritten and kernel.overwrites == expected
    stored = {acc.buffer: kernel.adds(acc) for _, acc in kernel.outputs}
    biases = {grad_of(f"l1.k0.b_{g}") for g in "ifog"}  # each step adds into their B rows
    assert stored == {**dict.fromkeys(expected, False), **dict.fromkeys(biases, True),
                      grad_of("l1.state.c"): True}
    assert np.isnan(plan.start_value(grad_of("l1.gemm0.out")))
    assert plan.start_value(grad_of("l1.state.c")) == 0
    # what every run must put back: the buffers added into, not the overwritten ones nor the ones
    restarted = {name for name in plan.buffers if plan.restarted(name)}
    ones = {name for name, b in plan.buffers.items() if b.role == "ones"}
    assert ones and restarted == set(plan.buffers) - plan.overwritten - ones
    assert grad_of("l1.state.c") in restarted and grad_of("x") in restarted
    assert all(not g.accumulate or g.c.buffer not in plan.overwritten
               for lb in plan.layers for g in (*lb.step, *lb.after) if isinstance(g, GemmLaunch))


def test_a_gradient_written_in_part_twice_or_by_a_gemm_is_added_to():
    from cellfuse.codegen.backward_plan import written_once
    from cellfuse.codegen.plan import Buffer

    buffers = {n: Buffer(n, "seq", 8, "grad") for n in ("a", "b", "c")}

    def kernel(*outputs: Access) -> KernelLaunch:
        return KernelLaunch("k", "batch", 3, 4, (), tuple((f"v{i}", o) for i, o in enumerate(outputs)), (),
                            False, accumulate=True)

    half = [Access(n, "row", 8, 0, "t") for n in "abc"]
    whole = [kernel(a, replace(a, col=4)) for a in half]
    assert written_once(whole, buffers, set()) == {"a", "b", "c"}
    assert written_once(whole, buffers, {"b"}) == {"a", "c"}  # seeded
    assert written_once([kernel(half[0]), *whole[1:]], buffers, set()) == {"b", "c"}  # half of a
    assert written_once([*whole, kernel(half[1], replace(half[1], col=4))], buffers, set()) == {"a", "c"}
    gemm = GemmLaunch("g dA", "batch", 3, 8, 4, Access("x", "row", 4), "w", half[2], None, accumulate=True)
    assert written_once([*whole, gemm], buffers, set()) == {"a", "b"}
