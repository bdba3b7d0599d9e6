"""Where a CellRNN call's buffers live on a GPU (cuda_runner.Memory), checked on the CPU: the caller's
tensors and the weights stay out of the reserve, every buffer a backward run adds into is cleared by its
memsets but for dy's place, which dy's copy writes whole, every piece starts where cuBLAS's fastest
kernels want it, and a 16-bit training run converts what its caller gives and takes in x's type."""

from __future__ import annotations

import pytest

from cellfuse.codegen import make_plan
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.dtypes import BFLOAT16, FLOAT16, FLOAT32
from cellfuse.codegen.lowering import execution_order, lower, with_edges
from cellfuse.codegen.plan import Target
from cellfuse.graph_model import Sizes, load_template, template_names
from cellfuse.graph_model.lengths import STEPS_LEFT, masked
from cellfuse.nn.cuda_runner import ALIGNMENT, Memory

H100 = Target(132, 232448)


CASES = [("lstm", "persistent", 1), ("gru", "tensor", 2), ("lstm", "graph", 2),
         ("layernorm_lstm", "persistent", 1)]


@pytest.mark.parametrize("name, schedule, layers", CASES)
def test_a_calls_memory_holds_every_buffer_once(name, schedule, layers):
    sizes = Sizes(seq=7, batch=64, input=32, hidden=64, layers=layers)
    plan = make_plan(load_template(name), sizes, schedule, H100, save_steps=True)
    backward = backward_plan(plan)
    memory = Memory(plan, backward)
    states = {f"{e}.{s}" for s in plan.state_ids for e in ("init", "final")}
    caller = {"x", plan.layers[-1].output_seq, *states}
    weights = {n for n, b in plan.buffers.items() if b.is_weight}
    assert set(memory.weights) == weights
    in_reserve = {n for n in memory.reserve if not n.startswith("split:")}
    assert in_reserve == set(plan.buffers) - caller - weights
    assert set(backward.buffers) <= set(memory.grads)
    for offsets in (memory.reserve, memory.grads):
        assert all(at % ALIGNMENT == 0 for at in offsets.values())
        ends = sorted(offsets.values())
        assert len(set(ends)) == len(ends)  # no two buffers start at one place
    cleared = [n for n in backward.buffers if memory.grads[n] < memory.restart_bytes]
    assert set(cleared) == {n for n in backward.buffers if backward.restarted(n)}
    assert memory.reserve_bytes >= sum(plan.buffers[n].nbytes(plan.sizes) for n in in_reserve)


@pytest.mark.parametrize("schedule", ["graph", "persistent", "tensor"])
@pytest.mark.parametrize("name", template_names())
def test_dy_goes_where_the_memset_leaves_nothing_else(name, schedule):
    """The backward run's start copies dy in where the forward pass wrote y (CudaRunner._starts), inside
    its buffer, a buffer the launches add into: the memsets zero the rest of those buffers, not dy's place
    (the copy writes it whole), which makes the copy an addition onto zeros."""
    sizes = Sizes(seq=5, batch=3, input=16, hidden=16, layers=2)
    plan = make_plan(load_template(name), sizes, schedule, H100, save_steps=True)
    backward = backward_plan(plan)
    memory = Memory(plan, backward)
    buffer, at = backward.dy_place()
    end = 4 * (at + sizes.seq * sizes.batch * sizes.hidden)
    assert backward.restarted(buffer) and backward.start_value(buffer) == 0.0
    assert end <= backward.buffers[buffer].nbytes(plan.sizes)
    assert memory.dy == (memory.grads[buffer] + 4 * at, memory.grads[buffer] + end)
    pieces = sorted([*memory.zeroed, memory.dy])
    assert pieces[0][0] == 0 and pieces[-1][1] == memory.restart_bytes
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))  # no gap, no overlap
    assert all(a % 4 == 0 and b % 4 == 0 for a, b in pieces)


@pytest.mark.parametrize("schedule, kept", [("graph", ["init.c"]),
                                            ("tensor", ["l0.out.y", "init.h", "init.c"])])
