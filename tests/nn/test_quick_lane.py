"""The kept call's C++ lane (cellfuse/nn/quick_lane.py), built here and driven on CPU tensors with stand-ins
for the driver's entry points: what it replays, where its outputs are, and every call it must leave to
Python. (On a GPU, tests/nn/test_kept_runs.py runs it under the modules.)"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import threading
from collections import OrderedDict

import pytest
import torch

from cellfuse.codegen.packed_rows import args_fields, lengths_args_fields
from cellfuse.gpu_runtime.packed_rows import args_struct
from cellfuse.gpu_runtime.stream_program import CHANGES
from cellfuse.nn import quick_lane

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

T, B, H, L = 3, 2, 4, 1
ROW = B * H
FINALS_AT = (64, 128)  # (256-byte aligned pieces of float32: y's sequence of (T + 1) rows first)
OUTPUTS_END, BLOCK = 192, 1 << 19  # (2 MiB: memory the C library maps of its own: see `built`)
PACKED, STREAM, CONTEXT, GRAPH = 0x7000, 0x5100, 0xC0, 0x6A0

_M_MMAP_THRESHOLD = -3  # (glibc's mallopt parameter)
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
_CONTEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
_LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
ROWS_CAPACITY = 64  # (the steps the padding kernel's arguments hold, in the packed calls' lanes)
ZERO = 0xF80  # (cf_zero_rows's function, whose arguments are of a size of their own)
REVERSE = 0xFC0  # (cf_reverse_rows's, whose arguments are cf_zero_rows's)


class FakeDriver:
    """cuGraphLaunch, cuStreamIsCapturing, cuCtxGetCurrent and cuLaunchKernel as C function pointers that
    record and answer as told (a kernel's launch: its function, grid, block, stream and the bytes of its
    one argument, cf_unpack_rows's, cf_pack_rows's, or cf_zero_rows's and cf_reverse_rows's)."""

    def __init__(self):
        self.launches: list[tuple[int, int]] = []
        self.kernels: list[tuple[int, int, int, int, bytes]] = []
        self.order: list[str] = []
        self.capturing, self.context, self.error, self.kernel_error = 0, CONTEXT, 0, 0
        args_bytes = args_struct(ROWS_CAPACITY).size
        lengths_bytes = args_struct(ROWS_CAPACITY, lengths=True).size

        def launch(graph, stream):
            self.launches.append((graph, stream))
            self.order.append("graph")
            return self.error

        def launch_kernel(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            size = lengths_bytes if function in (ZERO, REVERSE) else args_bytes
            self.kernels.append((function, gx, bx, stream, ctypes.string_at(params[0], size)))
            self.order.append("kernel")
            return self.kernel_error

        def capturing(stream, status):
            status[0] = self.capturing
            return 0

        def context(out):
            out[0] = self.context
            return 0

        self._keep = (_LAUNCH(launch), _CAPTURING(capturing), _CONTEXT(context),
                      _LAUNCH_KERNEL(launch_kernel))

    @property
    def entry_points(self) -> tuple[int, int, int, int]:
        return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self._keep)


class FakeProgram:
    def __init__(self):
        self._replays = 0
        self.turn = threading.RLock()


@pytest.fixture(scope="module")
def built():
    """The lane built; and the C library made to map each allocation of 128 KiB or more (its default)
    from the system and unmap it when freed, so that a call's memory, freed, is found again at the same
    address, as torch's caching allocator finds a GPU's (glibc otherwise raises that threshold at the
    first such free, and then gives the CPU's small blocks at addresses that wander for a while)."""
    assert ctypes.CDLL(ctypes.util.find_library("c")).mallopt(_M_MMAP_THRESHOLD, 128 << 10) == 1
    if quick_lane.module() is None:
        pytest.fail("the lane's C++ could not be built (see the warning logged)")


@pytest.fixture
def setup(built):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4 * H, H)), torch.nn.Parameter(torch.randn(4 * H))]
    zeros = [torch.zeros(L, B, H), torch.zeros(L, B, H)]
    x = torch.randn(T, B, H)
    driver, program, lock = FakeDriver(), FakeProgram(), threading.Lock()
    return x, params, zeros, driver, program, lock


def make(setup, batch_first=False, x=None):
    x0, params, zeros, driver, program, lock = setup
    return quick_lane.make(x0 if x is None else x, params, zeros, batch_first, (T, B, H, L), BLOCK,
                           OUTPUTS_END, FINALS_AT, PACKED, STREAM, (lock, program.turn), program,
                           driver=driver.entry_points, context=CONTEXT)


def replayed(lane, x, params, states=None):
    """A call's outputs once the lane knows its run, taught each run it missed: the memory of a call whose
    outputs are still held is at another address, and the system may map a freed piece elsewhere when
    other mappings came and went in between (Python's own arenas), but comes back to a few places."""
    for _ in range(100):
        done = lane(x, params, states, STREAM)
        if done is not None:
            return done
        lane.learn(lane.missed(), GRAPH)
    raise AssertionError("the lane never replayed")


