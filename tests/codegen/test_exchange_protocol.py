"""The exchanges of a persistent forward step, as a protocol: blocks run at any speeds, a block's GEMM
waits until every pair of its row group's rows in the slot it reads carries the tag of the step it
wants, and a block's elementwise launch publishes its own pairs with its step's tag. Run here with
adversarial and random orders of the blocks, every template's plan and random cells' must neither
deadlock nor overwrite a pair that a block of the same row group has still to read (what the two slots
of `exchanges` rely on), so that a wrong lag fails on a machine without a GPU. (That the values are the
right ones is the numpy executor's and the GPU tests' to check.)"""

from __future__ import annotations

import numpy as np
import pytest
from random_cells import random_cell

from cellfuse.codegen import make_plan
from cellfuse.codegen.address import slot_rows
from cellfuse.codegen.persistent import written
from cellfuse.codegen.plan import GemmLaunch, PersistentLaunch, Target
from cellfuse.graph_model import Sizes, analyze, load_template, template_names

# Eight SMs and a batch of 19: two row groups, four column blocks.
EIGHT = Target(sm_count=8, smem_per_block=48 * 1024)


class Hazard(AssertionError):
    pass


def simulate(launch: PersistentLaunch, steps: int, pick) -> None:
    """Runs the launch's steps, one item of one block at a time, the block chosen by `pick` among those
    that can go on; raises Hazard where a publish overwrites a pair still to be read, or where a block
    writes rows of a buffer that another block, further behind, has still to read there, and
    AssertionError where no block can go on before all are done."""
    exchange = {ex.buffer: ex for ex in launch.exchange}
    items, batch, columns = launch.items, launch.batch, launch.column_blocks
    blocks = range(launch.blocks)
    group = {b: range(*launch.rows(b, batch)) for b in blocks}
    everywhere = -1  # a footprint's column block: all of them

    def rows_of(b: int, i: int) -> range:
        return range(b, batch, launch.blocks) if items[i].by_rows else group[b]

    def cols_of(b: int, i: int) -> int:
        return everywhere if items[i].by_rows else b % columns

    tag = {}  # (buffer, slot, row, column block) -> the tag of its pair
    for ex in exchange.values():
        if ex.lag == -1:  # the initial state, published before the loop
            tag.update({(ex.buffer, 1, r, c): 1 for r in range(batch) for c in range(columns)})
    at = {b: (0, 0) for b in blocks}  # (step, item)

    def reads(i: int) -> str | None:
        item = items[i].launch
        return item.a.buffer if isinstance(item, GemmLaunch) and item.a.buffer in exchange else None

    def next_want(block, buffer: str) -> int:
        """The tag the block reads next from an exchange: at its step's next GEMM of it, or the next
        step's."""
        t, i = at[block]
        lag = exchange[buffer].lag
        if any(reads(j) == buffer for j in range(i, len(items))):
            return t + 2 + lag
        return t + 3 + lag

    def can_go(block) -> bool:
        t, i = at[block]
        if t == steps:
            return False
        if launch.grid_barrier(items[i]):
            return all(at[other] >= (t, i) for other in blocks)
        buffer = reads(i)
        if buffer is None:
            return True
        want = t + 2 + exchange[buffer].lag
        return all(tag.get((buffer, want & 1, r, c), 0) == want for r in group[block] for c in range(columns))

    def footprint(acc, t: int, rows: range, col: int) -> set[tuple[int, int]]:
        first = acc.block * batch + slot_rows(acc.slot).evaluate(t=t, batch=batch)
        return {(first + r, col) for r in rows}

    def meet(a: set, b: set) -> bool:
        return any((r, c) in b or (r, everywhere) in b or c == everywhere and any(x == r for x, _ in b)
                   for r, c in a)

    def pending_reads(other: int, until: tuple[int, int]):
        """What the other block has still to read before it reaches `until`: (access, its rows, step)."""
        t, i = at[other]
        while (t, i) < until:
            item = items[i]
            if not item.whole:
                launch_ = item.launch
                if isinstance(launch_, GemmLaunch):
                    accesses = [] if reads(i) else [(launch_.a, everywhere)]  # all of K
                else:
                    accesses = [(acc, everywhere if acc.kind == "col" else cols_of(other, i))
                                for _, acc in launch_.inputs if acc.kind in ("row", "col")]
                for acc, col in accesses:
                    yield acc, footprint(acc, t, rows_of(other, i), col), t
            t, i = (t, i + 1) if i + 1 < len(items) else (t + 1, 0)

    def check_writes(block: int) -> None:
        t, i = at[block]
        item = items[i]
        if item.whole or isinstance(item.launch, GemmLaunch) and item.output_on_chip:
            return  # the same values in every block, or the block's own shared memory
        for w in written(item.launch):
            if w.kind not in ("row", "col"):
                continue
            mine = footprint(w, t, rows_of(block, i), cols_of(block, i))
            for other in blocks:
                if other == block:
                    continue
                for acc, theirs, t2 in pending_reads(other, (t, i)):
                    if acc.buffer == w.buffer and meet(mine, theirs):
                        raise Hazard(f"block {block} writes {w.buffer} at step {t} where block {other} "
                                     f"has still to read it at step {t2}")

    while True:
        ready = [block for block in blocks if can_go(block)]
        if not ready:
            assert all(t == steps for t, _ in at.values()), f"deadlock at {at}"
            return
        block = pick(ready)
        t, i = at[block]
        check_writes(block)
        for ex in exchange.values():
            if ex.writer == i:
                new = t + 2
                published = {r for r in rows_of(block, i)}
                cols = range(columns) if items[i].by_rows else [block % columns]
                for other in blocks:
                    if set(group[other]) & published and next_want(other, ex.buffer) <= new - 2 and (
                            next_want(other, ex.buffer) & 1) == (new & 1):
                        raise Hazard(f"block {block} overwrites step {new - 2}'s {ex.buffer}, which "
                                     f"block {other} has still to read")
                tag.update({(ex.buffer, new & 1, r, c): new for r in published for c in cols})
        at[block] = (t, i + 1) if i + 1 < len(items) else (t + 1, 0)


