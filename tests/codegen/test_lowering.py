"""The lowering of a Plan to a program, and the order in which its streams may run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cellfuse.codegen import make_plan, plan_kernels
from cellfuse.codegen.lowering import (
    MAIN,
    SIDE,
    Copy,
    Gemm,
    Kernel,
    Loop,
    Program,
    Record,
    Wait,
    execution_order,
    lower,
)
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import Sizes, analyze, init_params, load_template, run_reference, template_names

SIZES = Sizes(seq=7, batch=2, input=4, hidden=3, layers=2)


def test_an_unchunked_program_is_copies_prologue_and_one_loop_per_layer():
    plan = make_plan(load_template("lstm"), SIZES, "fused")
    program = lower(plan)
    assert program.streams == 1 and program.events == 0
    kinds = [type(i).__name__ for i in program.instructions]
    # per layer: the initial h and c, the loop, the final h and c
    assert kinds == ["Copy", "Copy", "Loop", "Copy", "Copy"] * 2
    loop = program.instructions[2]
    assert loop.first == 0 and loop.last is None and not loop.reverse
    assert list(loop.steps(plan.sizes.seq)) == list(range(plan.sizes.seq))
    assert [i.launch for i in loop.body] == plan.layers[0].step


@pytest.mark.parametrize("schedule", ["persistent", "tensor"])
def test_a_persistent_kernel_copies_its_layer_s_states_in_and_out_itself(schedule):
    """No copies around a persistent launch: it carries, per state, where the initial value comes from,
    where its steps read it and where the final value goes, and its kernel copies its own elements."""
    plan = make_plan(load_template("lstm"), SIZES, schedule)
    program = lower(plan)
    assert not any(isinstance(i, Copy) for i in program.instructions)
    for lp in plan.layers:
        states = lp.persistent.states
        assert [(c.initial.buffer, c.read, c.final.buffer) for c in states] == [
            (f"init.{s}", lp.state_read[s], f"final.{s}") for s in plan.state_ids]
        assert all(c.initial.block == c.final.block == lp.layer for c in states)
    kernels = plan_kernels(plan).sources.values()
    assert all("the block's initial states are where its first step reads them" in k for k in kernels)
    assert all("the block wrote its final states" in k for k in kernels)


def test_hoisted_work_runs_in_chunks_on_the_side_stream():
    plan = make_plan(load_template("lstm"), SIZES, "hoisted")
    assert plan.chunk_steps == 7
    plan = replace(plan, chunk_steps=3)  # chunks of steps 0-2, 3-5, 6
    program = lower(plan)
    assert program.streams == 2
    side = [i for i in program.instructions if i.stream == SIDE]
    gemms = [i for i in side if isinstance(i, Gemm)]
    assert [g.steps for g in gemms] == [(0, 3), (3, 6), (6, 7)] * 2
    loops = [i for i in program.instructions if isinstance(i, Loop)]
    assert [(lp.first, lp.last) for lp in loops] == [(0, 3), (3, 6), (6, 7)] * 2
    assert all(i.stream == MAIN for i in program.instructions if isinstance(i, Loop | Copy))
    # every loop waits for its own chunk's hoisted work first
    for i, instr in enumerate(program.instructions):
        if isinstance(instr, Loop):
            wait = program.instructions[i - 1]
            assert isinstance(wait, Wait) and wait.stream == MAIN
    one = lower(plan, one_stream=True)
    assert one.streams == 1 and not any(isinstance(i, Record | Wait) for i in one.instructions)


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("chunk", [1, 3, 7])
@pytest.mark.parametrize("prefer", [MAIN, SIDE])
def test_chunked_streams_match_the_reference_in_either_order(name, chunk, prefer):
    """The hoisted work as early as its events allow, or as late as the loop allows: both right."""
    cell = load_template(name)
    # a cell that ties the two widths runs only where they are equal
    sizes = replace(SIZES, input=SIZES.hidden) if analyze(cell).ties else SIZES
    assert_matches_reference(cell, replace(make_plan(cell, sizes, "hoisted"), chunk_steps=chunk), prefer)


def assert_matches_reference(cell, plan, prefer: int) -> None:
    sizes = plan.sizes
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((sizes.seq, sizes.batch, sizes.input))
    initial = {s: rng.standard_normal((sizes.layers, sizes.batch, sizes.hidden)) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial})
    got = NumpyExecutor(plan, params, np.float64, prefer).run(x, initial)
    np.testing.assert_allclose(got.y, ref.y, rtol=1e-5, atol=1e-6)
    for s in cell.updates:
        np.testing.assert_allclose(got.final[s], ref.final[s], rtol=1e-5, atol=1e-6)


def _without(program: Program, drop) -> Program:
    return replace(program, instructions=tuple(i for i in program.instructions if not drop(i)))


@pytest.mark.parametrize("prefer", [MAIN, SIDE])
def test_a_missing_wait_gives_a_wrong_result_in_one_of_the_orders(prefer):
    """Why both orders are run: each catches the Waits of one stream."""
    cell = load_template("gru")
    plan = replace(make_plan(cell, SIZES, "hoisted"), chunk_steps=3)
    params = init_params(cell, SIZES.layers, SIZES.input, SIZES.hidden, seed=1)
    x = np.random.default_rng(0).standard_normal((SIZES.seq, SIZES.batch, SIZES.input))
    initial = {"h": np.zeros((SIZES.layers, SIZES.batch, SIZES.hidden))}
    ex = NumpyExecutor(plan, params, np.float64, prefer)
    # MAIN first runs the loop before the hoisted work it skipped waiting for; SIDE first runs layer 1's
    # hoisted GEMM before layer 0 wrote what it reads.
    stream = MAIN if prefer == MAIN else SIDE
    ex.program = _without(ex.program, lambda i: isinstance(i, Wait) and i.stream == stream and i.event > 0)
    assert not np.all(np.isfinite(ex.run(x, initial).y))


def test_a_wavefront_gives_each_layer_streams_of_its_own():
    """Layer l's loop on stream 2l and its hoisted chunks on 2l + 1; a chunk of an upper layer's hoisted
    work waits for the lower layer's steps of that chunk, on the lower layer's stream, and nothing else
    ties the layers, so layer l's chunk j runs beside layer l-1's chunk j + 1."""
    sizes = replace(SIZES, layers=3)
    plan = replace(make_plan(load_template("lstm"), sizes, "wavefront"), chunk_steps=3, layer_streams=True)
    program = lower(plan)
    assert program.streams == 6 and program.sharing == 3
    loops = [i for i in program.instructions if isinstance(i, Loop)]
    assert [lp.stream for lp in loops] == [0] * 3 + [2] * 3 + [4] * 3
    assert all(inner.stream == lp.stream for lp in loops for inner in lp.body)
    gemms = [i for i in program.instructions if isinstance(i, Gemm)]
    assert [g.stream for g in gemms] == [1] * 3 + [3] * 3 + [5] * 3
    recorded_on = {i.event: i.stream for i in program.instructions if isinstance(i, Record)}
    for layer in (1, 2):
        waits = [i for i in program.instructions if isinstance(i, Wait) and i.stream == 2 * layer + 1]
        assert [recorded_on[w.event] for w in waits] == [0] + [2 * layer - 2] * 3  # the fork, then chunks
    assert list(execution_order(program, MAIN)) and list(execution_order(program, SIDE))
    one = lower(plan, one_stream=True)
    assert one.streams == 1 and one.sharing == 1
    lstm = load_template("lstm")
    assert lower(make_plan(lstm, replace(SIZES, seq=11), "wavefront")).sharing == 2  # chunks of 10 and 1
    # nothing to overlap: one layer, or one chunk of steps per layer (SIZES has 7, the chunk is 10)
    assert not make_plan(lstm, replace(SIZES, seq=11, layers=1), "wavefront").layer_streams
    assert not make_plan(lstm, SIZES, "wavefront").layer_streams


def test_a_deep_wavefront_runs_eight_layers_side_by_side_at_most():
    """Layer l takes the streams of layer l - 8, after it: a stack of 11 layers makes 16 streams."""
    cell = load_template("gru")
    sizes = replace(SIZES, layers=11)
    plan = replace(make_plan(cell, sizes, "wavefront"), chunk_steps=3, layer_streams=True)
    program = lower(plan)
    assert program.streams == 16 and program.sharing == 8
    loops = [i for i in program.instructions if isinstance(i, Loop)]
    assert [lp.stream for lp in loops][::3] == [0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4]
    assert_matches_reference(cell, plan, MAIN)
    assert_matches_reference(cell, plan, SIDE)


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("prefer", [MAIN, SIDE])
def test_a_wavefront_matches_the_reference_in_either_order(name, chunk, prefer):
    cell = load_template(name)
    sizes = replace(SIZES, layers=3, input=SIZES.hidden)
    plan = replace(make_plan(cell, sizes, "wavefront"), chunk_steps=chunk, layer_streams=True)
    assert_matches_reference(cell, plan, prefer)


@pytest.mark.parametrize("prefer", [MAIN, SIDE])
def test_a_wavefront_missing_a_wait_between_layers_gives_a_wrong_result(prefer):
    """The upper layers' streams run as early as they may: without its Waits for the layer below (SIDE)
    or for its own hoisted chunks (MAIN), a layer reads what nothing wrote yet."""
    cell = load_template("gru")
    sizes = replace(SIZES, layers=3)
    plan = replace(make_plan(cell, sizes, "wavefront"), chunk_steps=3, layer_streams=True)
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden, seed=1)
    x = np.random.default_rng(0).standard_normal((sizes.seq, sizes.batch, sizes.input))
    initial = {"h": np.zeros((sizes.layers, sizes.batch, sizes.hidden))}
    ex = NumpyExecutor(plan, params, np.float64, prefer)
    stream = 5 if prefer == SIDE else 4  # the top layer's side stream, or its loop's
    ex.program = _without(ex.program, lambda i: isinstance(i, Wait) and i.stream == stream and i.event > 0)
    assert not np.all(np.isfinite(ex.run(x, initial).y))


def test_execution_order_refuses_what_a_gpu_would_run_wrongly():
    plan = make_plan(load_template("elman"), SIZES, "fused")
    body = lower(plan).instructions
    late = Program(plan, (Wait(0, MAIN), *body, Record(0, MAIN)), 1, 1)
    with pytest.raises(ValueError, match="before it is recorded"):
        list(execution_order(late))
    twice = Program(plan, (Record(0, MAIN), Record(0, MAIN)), 1, 1)
    with pytest.raises(ValueError, match="recorded twice"):
        list(execution_order(twice))
    beyond = Program(plan, (Record(0, SIDE),), 1, 1)
    with pytest.raises(ValueError, match="beyond"):
        list(execution_order(beyond))


def test_a_loop_runs_in_reverse():
    loop = Loop((), first=2, last=6, reverse=True)
    assert list(loop.steps(10)) == [5, 4, 3, 2]
    assert list(Loop((), first=0, last=None, reverse=True).steps(3)) == [2, 1, 0]


def test_every_executor_refuses_an_unknown_instruction(monkeypatch):
    from cellfuse.codegen import cuda_export

    plan = make_plan(load_template("elman"), SIZES, "hoisted")
    params = init_params(load_template("elman"), SIZES.layers, SIZES.input, SIZES.hidden)
    ex = NumpyExecutor(plan, params)
    with pytest.raises(TypeError, match="cannot run"):
        ex.execute(object())
    with pytest.raises(TypeError, match="cannot run"):
        ex.execute(Loop((object(),)))
    with pytest.raises(TypeError, match="unknown instruction"):
        list(execution_order(Program(plan, (object(),), 1, 0)))

    real = cuda_export.lower
    monkeypatch.setattr(cuda_export, "lower", lambda p, one_stream: Program(
        p, (*real(p, one_stream).instructions, object()), 1, 0))
    with pytest.raises(TypeError, match="cannot emit"):
        cuda_export.emit(plan)


def test_the_exporter_refuses_a_program_on_two_streams(monkeypatch):
    from cellfuse.codegen import cuda_export

    plan = replace(make_plan(load_template("lstm"), SIZES, "hoisted"), chunk_steps=3)
    real = cuda_export.lower
    monkeypatch.setattr(cuda_export, "lower", lambda p, one_stream: real(p))
    with pytest.raises(ValueError, match="one stream"):
        cuda_export.emit(plan)


def test_kernels_carry_their_bodies():
    """A closed plan: a kernel launch says what it computes, with the op table's entries and literals."""
    plan = make_plan(load_template("cifg_lstm"), SIZES, "fused")
    program = lower(plan)
    kernels = [i for lp in program.instructions if isinstance(lp, Loop) for i in lp.body
               if isinstance(i, Kernel)]
    ops = {instr.op.name for k in kernels for instr in k.launch.body}
    assert {"sigmoid", "tanh", "sub", "mul", "add"} <= ops
    # f = 1 - i: the constant 1 is a literal of the instruction, not a value read from memory
    literal = [instr for k in kernels for instr in k.launch.body
               if any(not isinstance(a, str) for a in instr.args)]
    assert literal and all(instr.op.is_elementwise for instr in literal)