def test_a_lane_replays_the_run_it_learned_and_returns_views_of_one_piece_of_memory(setup):
    x, params, zeros, driver, program, _ = setup
    lane = make(setup)
    with torch.no_grad():
        assert lane(x, params, None, STREAM) is None  # (it knows no run yet)
        assert lane.known() == 0 and len(lane.missed()) == 5 + 2 * len(zeros)
        y, finals = replayed(lane, x, params)
    assert driver.launches[-1] == (GRAPH, STREAM) and program._replays == len(driver.launches) == 1
    size = 4
    assert tuple(y.shape) == (T, B, H) and y.stride() == (ROW, H, 1)
    base = y.data_ptr() - ROW * size  # (y's sequence starts with the initial states' row)
    assert [tuple(f.shape) for f in finals] == [(L, B, H)] * 2
    assert [f.data_ptr() - base for f in finals] == [at * size for at in FINALS_AT]
    assert y.untyped_storage().data_ptr() == base == finals[1].untyped_storage().data_ptr()
    assert y.untyped_storage().nbytes() == BLOCK * size
    # the bases of the run it replayed: the runner's (scratch, packed, x, out, grads, states, finals)
    scratch, packed, x_at, out, grads, *states = lane.missed()  # (the first call's, at another address)
    assert (packed, x_at, grads) == (PACKED, x.data_ptr(), 0)  # (no states given: the module's zeros)
    assert scratch - out == OUTPUTS_END * size and states[:2] == [z.data_ptr() for z in zeros]
    assert [f - out for f in states[2:]] == [at * size for at in FINALS_AT]


def test_given_states_are_read_where_they_are_and_batch_first_x_transposed(setup):
    x, params, zeros, driver, program, _ = setup
    # [B, T, I], copied to [T, B, I] at each call (large enough to be mapped: see `built`)
    given = torch.randn(B, T, 1 << 14)
    lane = make(setup, batch_first=True, x=given)
    states = [torch.randn(L, B, H), torch.randn(L, B, H)]
    with torch.no_grad():
        assert lane(given, params, states, STREAM) is None
        assert list(lane.missed()[5:7]) == [s.data_ptr() for s in states]
        assert lane.missed()[2] != given.data_ptr()  # (its copy's)
        y, _ = replayed(lane, given, params, states)
    assert tuple(y.shape) == (B, T, H)  # (the module's layout)
    assert y.stride() == (H, ROW, 1)


def test_a_16_bit_x_over_float32_memory_gets_its_outputs_back_in_its_own_type(setup):
    """Where the plan stores y and the states float32 for a 16-bit x, the lane runs over memory of its
    zeros' type and gives y and the final states back in x's, one copy of the outputs; states given must
    be of the plan's type (the runner converts others: Python's call)."""
    x, params, zeros, driver, program, lock = setup
    x16 = x.to(torch.bfloat16)
    lane = quick_lane.make(x16, params, zeros, False, (T, B, H, L), BLOCK, OUTPUTS_END, FINALS_AT, PACKED,
                           STREAM, (lock, program.turn), program, driver=driver.entry_points, context=CONTEXT)
    with torch.no_grad():
        y, finals = replayed(lane, x16, params)
        assert y.dtype == torch.bfloat16 and [f.dtype for f in finals] == [torch.bfloat16] * 2
        assert tuple(y.shape) == (T, B, H) and y.untyped_storage().nbytes() == OUTPUTS_END * 2
        assert lane(x16, params, [s.to(torch.bfloat16) for s in zeros], STREAM) is None
        assert lane(x, params, None, STREAM) is None  # (x of another type)
        given = [torch.randn(L, B, H), torch.randn(L, B, H)]
        assert replayed(lane, x16, params, given)[0].dtype == torch.bfloat16
    assert program._replays == 2


def test_a_call_the_lane_cannot_make_as_python_would_is_left_to_python(setup):
    x, params, zeros, driver, program, lock = setup
    lane = make(setup)
    with torch.no_grad():
        replayed(lane, x, params)
        launches = len(driver.launches)

        def refused(*call, stream=STREAM) -> bool:
            """Left to Python before the call's memory was taken (else it would have missed or replayed)."""
            missed = lane.missed()
            return lane(*call, stream) is None and lane.missed() == missed

        assert refused(torch.randn(T + 1, B, H), params, None)  # shape
        assert refused(x.double(), params, None)  # dtype
        assert refused(x.transpose(0, 1), params, None)  # (B, T, H): another shape
        assert refused(x, params[:1], None)  # parameters missing
        assert refused(x, [params[1], params[0]], None)  # in another order
        assert refused(x, tuple(params), None)  # not the list a module gives
        assert refused(x, [torch.nn.Parameter(p.detach().clone()) for p in params], None)  # other tensors
        assert refused(x, params, [zeros[0]])  # a state missing
        assert refused(x, params, [torch.zeros(L, B + 1, H)] * 2)  # a state's shape
        assert refused(x, params, [torch.zeros(L, B, H, dtype=torch.float64)] * 2)  # its dtype
        assert refused(x, params, [torch.zeros(L, H, B).transpose(1, 2)] * 2)  # not contiguous
        assert refused(x, params, None, stream=STREAM + 1)  # another stream
        driver.capturing = 1
        assert refused(x, params, None)  # the stream is capturing
        driver.capturing, driver.context = 0, CONTEXT + 1
        assert refused(x, params, None)  # another driver context
        driver.context = CONTEXT
        with lock:
            assert refused(x, params, None)  # another thread's run under way
        with torch.enable_grad():
            assert refused(x, params, None)  # a gradient to follow
        assert len(driver.launches) == launches  # (none of them launched)
        replayed(lane, x, params)  # (and it replays again after all of them)


