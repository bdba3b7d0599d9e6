"""The exchanges of a persistent kernel (see `plan.Exchange`): where a (step tag, value) pair lives, how a
writer publishes its values, and how a GEMM stages its rows of an exchanged operand once their tags are
the step's. A value written at step t has the tag t + 2 and goes to slot t & 1; the initial state's have
the tag 1, in slot 1. A value is published as the GEMM that reads it multiplies it (`stored`)."""

from __future__ import annotations

from collections.abc import Callable

from ..address import c_address
from ..kernel_abi import Param, kernel_params
from ..plan import Exchange, GemmLaunch
from .context import Kernel
from .staging import rounded

POLL_PIECES = 16  # loads of an exchange's pairs a thread has in flight at once, at most
POLL_ROUNDS = 1 << 24  # rounds of polling an exchange, at most (seconds; a step waits microseconds)


def pair_at(k: Kernel, n: int, ex: Exchange, slot: str, row: str, col: str, batch: str = "batch") -> str:
    """The address of exchange n's pair at row `row`, column `col` of the slot `slot` & 1."""
    return (f"{k.name}_x{n} + (size_t)(({slot}) & 1) * {batch} * {ex.width} "
            f"+ (size_t)({row}) * {ex.width}" + (f" + {col}" if col != "0" else ""))


def stored(k: Kernel, ex: Exchange) -> Callable[[str], str]:
    """How a value goes into exchange `ex`: as the GEMM that reads it multiplies it, where that GEMM runs on
    the CUDA cores (`staging.rounded`: a 16-bit GEMM's operand rounded to its type), so that it stages the
    values as they come. The writer rounds each value once, where each of the blocks that stage it rounded
    every value of its rows at every step: that took the bf16 LSTM's persistent kernel at B=8 a sixth of
    its time (benchmarks/results/h200_2026-12-01_rounded_by_the_writer_ae6750a.txt). Tensor cores round the
    operand as they load it; rounded by the writer as well, fp16's GRU at B=8 lost 4%."""
    readers = [item for item in k.launch.items
               if isinstance(item.launch, GemmLaunch) and item.launch.a.buffer == ex.buffer]
    assert len({(item.mma, item.launch.multiply) for item in readers}) == 1, \
        f"{ex.buffer}: its GEMMs multiply it alike (persistent.exchanges sees to it)"
    if readers[0].mma:
        return str
    return lambda value: rounded(readers[0].launch, value)


def publish(k: Kernel, ex: Exchange, at: str, tag: str, value: str) -> str:
    """The statement that puts `value` (as `stored` makes it) at `at` of exchange `ex` with the tag `tag`."""
    return f"cf_publish({at}, {tag}, {stored(k, ex)(value)});"


def exchanged_outputs(k: Kernel, i: int, params: list[Param]) -> list[tuple[int, int, Exchange]]:
    """The outputs of item i (a kernel with those parameters) that other blocks read from an exchange:
    (the output's index among the parameters, the exchange's index, the Exchange)."""
    return [(n, *k.exchange[p.access.buffer]) for n, p in enumerate(params)
            if p.output and p.access.buffer in k.exchange and k.exchange[p.access.buffer][1].writer == i]


def at_columns(k: Kernel, n: int, x: int, ex: Exchange, params: list[Param], batch: str = "batch") -> str:
    """Where output n of an exchange's writer goes in it at row r, column j of the step t: at its columns
    of the exchange."""
    col = params[n].access.col - ex.col
    return pair_at(k, x, ex, "t", "r", f"j + {col}" if col else "j", batch)


def published(k: Kernel, i: int) -> dict[int, Callable[[str], str]]:
    """Of a block per row that writes an exchanged operand (item i), per such output (by its index among
    the kernel's parameters), the statement that publishes a value of it at step t in its exchange, in the
    terms of the device function (the batch is `rows` there)."""
    params = kernel_params(k.launch.items[i].launch)

    def statement(n: int, x: int, ex: Exchange) -> Callable[[str], str]:
        return lambda value: publish(k, ex, at_columns(k, n, x, ex, params, "rows"), "t + 2", value)
    return {n: statement(n, x, ex) for n, x, ex in exchanged_outputs(k, i, params)}


def publish_initial(k: Kernel) -> None:
    """Before the loop, each block's own elements of every exchange: both slots cleared (tag 0, which no
    step waits for, so that no pair of an earlier run is taken for one of this run's), and, for an operand
    the first step reads from before the loop (the initial state), its values with the tag of step -1;
    then one grid-wide barrier, after which every block sees them."""
    launch, w = k.launch, k.w
    for n, ex in enumerate(launch.exchange):
        unit = launch.unit(ex.width)
        with w.block(f"for (int e = tid; e < rows * {unit}; e += {launch.threads}) {{"):
            w(f"const int r = row0 + e / {unit}, j = cb * {unit} + e % {unit}, t = 0;",
              "(void)t;",
              f"if (j >= {ex.width}) continue;",
              f"cf_publish({pair_at(k, n, ex, '0', 'r', 'j')}, 0u, 0.0f);")
            if ex.lag == -1:
                a = next(item.launch.a for item in launch.items
                         if isinstance(item.launch, GemmLaunch) and item.launch.a.buffer == ex.buffer)
                value = stored(k, ex)(f"({c_address(k.var[a.buffer], a)})[(size_t)r * {a.ld} + j]")
                w(f"cf_publish({pair_at(k, n, ex, '1', 'r', 'j')}, 1u,",
                  f"           {value});")
            else:
                w(f"cf_publish({pair_at(k, n, ex, '1', 'r', 'j')}, 0u, 0.0f);")
    w("grid.sync();  // every block's clearing and initial values are visible")


