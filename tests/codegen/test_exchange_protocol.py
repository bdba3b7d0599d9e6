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
from cellfuse.codegen.plan import GemmLaunch, PersistentLaunch, Target
from cellfuse.graph_model import Sizes, analyze, load_template, template_names

# Eight SMs and a batch of 19: two row groups, four column blocks.
EIGHT = Target(sm_count=8, smem_per_block=48 * 1024)


class Hazard(AssertionError):
    pass


def simulate(launch: PersistentLaunch, steps: int, pick) -> None:
    """Runs the launch's steps, one item of one block at a time, the block chosen by `pick` among those
    that can go on; raises Hazard where a publish overwrites a pair still to be read, and
    AssertionError where no block can go on before all are done."""
    exchange = {ex.buffer: ex for ex in launch.exchange}
    groups, columns = launch.row_groups, launch.column_blocks
    blocks = [(g, c) for g in range(groups) for c in range(columns)]
    tag = {(b, s, g, c): 0 for b in exchange for s in (0, 1) for g, c in blocks}
    for ex in exchange.values():
        if ex.lag == -1:  # the initial state, published before the loop
            for g, c in blocks:
                tag[(ex.buffer, 1, g, c)] = 1
    at = {block: (0, 0) for block in blocks}  # (step, item)
    items = launch.items

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
        buffer = reads(i)
        if buffer is None:
            return True
        want = t + 2 + exchange[buffer].lag
        return all(tag[(buffer, want & 1, block[0], c)] == want for c in range(columns))

    while True:
        ready = [block for block in blocks if can_go(block)]
        if not ready:
            assert all(t == steps for t, _ in at.values()), f"deadlock at {at}"
            return
        block = pick(ready)
        t, i = at[block]
        for ex in exchange.values():
            if ex.writer == i:
                new = t + 2
                for other in blocks:
                    if other[0] == block[0] and next_want(other, ex.buffer) <= new - 2 and (
                            next_want(other, ex.buffer) & 1) == (new & 1):
                        raise Hazard(f"block {block} overwrites step {new - 2}'s {ex.buffer}, which "
                                     f"block {other} has still to read")
                tag[(ex.buffer, new & 1, *block)] = new
        at[block] = (t, i + 1) if i + 1 < len(items) else (t + 1, 0)


def orders(seed: int):
    """Ways to pick the block that goes on: always the first (one block as far ahead as it can), the
    last, and at random."""
    rng = np.random.default_rng(seed)
    return [lambda ready: ready[0], lambda ready: ready[-1],
            lambda ready: ready[int(rng.integers(len(ready)))]]


def plans(cell, name: str):
    sizes = Sizes(6, 19, 6 if analyze(cell).ties else 7, 6)
    for target in (EIGHT, Target(sm_count=2, smem_per_block=48 * 1024)):
        launch = make_plan(cell, sizes, "persistent", target).layers[0].persistent
        if launch.exchange:
            yield launch


@pytest.mark.parametrize("name", template_names())
def test_every_template_s_exchanges_hold_in_any_order(name):
    cell = load_template(name)
    for launch in plans(cell, name):
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


def test_a_wrong_lag_deadlocks():
    """The check can fail: the LSTM's h read at the step that writes it (lag 0) never comes."""
    import dataclasses

    lstm = next(plans(load_template("lstm"), "lstm"))
    wrong = dataclasses.replace(lstm, exchange=tuple(dataclasses.replace(ex, lag=0) for ex in lstm.exchange))
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(wrong, 4, orders(0)[0])