def test_parameters_changed_in_place_or_a_change_counted_end_the_lane(setup):
    x, params, zeros, driver, program, _ = setup
    with torch.no_grad():
        lane = make(setup)
        replayed(lane, x, params)
        params[0].add_(1.0)  # (their version moves on: Python packs them again)
        missed = lane.missed()
        assert lane(x, params, None, STREAM) is None and lane.missed() == missed
        lane = make(setup)
        replayed(lane, x, params)
        assert lane.current()
        CHANGES.bump()  # (another stream's run, a packing dropped, a captured run released)
        missed = lane.missed()
        assert not lane.current() and lane(x, params, None, STREAM) is None and lane.missed() == missed


def test_autocast_on_cuda_leaves_float32_calls_to_python(setup):
    x, params, zeros, driver, program, _ = setup
    lane = make(setup)
    with torch.no_grad():
        replayed(lane, x, params)
        torch.set_autocast_enabled("cuda", True)
        missed, launches = lane.missed(), len(driver.launches)
        try:
            assert lane(x, params, None, STREAM) is None
            assert lane.missed() == missed and len(driver.launches) == launches  # (refused at once)
        finally:
            torch.set_autocast_enabled("cuda", False)
        replayed(lane, x, params)


def test_a_failed_replay_is_left_to_python_and_not_counted(setup):
    x, params, zeros, driver, program, _ = setup
    lane = make(setup)
    with torch.no_grad():
        replayed(lane, x, params)
        driver.error, replays, launches = 1, program._replays, len(driver.launches)
        for _ in range(100):  # (until it finds the run again: see `replayed`)
            assert lane(x, params, None, STREAM) is None
            if len(driver.launches) > launches:
                break
            lane.learn(lane.missed(), GRAPH)
        assert len(driver.launches) == launches + 1 and program._replays == replays


def test_bad_arguments_get_errors_not_crashes(setup):
    x, params, zeros, driver, program, _ = setup
    lane = make(setup)
    with pytest.raises(TypeError, match="lane\\(x, params, states or None, stream\\)"):
        lane(x, params)
    with pytest.raises(ValueError, match="one per state"):
        quick_lane.make(x, params, zeros, False, (T, B, H, L), BLOCK, OUTPUTS_END, FINALS_AT[:1], PACKED,
                        STREAM, (threading.Lock(), program.turn), program, driver=driver.entry_points,
                        context=CONTEXT)
    assert lane("x", params, None, STREAM) is None  # (not a tensor: Python's call says what is wrong)


# a PackedSequence's lane: x [T', B, PH] padded from data [N, PH] (T' = 4: 3 steps rounded up), the LSTM's
# two states and the steps-left state, each final state at its place in the call's memory (x and the
# states large enough to be mapped: see `built`)
PH = 1 << 14
PACKED_FINALS_AT = tuple(5 * B * PH + i * L * B * PH for i in range(3))
PACKED_OUTPUTS_END, UNPACK, GRID = 8 * B * PH, 0xF00, 3
SIZES = torch.tensor([2, 2, 1])


def _rows_args(raw: bytes) -> dict:
    """cf_unpack_rows's / cf_pack_rows's arguments by name (the sizes and offsets as lists)."""
    values = args_struct(ROWS_CAPACITY).unpack(raw)
    args = {name: value for (name, _, _), value in zip(args_fields(ROWS_CAPACITY)[:9], values, strict=False)}
    args["sizes"], args["offsets"] = list(values[9:9 + ROWS_CAPACITY]), list(values[9 + ROWS_CAPACITY:])
    return args


PACK = 0xF40


class _Kernels:
    """What quick_lane.rows reads of gpu_runtime.packed_rows.PackedRows."""

    functions, capacity = (UNPACK, PACK, ZERO, REVERSE), ROWS_CAPACITY


def _rows(driver, itemsize=4):
    return quick_lane.rows(_Kernels(), -1, itemsize, driver=driver.entry_points[2:], context=CONTEXT)