@pytest.mark.parametrize("cell, inputs, shared", [("lstm", 512, ["gemm1 dW"]), ("lstm", 1024, ["gemm1 dW"]),
                                                  ("lstm", 256, []), ("gru", 512, [])])
def test_a_gemm_after_one_of_the_same_w_on_tensor_cores_reads_its_w_region(cell, inputs, shared):
    """The LSTM's two weight gradients multiply by one gates' gradient (the backward plan's same_gradients):
    the second reads W's region where the first made it, where its own operands end before that (its
    rows, h's, no more than the first's, x's); the GRU's gradients of x @ W and h @ U differ."""
    from cellfuse.codegen.backward_plan import backward_plan

    plan = make_plan(load_template(cell), Sizes(100, 64, inputs, 512), "tensor", save_steps=True)
    instructions = backward_plan(plan).instructions()
    _assert_shared(instructions, shared)


def test_the_drop_in_lstms_weight_gradients_share_w_across_its_biases_column_sums():
    """torch's LSTM has a bias in each GEMM: under `graph` its input GEMM runs in chunks of 640 rows on
    CUDA cores and adds the bias (folded), and its weights' gradient, over all 6400 rows on tensor cores,
    is followed by the bias's column sum (cuBLAS's float32 GEMM, no split copies), which leaves W's region
    as it is."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.nn.torch_rnn import torch_cell

    plan = make_plan(torch_cell("lstm"), Sizes(100, 64, 512, 512), "graph", save_steps=True)
    instructions = backward_plan(plan).without_input_grad().instructions()
    groups = [i.launch.group for i in instructions if isinstance(i, Gemm)]
    assert groups.index("gemm1 dW") > groups.index("gemm0 dbias") > groups.index("gemm0 dW")
    _assert_shared(instructions, ["gemm1 dW"])


def _assert_shared(instructions, shared: list[str]) -> None:
    from cellfuse.codegen.gemm_routes import f16x3_layout

    reading = [i for i in instructions if isinstance(i, Gemm) and i.w_made_at is not None]
    assert [i.launch.group for i in reading] == shared
    for i in reading:
        before = next(b for b in instructions[instructions.index(i) - 1::-1]
                      if getattr(b, "route", "") == "f16x3")
        assert before.launch.w == i.launch.w and before.route == i.route == "f16x3"
        assert i.w_made_at == int(f16x3_layout(before.launch, before.rows, before.launch.k).kept_at)
        assert int(f16x3_layout(i.launch, i.rows, i.launch.k).kept_at) <= i.w_made_at


def test_a_kernel_between_two_gemms_of_one_w_makes_the_second_split_it_again():
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.lowering import w_regions_shared

    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "tensor", save_steps=True)
    made = [replace(i, w_made_at=None) if isinstance(i, Gemm) else i
            for i in backward_plan(plan).instructions()]
    shared = [i.launch.group for i in w_regions_shared(tuple(made)) if getattr(i, "w_made_at", None)]
    assert shared == ["gemm1 dW"]
    kernel = next(i for loop in lower(make_plan(load_template("lstm"), SIZES, "fused")).instructions
                  if isinstance(loop, Loop) for i in loop.body if isinstance(i, Kernel))
    at = next(n for n, i in enumerate(made) if isinstance(i, Gemm) and i.launch.group == "gemm1 dW")
    assert not any(getattr(i, "w_made_at", None) for i in w_regions_shared((*made[:at], kernel, *made[at:])))