def poll_rows(k: Kernel, n: int, ex: Exchange, stride: int) -> None:
    """Stages rows rb.. of the block's rows of an exchanged operand from its exchange: the pairs (two at a
    time where the width is even) loaded all at once, then, in rounds, those whose tag is not yet the
    step's loaded again, all at once, until every one is. (The first loads written as a round of the loop
    instead, from tags of 0, cost ptxas registers and the LSTM time at B=8:
    docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, "The LSTM at B=8 between bc46496 and
    12b9cf3".)"""
    launch, width, w = k.launch, ex.width, k.w
    per = 2 if width % 2 == 0 else 1
    pieces = launch.row_tile * width // per
    chunk = min(POLL_PIECES, -(-pieces // launch.threads))
    peek = "cf_peek2(p, w[u][0], w[u][1])" if per == 2 else "cf_peek(p, w[u][0])"
    stale = " || ".join(f"(unsigned)(w[u][{v}] >> 32) != want" for v in range(per))
    slot = "t + 1" if ex.lag else "t"  # of the value written at step t - 1, or at step t
    # the pairs thread tid loads (u-th of its chunk): element e of the rows, of row r, at p
    element = f"const int e = {per} * (e0 + tid + u * {launch.threads}), r = e / {width};"
    # p as the rows' start + e where row groups split the rows, but through row r where every block polls
    # every row: each was the faster there on an H100
    # (docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, change 12)
    split = launch.row_groups > 1
    start = pair_at(k, n, ex, slot, "row0 + rb", "0")
    p = "rows_at + e" if split else pair_at(k, n, ex, slot, "row0 + rb + r", f"e - r * {width}")
    at = f"const unsigned long long* const p = {p};"
    with w.block("{"):
        w(f"const unsigned want = t + {2 + ex.lag};")
        if split:
            w(f"const unsigned long long* const rows_at = {start};")
        with w.block(f"for (int e0 = 0; e0 < {pieces}; e0 += {chunk * launch.threads}) {{"):
            w(f"unsigned long long w[{chunk}][{per}];",
              "#pragma unroll")
            with w.block(f"for (int u = 0; u < {chunk}; ++u) {{"):
                w(element, at, f"if (e < {pieces * per} && rb + r < rows) {peek};")
            with w.block("for (unsigned cf_round = 0;; ++cf_round) {  // rounds, each one trip to L2"):
                w(f"if (cf_round == {POLL_ROUNDS}u) __trap();  // a fault, not a hang, should a value never "
                  "come",
                  "bool ready = true;",
                  "#pragma unroll")
                with w.block(f"for (int u = 0; u < {chunk}; ++u) {{"):
                    w(element, at)
                    with w.block(f"if (e < {pieces * per} && rb + r < rows && ({stale})) {{"):
                        w("ready = false;", f"{peek};")
                w("if (ready) break;")
            w("#pragma unroll")
            with w.block(f"for (int u = 0; u < {chunk}; ++u) {{"):
                w(element,
                  f"if (e >= {pieces * per}) break;",
                  "#pragma unroll",
                  f"for (int v = 0; v < {per}; ++v)",
                  f"    cf_stage[r * {stride} + e - r * {width} + v] =",
                  "        rb + r < rows ? __uint_as_float((unsigned)w[u][v]) : 0.0f;")


def poll_pair(k: Kernel, n: int, ex: Exchange) -> None:
    """Thread tid's two k (2 tid, 2 tid + 1) of row rb of its rows of an exchanged operand, into a0 and a1,
    once their tags are the step's (for products in registers, one row at a time)."""
    w = k.w
    slot = "t + 1" if ex.lag else "t"  # as in `poll_rows`
    w(f"const unsigned want = t + {2 + ex.lag};",
      f"const unsigned long long* const p = {pair_at(k, n, ex, slot, 'row0 + rb', '2 * tid')};",
      "unsigned long long w0, w1;",
      "cf_peek2(p, w0, w1);")
    with w.block("for (unsigned cf_round = 1; (unsigned)(w0 >> 32) != want || (unsigned)(w1 >> 32) != want; "
                 "++cf_round) {"):
        w(f"if (cf_round == {POLL_ROUNDS}u) __trap();  // a fault, not a hang, should a value never come",
          "cf_peek2(p, w0, w1);")
    w("a0 = __uint_as_float((unsigned)w0);",
      "a1 = __uint_as_float((unsigned)w1);")