def test_rows_pads_a_packed_sequences_data_by_one_launch_of_the_kernel(built):
    driver, data, sizes = FakeDriver(), torch.randn(5, 3, 4), torch.tensor([2, 2, 1])
    x, left = _rows(driver).padded(data, sizes, 4, 6, 2, STREAM)
    assert x.shape == (4, 2, 3, 4) and x.dtype == data.dtype and left.shape == (2, 2, 6)
    assert left.dtype == torch.float32
    [(function, grid, block, stream, raw)] = driver.kernels
    # (a warp a row: x's 4 x 2 rows and the steps-left state's 2 x 2, 8 rows a block of 256 threads)
    assert (function, grid, block, stream) == (UNPACK, 2, 256, STREAM)
    args = _rows_args(raw)
    assert (args["src"], args["dst"], args["steps"]) == (data.data_ptr(), x.data_ptr(), left.data_ptr())
    assert (args["elements"], args["steps_elements"]) == (4 * 2 * 12, 2 * 2 * 6)
    assert (args["T"], args["B"], args["W"], args["H"]) == (3, 2, 12, 6)
    assert args["sizes"][:4] == [2, 2, 1, 0] and args["offsets"][:4] == [0, 2, 4, 0]
    # y's gradient: no steps-left state
    strided = torch.randn(7, 5).t()
    x, left = _rows(driver).padded(strided, sizes, 3, 1, 0, STREAM)
    assert x.shape == (3, 2, 7) and left is None
    args = _rows_args(driver.kernels[-1][-1])
    assert (args["steps"], args["steps_elements"], args["W"]) == (0, 0, 7)
    assert args["src"] not in (0, strided.data_ptr())  # (not contiguous: a contiguous copy's address)


def test_rows_packs_y_by_one_launch_of_the_other_kernel(built):
    driver, sizes = FakeDriver(), torch.tensor([3, 1, 1])
    y = torch.randn(4, 3, 5, 2)
    data = _rows(driver).packed(y, sizes, STREAM)
    assert data.shape == (5, 5, 2) and data.dtype == y.dtype
    [(function, grid, block, stream, raw)] = driver.kernels
    assert (function, grid, block, stream) == (PACK, 1, 256, STREAM)
    args = _rows_args(raw)
    assert (args["src"], args["dst"], args["steps"]) == (y.data_ptr(), data.data_ptr(), 0)
    assert (args["elements"], args["steps_elements"], args["T"], args["B"], args["W"]) == (50, 0, 3, 3, 10)
    assert args["sizes"][:3] == [3, 1, 1] and args["offsets"][:3] == [0, 3, 4]


def test_rows_leave_what_they_cannot_move_as_python_would_to_python(built):
    driver = FakeDriver()
    rows, data, sizes, y = _rows(driver), torch.randn(5, 3), torch.tensor([2, 2, 1]), torch.randn(4, 2, 3)
    for given, sized, steps in (
            (data, torch.tensor([2, 1, 2]), 4),  # sizes that grow
            (data[:4], torch.tensor([2, 2, 0]), 4),  # an empty step
            (data, torch.tensor([2, 2]), 4),  # rows that do not sum to the data's
            (data, sizes.int(), 4),  # not int64
            (torch.randn(ROWS_CAPACITY + 1, 3), torch.ones(ROWS_CAPACITY + 1, dtype=torch.long),
             68),  # more steps than its arguments hold (its rows those of the data)
            (data, sizes, 2),  # fewer steps than the sequence's
            (data.double(), sizes, 4)):  # elements of another size
        assert rows.padded(given, sized, steps, 1, 1, STREAM) is None, (sized, steps)
    steps = torch.ones(ROWS_CAPACITY + 1, dtype=torch.long)  # (more than the arguments hold)
    for given, sized in ((y, torch.tensor([2, 1, 2])), (y[:2], sizes), (torch.randn(4, 3, 3), sizes),
                         (y.double(), sizes), (torch.randn(ROWS_CAPACITY + 1, 1, 3), steps)):
        assert rows.packed(given, sized, STREAM) is None, (given.shape, sized)
    driver.context = CONTEXT + 1  # another context current
    assert rows.padded(data, sizes, 4, 1, 1, STREAM) is None and rows.packed(y, sizes, STREAM) is None
    assert not driver.kernels
    driver.context, driver.kernel_error = CONTEXT, 1  # a launch that failed
    assert rows.padded(data, sizes, 4, 1, 1, STREAM) is None and rows.packed(y, sizes, STREAM) is None
    with pytest.raises(TypeError, match="packed\\(y, batch_sizes, stream\\)"):
        rows.packed(y, sizes)
    with pytest.raises(ValueError, match="2 or 4 bytes"):
        _rows(driver, itemsize=8)
    assert _rows(driver, itemsize=2).padded(data, sizes, 4, 1, 1, STREAM) is None


