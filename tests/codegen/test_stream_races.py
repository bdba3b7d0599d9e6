"""Every lowered program's streams are ordered wherever two of them touch the same element (tests/
stream_races.py): the fork, the chunks of hoisted work beside the recurrence, a wavefront's layers, the
final copies and the join, in any interleaving a GPU may run."""

from __future__ import annotations

from dataclasses import replace

import pytest
from stream_races import AFTER, hazards

from cellfuse.codegen import SCHEDULES, make_plan
from cellfuse.codegen.lowering import MAIN, SIDE, Loop, Program, Record, Wait, lower
from cellfuse.graph_model import CellError, Sizes, analyze, load_template, template_names

SIZES = Sizes(seq=7, batch=2, input=4, hidden=3, layers=3)
# (schedule, chunk_steps, layer_streams): the planner's own plans, and chunks of the hoisted work beside the
# recurrence on one pair of streams or on a pair per layer
SHAPES = [*((s, None, None) for s in SCHEDULES), ("hoisted", 1, False), ("hoisted", 3, False),
          ("wavefront", 1, True), ("wavefront", 3, True)]
CASES = [(name, *shape) for name in template_names() for shape in SHAPES]


def _program(name: str, schedule: str, chunk: int | None, apart: bool | None, layers: int = 3) -> Program:
    cell = load_template(name)
    sizes = replace(SIZES, layers=layers, input=SIZES.hidden if analyze(cell).ties else SIZES.input)
    plan = make_plan(cell, sizes, schedule)
    if chunk is not None:
        plan = replace(plan, chunk_steps=chunk, layer_streams=apart)
    return lower(plan)


@pytest.mark.parametrize("name, schedule, chunk, apart", CASES)
def test_a_programs_streams_are_ordered_wherever_they_touch_the_same_element(name, schedule, chunk, apart):
    try:
        program = _program(name, schedule, chunk, apart)
    except CellError:  # a rung the cell cannot run (no recurrent GEMM to keep on chip, say)
        pytest.skip(f"{name} has no {schedule} plan")
    assert hazards(program) == []


def test_a_deep_wavefronts_reused_streams_are_ordered():
    """Eleven layers on eight pairs of streams: layer l takes layer l - 8's, after it."""
    program = _program("gru", "wavefront", 3, True, layers=11)
    assert program.streams == 16 and hazards(program) == []


def _without(program: Program, drop) -> Program:
    return replace(program, instructions=tuple(i for i in program.instructions if not drop(i)))


def test_a_missing_wait_for_a_chunk_of_hoisted_work_is_found():
    """Each loop over a chunk of steps waits for that chunk's hoisted GEMMs: without the Wait, the loop
    reads their outputs unordered (values the numpy executor's SIDE-first order would still compute
    right)."""
    program = _program("lstm", "hoisted", 3, False)
    waits = [i for i in program.instructions if isinstance(i, Wait) and i.stream == MAIN and i.event > 0]
    found = hazards(_without(program, lambda i: i is waits[1]))
    assert found and all("stream 0" in f and "reads" in f for f in found)


def test_a_side_stream_that_does_not_start_after_the_fork_is_found():
    """The hoisted GEMMs read x, which the caller wrote on its stream before the run."""
    program = _program("gru", "hoisted", 3, False)
    found = hazards(_without(program, lambda i: isinstance(i, Wait) and i.stream == SIDE and i.event == 0))
    assert any("'x'" in f and "before the run" in f for f in found)


def test_a_program_not_joined_back_to_the_callers_stream_is_found():
    """The last Waits join every stream to MAIN: without them the caller's next run (or its reading of y
    and the final states) is unordered against the upper layers' loops and final copies on their own
    streams, which no value of this run shows. (On one pair of streams MAIN has waited for every chunk
    of hoisted work already.)"""
    program = _program("lstm", "wavefront", 3, True)
    joins = {i.event for i in program.instructions[-2 * (program.streams - 1):] if isinstance(i, Record)}
    assert len(joins) == program.streams - 1
    found = hazards(_without(program, lambda i: isinstance(i, Wait) and i.event in joins))
    assert found and all(AFTER in f for f in found)


def test_a_wait_for_an_event_not_yet_recorded_is_found():
    program = _program("lstm", "hoisted", 3, False)
    first_loop = next(n for n, i in enumerate(program.instructions) if isinstance(i, Loop))
    wait = program.instructions[first_loop - 1]
    assert isinstance(wait, Wait)
    early = replace(program, instructions=(wait, *(i for i in program.instructions if i is not wait)))
    assert any("before it is recorded" in f for f in hazards(early))