def orders(seed: int):
    """Ways to pick the block that goes on: always the first (one block as far ahead as it can), the
    last, and at random."""
    rng = np.random.default_rng(seed)
    return [lambda ready: ready[0], lambda ready: ready[-1],
            lambda ready: ready[int(rng.integers(len(ready)))]]


def launches(cell):
    """The persistent launch of the cell's first layer on eight SMs (two row groups, three column blocks)
    and on two."""
    sizes = Sizes(6, 19, 6 if analyze(cell).ties else 7, 6)
    for target in (EIGHT, Target(sm_count=2, smem_per_block=48 * 1024)):
        yield make_plan(cell, sizes, "persistent", target).layers[0].persistent


def plans(cell, name: str):
    """Those of the launches that pass values through exchanges."""
    for launch in launches(cell):
        if launch.exchange:
            yield launch


# The templates whose step has no recurrent GEMM: no block reads what another wrote.
NO_EXCHANGE = ("indrnn", "sru")


@pytest.mark.parametrize("name", [name for name in template_names() if name not in NO_EXCHANGE])
def test_every_template_s_exchanges_hold_in_any_order(name):
    cell = load_template(name)
    exchanged = list(plans(cell, name))
    assert len(exchanged) == 2, "a template with a recurrent GEMM that passes no value through an exchange"
    for launch in exchanged:
        for pick in orders(0):
            simulate(launch, 6, pick)


@pytest.mark.parametrize("name", NO_EXCHANGE)
def test_a_step_without_a_recurrent_gemm_has_no_exchange_and_no_barrier_and_runs_in_any_order(name):
    """IndRNN's and the SRU's blocks each own their elements for every step: nothing to exchange and
    nothing to wait for, neither at a grid barrier nor for another block's pairs; run in any order, every
    block gets to the end without writing what another has still to read."""
    for launch in launches(load_template(name)):
        assert launch.exchange == () and launch.blocks > 1
        assert launch.waits_per_step == launch.barriers_per_step == launch.exchange_waits_per_step == 0
        assert not any(item.barrier or launch.grid_barrier(item) for item in launch.items)
        assert not any(isinstance(item.launch, GemmLaunch) for item in launch.items)
        for pick in orders(0):
            simulate(launch, 6, pick)


def test_random_cells_exchanges_hold_in_any_order():
    checked = 0
    for seed in range(120):
        cell = random_cell(seed)
        for launch in plans(cell, f"random {seed}"):
            for pick in orders(seed):
                simulate(launch, 5, pick)
            checked += 1
    # Many random cells keep their barriers (an elementwise launch before the step's first GEMM writes
    # what other blocks read): at least these use exchanges.
    assert checked >= 20


# Few random cells end their step with the block per row that writes h: one of the first 200 seeds, five
# of the next 1300 (each on two targets).
@pytest.mark.parametrize("seeds, least", [(range(200), 2), pytest.param(range(200, 1500), 8,
                                                                         marks=pytest.mark.slow)])
def test_random_cells_with_row_reductions_exchange_beside_their_barriers_in_any_order(seeds, least):
    """A block per row that writes the next step's GEMM operand publishes it by rows, and keeps its
    barrier: the GEMM waits only for its row group's rows, and overwrites its outputs only after the
    blocks that read them have."""
    checked = 0
    for seed in seeds:
        cell = random_cell(seed, reductions=True)
        for launch in plans(cell, f"random {seed}"):
            if any(item.by_rows for item in launch.items):
                assert launch.barriers_per_step >= 1
                for pick in orders(seed):
                    simulate(launch, 5, pick)
                checked += 1
    assert checked >= least


def test_a_block_per_row_after_the_writer_would_read_what_the_next_gemm_overwrites():
    """The check can fail: with a second block per row after the one that writes h (here the layer
    norm's kernel again), a block whose GEMM has its rows of h goes on to overwrite the GEMM's output
    while a slower block still reads its row of it; `exchanges` refuses such a step."""
    import dataclasses

    from cellfuse.codegen.persistent import exchanges

    launch = next(plans(load_template("layernorm_lstm"), "layernorm_lstm"))
    gemm, rows = launch.items
    again = dataclasses.replace(launch, items=(gemm, rows, rows))
    with pytest.raises(Hazard, match="writes l0.gemm1.out .* still to read it"):
        for pick in orders(0):
            simulate(again, 4, pick)
    assert not exchanges(list(again.items), False, 19, launch.column_blocks)


def test_a_wrong_lag_deadlocks():
    """The check can fail: the LSTM's h read at the step that writes it (lag 0) never comes."""
    import dataclasses

    lstm = next(plans(load_template("lstm"), "lstm"))
    wrong = dataclasses.replace(lstm, exchange=tuple(dataclasses.replace(ex, lag=0) for ex in lstm.exchange))
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(wrong, 4, orders(0)[0])