def _lengths_args(raw: bytes) -> dict:
    """cf_zero_rows's arguments by name (the lengths as a list)."""
    values = args_struct(ROWS_CAPACITY, lengths=True).unpack(raw)
    fields = lengths_args_fields(ROWS_CAPACITY)
    args = {name: value for (name, _, _), value in zip(fields[:-1], values, strict=False)}
    args["lengths"] = list(values[len(fields) - 1:])
    return args


def test_rows_zero_the_padding_of_rows_of_their_own_lengths_by_one_launch(built):
    driver = FakeDriver()
    x, lengths = torch.randn(5, 3, 4), torch.tensor([5, 2, 3])
    zeroed, left = _rows(driver).zeroed(x, lengths, 6, 2, STREAM)
    assert zeroed.shape == (5, 3, 4) and zeroed.dtype == x.dtype
    assert left.shape == (2, 3, 6) and left.dtype == torch.float32
    [(function, grid, block, stream, raw)] = driver.kernels
    # (a warp a row: x's 5 x 3 rows and the steps-left state's 2 x 3, 8 rows a block of 256 threads)
    assert (function, grid, block, stream) == (ZERO, 3, 256, STREAM)
    args = _lengths_args(raw)
    assert (args["src"], args["dst"], args["steps"]) == (x.data_ptr(), zeroed.data_ptr(), left.data_ptr())
    assert (args["t_stride"], args["b_stride"], args["steps_elements"]) == (12, 4, 2 * 3 * 6)
    assert (args["T"], args["B"], args["W"], args["H"]) == (5, 3, 4, 6)
    assert args["lengths"][:4] == [5, 2, 3, 0] and not any(args["lengths"][4:])
    # a batch-first x as it is (its strides), and no steps-left state
    given = torch.randn(3, 5, 4)
    zeroed, left = _rows(driver).zeroed(given.transpose(0, 1), lengths, 1, 0, STREAM)
    assert zeroed.shape == (5, 3, 4) and zeroed.is_contiguous() and left is None
    args = _lengths_args(driver.kernels[-1][-1])
    assert (args["src"], args["t_stride"], args["b_stride"]) == (given.data_ptr(), 4, 20)
    assert (args["steps"], args["steps_elements"]) == (0, 0)
    # every row T long: x itself, nothing to zero; the launch writes the steps-left state alone
    full = torch.tensor([5, 5, 5])
    zeroed, left = _rows(driver).zeroed(x, full, 6, 2, STREAM)
    assert zeroed is x and left.shape == (2, 3, 6)
    args = _lengths_args(driver.kernels[-1][-1])
    assert (args["src"], args["dst"], args["T"], args["steps"]) == (0, 0, 0, left.data_ptr())
    assert driver.kernels[-1][1] == 1 and args["lengths"][:3] == [5, 5, 5]  # (a warp a row of the state)
    launched = len(driver.kernels)
    assert _rows(driver).zeroed(x, full, 1, 0, STREAM) == (x, None) and len(driver.kernels) == launched


def test_rows_leave_lengths_and_x_they_cannot_zero_as_python_would_to_python(built):
    driver = FakeDriver()
    rows, x, lengths = _rows(driver), torch.randn(5, 3, 4), torch.tensor([5, 2, 3])
    for given, told in (
            (x, torch.tensor([5, 0, 3])),  # a length below 1 (Python's check says why)
            (x, torch.tensor([5, 6, 3])),  # one past the sequence
            (x, lengths.int()),  # not int64
            (x, lengths[:2]),  # not one a row
            (x, torch.tensor([[5, 2, 3]])),  # not one-dimensional
            (x, torch.tensor([5, 9, 2, 9, 3])[::2]),  # not contiguous
            (torch.randn(4, 5, 3).permute(1, 2, 0), lengths),  # x's rows not contiguous
            (torch.randn(5, 3), lengths),  # not [T, B, width]
            (torch.randn(5, 0, 4), torch.tensor([], dtype=torch.long)),  # no rows
            (torch.randn(2, ROWS_CAPACITY + 1, 1),
             torch.ones(ROWS_CAPACITY + 1, dtype=torch.long)),  # more rows than its arguments hold
            (x.double(), lengths)):  # elements of another size
        assert rows.zeroed(given, told, 2, 1, STREAM) is None, (given.shape, told)
    assert rows.zeroed(x, lengths, 0, 1, STREAM) is None  # (no hidden size)
    driver.context = CONTEXT + 1  # another context current
    assert rows.zeroed(x, lengths, 2, 1, STREAM) is None
    assert not driver.kernels
    driver.context, driver.kernel_error = CONTEXT, 1  # a launch that failed
    assert rows.zeroed(x, lengths, 2, 1, STREAM) is None
    with pytest.raises(TypeError, match="zeroed\\(x, lengths, hidden, state_layers, stream\\)"):
        rows.zeroed(x, lengths, 2, 1)


