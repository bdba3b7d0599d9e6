"""The launch list's C code, built by nvcc and run on the CPU against entry points of the test's own that
record what they are called with: the pointer arguments it writes (a run's base plus fixed offsets), the
calls in order on their streams, cuBLAS's stream set when the run's stream changes, and the
errors it reports naming the call."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from cellfuse.gpu_runtime import kernel_cache, launch_list
from cellfuse.gpu_runtime.launch_list import EARLY, Api, LaunchList
from cellfuse.graph_model import CellError

pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")]

u64 = ctypes.c_uint64
p = ctypes.c_void_p


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CELLFUSE_CACHE_DIR", str(tmp_path / "cache"))
    launch_list.library.cache_clear()
    yield
    launch_list.library.cache_clear()


class Recorder:
    """An Api whose entry points append (what, arguments) to `calls`; `fail` maps an entry to the code it
    returns."""

    def __init__(self, fail: dict[str, int] | None = None):
        self.calls: list[tuple] = []
        self.fail = fail or {}
        i32, u32 = ctypes.c_int, ctypes.c_uint

        def entry(name, restype, *argtypes, record):
            def f(*args):
                self.calls.append((name, *record(*args)))
                return self.fail.get(name, 0)
            return ctypes.CFUNCTYPE(restype, *argtypes)(f)

        def kernel_args(params, n):
            table = ctypes.cast(params, ctypes.POINTER(p))
            return tuple(ctypes.cast(table[i], ctypes.POINTER(u64))[0] for i in range(n))

        self.args = {}  # function -> its argument count, to read the table

        self.entries = [
            entry("launch", i32, p, u32, u32, u32, u32, u32, u32, u32, p, p, p,
                  record=lambda f, gx, gy, gz, bx, by, bz, smem, s, params, extra:
                  (f, (gx, gy, gz), bx, smem, s, kernel_args(params, self.args[f]))),
            entry("launch_cooperative", i32, p, u32, u32, u32, u32, u32, u32, u32, p, p,
                  record=lambda f, gx, gy, gz, bx, by, bz, smem, s, params:
                  (f, (gx, gy, gz), bx, smem, s, kernel_args(params, self.args[f]))),
            entry("launch_ex", i32, p, p, p, p, record=lambda config, f, params, extra:
                  (f, ctypes.cast(config, ctypes.POINTER(ctypes.c_uint32))[0],
                   ctypes.cast(config, ctypes.POINTER(p))[4], kernel_args(params, self.args[f]))),
            entry("copy", i32, u64, u64, ctypes.c_size_t, p, record=lambda d, s, n, st: (d, s, n, st)),
            entry("record", i32, p, p, record=lambda e, s: (e, s)),
            entry("wait", i32, p, p, u32, record=lambda s, e, f: (s, e)),
            entry("synchronize", i32, record=lambda: ()),
            entry("sgemm", i32, p, i32, i32, i32, i32, i32, p, p, i32, p, i32, p, p, i32,
                  record=lambda *a: a),
            entry("gemm_ex", i32, *[p] * 19, record=lambda *a: a),
            entry("set_stream", i32, p, p, record=lambda h, s: (h, s)),
            entry("fill", i32, u64, ctypes.c_uint, ctypes.c_size_t, p,
                  record=lambda d, v, n, st: (d, v, n, st)),
            entry("set_pointer_mode", i32, p, i32, record=lambda h, mode: (h, mode)),
        ]
        self.api = Api(*(ctypes.cast(e, p).value for e in self.entries))


def program(recorder: Recorder) -> LaunchList:
    calls = LaunchList("a test's calls")
    recorder.args = {0x1000: 3, 0x2000: 1}
    calls.kernel(0x1000, "cf_step", (3,), 128, 0, [(0, 16), 7, (1, 0)], stream=0)
    calls.copy((1, 8), (0, 0), 64, stream=1, name="the copy of h")
    calls.sgemm(0x99, [1, 0, 5, 6, 7, 0x10, (0, 0), 5, (1, 4), 7, 0x20, (0, 32), 5], stream=0,
                name="cuBLAS's SGEMM of gemm0")
    calls.record(0x55, 1)
    calls.wait(0x55, 0)
    calls.fill((0, 256), 0x3F800000, 32, stream=0, name="the ones")
    calls.kernel(0x2000, "cf_persistent", (132,), 256, 1024, [(1, 12)], stream=0, kind=EARLY)
    calls.finish([0xAB], [0x99, 0x98], api=recorder.api)
    calls.bind([(1, 100), (0, 0)], bases=3)
    return calls


def test_a_run_writes_each_pointer_from_its_base_and_makes_the_calls_in_order():
    recorder = Recorder()
    calls = program(recorder)
    calls.run([1000, 2000, 3000], 0xCD)
    assert recorder.calls == [
        ("set_stream", 0x99, 0xCD),
        ("launch", 0x1000, (3, 1, 1), 128, 0, 0xCD, (2100 + 16, 7, 1000)),
        ("copy", 1000 + 8, 2100, 64, 0xAB),
        ("sgemm", 0x99, 1, 0, 5, 6, 7, 0x10, 2100, 5, 1004, 7, 0x20, 2132, 5),
        ("record", 0x55, 0xAB),
        ("wait", 0xCD, 0x55),
        ("fill", 2100 + 256, 0x3F800000, 32, 0xCD),
        ("launch_ex", 0x2000, 132, 0xCD, (1012,)),
    ]


def test_cublas_stream_is_set_only_when_the_run_stream_changes():
    recorder = Recorder()
    calls = program(recorder)
    calls.run([1000, 2000], 0xCD)
    calls.run([5000, 6000], 0xCD)
    assert [c[0] for c in recorder.calls].count("set_stream") == 1
    assert recorder.calls[-1] == ("launch_ex", 0x2000, 132, 0xCD, (5012,))  # the new bases
    calls.run([5000, 6000], 0xEF)
    assert [c for c in recorder.calls if c[0] == "set_stream"][-1] == ("set_stream", 0x99, 0xEF)


def test_a_run_may_be_given_more_bases_than_its_calls_read_where_bound_for_them():
    """A packing's run is given every parameter, also one no call reads (the last, here): bound with room
    for them, the run takes them and reads the ones its calls name."""
    recorder = Recorder()
    recorder.args = {0x1000: 2}
    calls = LaunchList("a packing")
    calls.kernel(0x1000, "cf_pack", (1,), 256, 0, [(0, 0), (2, 0)], stream=0)
    calls.finish(api=recorder.api)
    with pytest.raises(ValueError):
        calls.run([1000, 2000, 3000, 4000], 0xCD)
    calls.bind([(slot, 0) for slot in range(4)], bases=4)
    calls.run([1000, 2000, 3000, 4000], 0xCD)
    assert recorder.calls == [("launch", 0x1000, (1, 1, 1), 256, 0, 0xCD, (1000, 3000))]


def _gemms(recorder: Recorder, device_scalars: tuple[bool, ...]) -> LaunchList:
    """cublasGemmEx calls of one handle, alpha at slot 0's base and beta 4 bytes on, operands at slot 1's."""
    calls = LaunchList("a GEMM's calls")
    args = [0, 0, 4, 5, 6, (0, 0), (1, 0), 2, 4, (1, 64), 2, 6, (0, 4), (1, 128), 0, 4, 68, -1]
    for device in device_scalars:
        calls.gemm_ex(0x99, args, stream=0, name=f"the GEMM of {'device' if device else 'host'} scalars",
                      device_scalars=device)
    calls.finish(handles=[0x99], api=recorder.api)
    calls.bind([(0, 0), (1, 0)])
    return calls


def test_a_gemm_of_device_scalars_sets_the_handles_pointer_mode_for_itself_alone():
    """cublasGemmEx given alpha and beta in device memory: the handle's pointer mode DEVICE (1) around
    that call and HOST (0) again after it; a GEMM of host scalars leaves it alone."""
    recorder = Recorder()
    _gemms(recorder, (False, True)).run([1000, 2000], 0xCD)
    assert [c[0] for c in recorder.calls] == ["set_stream", "gemm_ex", "set_pointer_mode", "gemm_ex",
                                              "set_pointer_mode"]
    assert recorder.calls[2] == ("set_pointer_mode", 0x99, 1)
    assert recorder.calls[4] == ("set_pointer_mode", 0x99, 0)
    assert recorder.calls[3][7] == 1000 and recorder.calls[3][14] == 1004  # alpha, beta: device addresses


def test_a_failing_gemm_of_device_scalars_is_named_and_its_pointer_mode_put_back():
    recorder = Recorder(fail={"gemm_ex": 7})
    with pytest.raises(CellError, match="cuBLAS error 7 while running the GEMM of device scalars"):
        _gemms(recorder, (True,)).run([1000, 2000], 0xCD)
    assert [c[0] for c in recorder.calls] == ["set_stream", "set_pointer_mode", "gemm_ex", "set_pointer_mode"]
    assert recorder.calls[-1] == ("set_pointer_mode", 0x99, 0)


def test_a_failing_call_is_named():
    calls = program(Recorder(fail={"sgemm": 13}))
    with pytest.raises(CellError, match=r"a test's calls: cuBLAS error 13 while running cuBLAS's SGEMM of "
                                        r"gemm0"):
        calls.run([1000, 2000], 0xCD)


def test_checked_runs_wait_after_every_call(monkeypatch):
    recorder = Recorder()
    calls = program(recorder)
    monkeypatch.setattr(launch_list, "CHECK_LAUNCHES", True)
    calls.run([1000, 2000], 0xCD)
    names = [c[0] for c in recorder.calls]
    assert names.count("synchronize") == 7  # (one a call)
    assert names[names.index("copy") + 1] == "synchronize"


def test_the_library_is_built_once_and_found_by_later_processes(monkeypatch):
    launch_list.library()
    launch_list.library.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("nvcc ran again")

    monkeypatch.setattr(kernel_cache.subprocess, "run", refuse)
    assert launch_list.library().cf_run


def test_a_damaged_library_file_is_built_again(tmp_path, caplog):
    path = kernel_cache.shared_library(
        (launch_list.resources.files("cellfuse.resources.host") / "launch_list.c").read_text("utf-8"),
        "launch_list")
    path.write_bytes(b"not a library")
    with caplog.at_level("WARNING", logger=launch_list.__name__):
        assert launch_list.library().cf_run
    assert "does not load" in caplog.text and path.read_bytes()[:4] == b"\x7fELF"