def test_a_16_bit_training_run_keeps_its_float32_y_and_initial_states_in_the_reserve(schedule, kept):
    """The caller's y and initial states are in x's type; a 16-bit plan keeps some of them float32 (the
    LSTM's c; on the tensor rung h too, a persistent GEMM's operand, and with it y's sequence): a run that
    a backward pass follows keeps those in its reserve, where that pass reads them. An inference run, and
    a float32 plan, keep none."""
    sizes = Sizes(seq=7, batch=8, input=32, hidden=32)
    lstm = load_template("lstm")
    plan = make_plan(lstm, sizes, schedule, H100, save_steps=True, precision="bf16")
    memory = Memory(plan, backward_plan(plan))
    assert memory.kept == kept
    for name in kept:
        b = plan.buffers[name]
        assert b.dtype.name == "float32" and memory.reserve[name] % ALIGNMENT == 0
        assert memory.reserve[name] + b.nbytes(sizes) <= memory.reserve_bytes
    alone = Memory(plan, None)
    assert alone.kept == [] and not set(kept) & set(alone.reserve)
    assert memory.reserve_bytes >= alone.reserve_bytes + sum(plan.buffers[n].nbytes(sizes) for n in kept)
    fp32 = make_plan(lstm, sizes, schedule, H100, save_steps=True)
    assert Memory(fp32, backward_plan(fp32)).kept == []


@pytest.mark.parametrize("schedule, converted", [("graph", ["final.c"]), ("tensor", ["final.h", "final.c"])])
def test_a_16_bit_training_run_converts_the_callers_states_and_y_in_its_program(schedule, converted):
    """The run's program converts each kept initial state from the caller's tensor (x's type) into the
    reserve before anything else, and y's sequence (past its initial rows) and each float32 final state
    into the caller's tensors after everything else, on the main stream; a float32 plan converts
    nothing."""
    sizes = Sizes(seq=7, batch=8, input=32, hidden=32)
    plan = make_plan(load_template("lstm"), sizes, schedule, H100, save_steps=True, precision="bf16")
    memory = Memory(plan, backward_plan(plan))
    assert memory.converted == converted and not set(converted) & {"x", *memory.kept}
    assert all(plan.buffers[n].dtype == FLOAT32 and n in memory.reserve for n in converted)
    before, after = memory.edges
    states, rows = sizes.layers * sizes.batch * sizes.hidden, sizes.batch * sizes.hidden
    assert [(c.src, c.dst, c.elements) for c in before] == [
        (f"caller.{n}", n, states) for n in memory.kept if n.startswith("init.")]
    assert all(c.src_dtype == BFLOAT16 and c.dst_dtype == FLOAT32 for c in before)
    assert all(c.src_at == c.dst_at == 0 for c in before)
    y = [(c.src, c.src_at, c.elements) for c in after if c.src == "l0.out.y"]
    assert y == ([("l0.out.y", rows, sizes.seq * rows)] if "l0.out.y" in memory.kept else [])
    assert [(c.src, c.dst, c.elements) for c in after if c.src != "l0.out.y"] == [
        (n, f"caller.{n}", states) for n in converted]
    assert all(c.src_dtype == FLOAT32 and c.dst_dtype == BFLOAT16 for c in after)
    program = with_edges(lower(plan), *memory.edges)
    order = list(execution_order(program))
    assert order[:len(before)] == list(before) and order[len(order) - len(after):] == list(after)
    assert Memory(plan, None).edges == ((), ())
    fp32 = make_plan(load_template("lstm"), sizes, schedule, H100, save_steps=True)
    assert Memory(fp32, backward_plan(fp32)).edges == ((), ())


def test_the_steps_left_state_is_given_and_taken_in_float32():
    """A PackedSequence's call gives its steps-left state in float32, as a 16-bit plan keeps it: read
    from the caller's tensor, neither kept nor converted."""
    sizes = Sizes(seq=7, batch=8, input=32, hidden=32)
    plan = make_plan(masked(load_template("lstm")), sizes, "tensor", H100, save_steps=True, precision="fp16")
    memory = Memory(plan, backward_plan(plan))
    assert plan.buffers[f"init.{STEPS_LEFT}"].dtype == FLOAT32
    assert memory.caller_types[f"init.{STEPS_LEFT}"] == FLOAT32
    assert f"init.{STEPS_LEFT}" not in memory.kept + list(memory.reserve)
    assert f"final.{STEPS_LEFT}" not in memory.converted + list(memory.reserve)
    assert memory.caller_types["init.c"] == FLOAT16 and "final.c" in memory.converted