def test_rows_reverse_rows_of_their_own_lengths_by_one_launch(built):
    driver = FakeDriver()
    x, lengths = torch.randn(5, 3, 4), torch.tensor([5, 2, 3])
    reversed_ = _rows(driver).reversed(x, lengths, STREAM)
    assert reversed_.shape == (5, 3, 4) and reversed_.dtype == x.dtype and reversed_.is_contiguous()
    [(function, grid, block, stream, raw)] = driver.kernels
    # (a warp a row: x's 5 x 3 rows, 8 rows a block of 256 threads)
    assert (function, grid, block, stream) == (REVERSE, 2, 256, STREAM)
    args = _lengths_args(raw)
    assert (args["src"], args["dst"], args["steps"]) == (x.data_ptr(), reversed_.data_ptr(), 0)
    assert (args["t_stride"], args["b_stride"], args["steps_elements"]) == (12, 4, 0)
    assert (args["T"], args["B"], args["W"]) == (5, 3, 4)
    assert args["lengths"][:4] == [5, 2, 3, 0] and not any(args["lengths"][4:])
    # a batch-first x as it is (its strides); every row T long is reversed all the same (a new tensor)
    given = torch.randn(3, 5, 4)
    reversed_ = _rows(driver).reversed(given.transpose(0, 1), torch.tensor([5, 5, 5]), STREAM)
    assert reversed_.shape == (5, 3, 4) and reversed_.data_ptr() != given.data_ptr()
    args = _lengths_args(driver.kernels[-1][-1])
    assert (args["src"], args["t_stride"], args["b_stride"]) == (given.data_ptr(), 4, 20)
    assert args["lengths"][:3] == [5, 5, 5]


def test_rows_leave_lengths_and_x_they_cannot_reverse_as_python_would_to_python(built):
    driver = FakeDriver()
    rows, x, lengths = _rows(driver), torch.randn(5, 3, 4), torch.tensor([5, 2, 3])
    for given, told in (
            (x, torch.tensor([5, 0, 3])),  # a length below 1
            (x, torch.tensor([5, 6, 3])),  # one past the sequence
            (x, lengths.int()),  # not int64
            (x, lengths[:2]),  # not one a row
            (torch.randn(4, 5, 3).permute(1, 2, 0), lengths),  # x's rows not contiguous
            (torch.randn(5, 3), lengths),  # not [T, B, width]
            (torch.randn(2, ROWS_CAPACITY + 1, 1),
             torch.ones(ROWS_CAPACITY + 1, dtype=torch.long)),  # more rows than its arguments hold
            (x.double(), lengths)):  # elements of another size
        assert rows.reversed(given, told, STREAM) is None, (given.shape, told)
    driver.context = CONTEXT + 1  # another context current
    assert rows.reversed(x, lengths, STREAM) is None
    assert not driver.kernels
    driver.context, driver.kernel_error = CONTEXT, 1  # a launch that failed
    assert rows.reversed(x, lengths, STREAM) is None
    with pytest.raises(TypeError, match="reversed\\(x, lengths, stream\\)"):
        rows.reversed(x, lengths)


@pytest.fixture
def packed_setup(setup):
    """setup, with the module's zeros of the packed lane's states and data to pad."""
    _, params, _, driver, program, lock = setup
    zeros = [torch.zeros(L, B, PH), torch.zeros(L, B, PH)]
    lane = quick_lane.make(torch.zeros(4, B, PH), params, [*zeros, torch.zeros(L, B, PH)], False,
                           (4, B, PH, L), BLOCK, PACKED_OUTPUTS_END, PACKED_FINALS_AT, PACKED, STREAM,
                           (lock, program.turn), program, driver=driver.entry_points, context=CONTEXT,
                           rows=(UNPACK, ROWS_CAPACITY, GRID))
    return lane, torch.randn(int(SIZES.sum()), PH), params, zeros, driver


def packed_replayed(lane, data, params, taught=None):
    """As `replayed`, for a PackedSequence's call; `taught` gets the bases of each run it was taught."""
    for _ in range(100):
        done = lane.packed(data, SIZES, params, STREAM)
        if done is not None:
            return done
        if taught is not None:
            taught.append(lane.missed())
        lane.learn(lane.missed(), GRAPH)
    raise AssertionError("the lane never replayed")


def test_a_lane_pads_a_packed_sequence_by_the_kernel_then_replays_the_run(packed_setup):
    lane, data, params, zeros, driver = packed_setup
    with torch.no_grad():
        assert lane.packed(data, SIZES, params, STREAM) is None and not driver.kernels  # (no run known)
        taught = []
        y, finals = packed_replayed(lane, data, params, taught)
    assert driver.order == ["kernel", "graph"]  # (the padding first, on the same stream)
    function, grid, block, stream, raw = driver.kernels[0]
    assert (function, grid, block, stream) == (UNPACK, GRID, 256, STREAM)
    values = args_struct(ROWS_CAPACITY).unpack(raw)
    args = {name: value for (name, _, _), value in zip(args_fields(ROWS_CAPACITY)[:9], values, strict=False)}
    args["sizes"], args["offsets"] = values[9:9 + ROWS_CAPACITY], values[9 + ROWS_CAPACITY:]
    assert int(args["src"]) == data.data_ptr()
    # the bases of the run it replayed, one it was taught: x and the steps-left state where it padded
    # them, after the module's zeros
    assert (PACKED, int(args["dst"]), 0, *(z.data_ptr() for z in zeros), int(args["steps"])) in [
        (packed, x_at, grads, h0, c0, steps) for _, packed, x_at, _, grads, h0, c0, steps, *_ in taught]
    assert (int(args["elements"]), int(args["steps_elements"])) == (4 * B * PH, L * B * PH)
    assert (int(args["T"]), int(args["B"]), int(args["W"]), int(args["H"])) == (3, B, PH, PH)
    assert list(args["sizes"][:4]) == [2, 2, 1, 0] and list(args["offsets"][:4]) == [0, 2, 4, 0]
    assert tuple(y.shape) == (4, B, PH) and [tuple(f.shape) for f in finals] == [(L, B, PH)] * 3


def test_a_packed_sequence_the_lane_cannot_pad_as_python_would_is_left_to_python(setup, packed_setup):
    lane, data, params, _, driver = packed_setup
    with torch.no_grad():
        packed_replayed(lane, data, params)
        kernels, launches, missed = len(driver.kernels), len(driver.launches), lane.missed()
        for sizes, given in (
                (torch.tensor([2, 1, 2]), data),  # sizes that grow
                (torch.tensor([2, 2, 0]), data[:4]),  # an empty step
                (torch.tensor([1, 1, 1]), data[:3]),  # the first is not B
                (torch.tensor([2, 2, 1, 1, 1]), torch.randn(7, PH)),  # 5 steps: 8 when rounded up, not 4
                (torch.tensor([2, 2]), data),  # rows that do not sum to the data's
                (SIZES.int(), data),  # not int64
                (SIZES, data.double()),  # data of another dtype
                (SIZES, torch.randn(PH, 5).t()),  # not contiguous
                (SIZES, torch.randn(5, PH + 1))):  # another width
            assert lane.packed(given, sizes, params, STREAM) is None, sizes
        assert lane.packed(data, SIZES, params, STREAM + 1) is None  # another stream
        with torch.enable_grad():
            assert lane.packed(data, SIZES, params, STREAM) is None
        assert (len(driver.kernels), len(driver.launches), lane.missed()) == (kernels, launches, missed)
        assert make(setup).packed(data, SIZES, params, STREAM) is None  # (a lane made without rows)
        with pytest.raises(TypeError, match="packed\\(data, batch_sizes, params, stream\\)"):
            lane.packed(data, SIZES, params)


def test_lanes_made_and_dropped_leave_no_reference_behind(setup):
    import sys

    lane_type = quick_lane.module().Lane
    program = setup[4]
    before = sys.getrefcount(lane_type), sys.getrefcount(program), sys.getrefcount(CHANGES)
    for _ in range(100):
        make(setup)
    assert (sys.getrefcount(lane_type), sys.getrefcount(program), sys.getrefcount(CHANGES)) == before


class _Program:
    what = "a test's forward kernels"

    def __init__(self):
        self.turn = threading.RLock()
        self._replays = 0

    def kept_graph(self, bases):
        return 0x6A0


class _PackedFor:
    def __init__(self, answers):
        self.answers = list(answers)

    def matches(self, params):
        return self.answers.pop(0)


def _runner(params, packed_for):
    """What CudaRunner.call_lane reads of its runner, as a stand-in (no GPU here)."""
    from types import SimpleNamespace

    return SimpleNamespace(_block_run=(_Program(), [1, 2, 3], PACKED, STREAM), lock=threading.Lock(),
                           _packings={id(params[0]): (None, packed_for)}, _y_dtype=torch.float32,
                           _sizes=(T, B, H, L), _block_elements=BLOCK, _outputs_end=OUTPUTS_END,
                           _finals_at=FINALS_AT)


def test_a_lane_that_cannot_be_made_leaves_the_call_to_python_without_an_error(setup, monkeypatch, caplog):
    from cellfuse.nn.cuda_runner import CudaRunner

    x, params, zeros, *_ = setup

    class Weight(torch.nn.Parameter):  # (a subclass: the lane reads only torch's own types)
        pass

    subclassed = [Weight(p.detach().clone()) for p in params]
    made = []
    monkeypatch.setattr(quick_lane, "make", lambda *a, **k: made.append(1) or pytest.fail("made"))
    assert CudaRunner.call_lane(_runner(subclassed, _PackedFor([True])), None, x, subclassed, zeros,
                                False) is None
    assert not made

    def failing(*args, **kwargs):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(quick_lane, "make", failing)
    with caplog.at_level("WARNING"):
        runner = _runner(params, _PackedFor([True]))
        assert CudaRunner.call_lane(runner, None, x, params, zeros, False) is None
    assert "no C++ lane for calls like this one (libcuda.so.1" in caplog.text


def test_a_lane_is_not_kept_where_a_parameter_changed_while_it_was_made(setup, monkeypatch):
    from cellfuse.nn.cuda_runner import CudaRunner

    x, params, zeros, *_ = setup
    lane = object()
    monkeypatch.setattr(quick_lane, "make", lambda *a, **k: lane)
    # (the packed parameters as they are before the lane reads their versions, and not after)
    assert CudaRunner.call_lane(_runner(params, _PackedFor([True, False])), None, x, params, zeros,
                                False) is None


def _packing_runner(calls):
    """A runner's packing over stand-ins: two parts, a [4, 4] weight's at byte 0 and a bias's at byte 64,
    a kernel that is `calls`."""
    from types import SimpleNamespace

    from cellfuse.codegen.plan import ParamPart
    from cellfuse.nn.cuda_runner import CudaRunner

    made = []
    parts = [(0, 0, ParamPart("w", "l0.W", 0, 4, 4, 4), torch.float32),
             (1, 64, ParamPart("b", "l0.b", 0, 4, 4, 1), torch.float32)]
    runner = SimpleNamespace(_pack_parts=parts, _pack_calls=OrderedDict(),
                             _pack_kernel=lambda *made_of: made.append(made_of) or calls)
    runner._pack_call = lambda params, capturing: CudaRunner._pack_call(runner, params, capturing)
    return runner, made


def test_weights_whose_packing_in_one_call_fails_are_packed_by_torchs_ops_from_then_on(caplog):
    from cellfuse.graph_model import CellError
    from cellfuse.nn.cuda_runner import CudaRunner

    class Calls:
        runs = 0

        def run(self, bases, stream):
            Calls.runs += 1
            raise CellError("the packing of the LSTM's weights: CUDA_ERROR_INVALID_VALUE")

    params = [torch.zeros(4, 4), torch.zeros(4)]
    runner, _ = _packing_runner(Calls())
    with caplog.at_level("WARNING"):
        assert not CudaRunner._packed_in_one_call(runner, 0x7000, params, STREAM)
    assert runner._pack_parts is None and "packing with torch's ops from now on" in caplog.text
    assert not CudaRunner._packed_in_one_call(runner, 0x7000, params, STREAM) and Calls.runs == 1


def test_the_packing_kernel_reads_each_parameter_with_its_strides_and_is_made_once_per_layout():
    """A transposed view (the drop-ins' weights) is read down its columns; parameters of another type
    than their buffers', or laid out otherwise than strides say, are left to torch's ops; each layout's
    kernel (or None) is made once."""
    from cellfuse.nn.cuda_runner import CudaRunner

    runner, made = _packing_runner("the kernel's calls")
    weight, bias = torch.zeros(4, 4), torch.zeros(8)[::2]
    assert CudaRunner._pack_call(runner, [weight.t(), bias]) == "the kernel's calls"
    (copies, sources, n_params), = made
    assert sources == [0, 1] and n_params == 2
    assert [(c.at, c.row_stride, c.col_stride, c.by_columns) for c in copies] == [(0, 1, 4, True),
                                                                                 (64, 8, 2, False)]
    CudaRunner._pack_call(runner, [weight.t(), bias])
    CudaRunner._pack_call(runner, [torch.zeros(4, 4), bias])  # (another layout: another kernel)
    assert len(made) == 2 and not made[1][0][0].by_columns
    assert CudaRunner._pack_call(runner, [weight.half(), bias]) is None  # (torch's ops convert)
    assert CudaRunner._pack_call(runner, [torch.zeros(32)[::2], bias]) is None  # (16 strided elements)
    assert len(made) == 2


def test_a_layout_first_packed_under_a_capture_is_left_to_torchs_ops_and_few_layouts_are_kept(monkeypatch):
    """Making a packing kernel loads a module, which would break a CUDA graph capture: a layout first
    seen under one is packed by torch's ops (nothing kept); one made before is used there. A runner keeps
    the last MAX_PACK_KERNELS layouts' kernels."""
    from cellfuse.nn import cuda_runner
    from cellfuse.nn.cuda_runner import CudaRunner

    runner, made = _packing_runner("the kernel's calls")
    params = [torch.zeros(4, 4), torch.zeros(4)]
    assert CudaRunner._pack_call(runner, params, capturing=True) is None and not made
    assert not runner._pack_calls
    assert CudaRunner._pack_call(runner, params) == "the kernel's calls"
    assert CudaRunner._pack_call(runner, params, capturing=True) == "the kernel's calls" and len(made) == 1
    monkeypatch.setattr(cuda_runner, "MAX_PACK_KERNELS", 2)
    for width in (8, 12):  # (weights of other strides: views into wider tensors)
        CudaRunner._pack_call(runner, [torch.zeros(4, width)[:, :4], params[1]])
    assert len(runner._pack_calls) == 2 and len(made) == 3
    assert CudaRunner._pack_call(runner, params, capturing=True) is None  # (the first layout's dropped)
