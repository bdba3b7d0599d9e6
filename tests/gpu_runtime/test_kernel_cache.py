"""The cache of compiled kernels: compiled once, read back by later processes without nvcc, and a bad file
or an unwritable folder never in the way of a run.

The tests marked nvcc compile for real; the others stand a counting fake in for nvcc, since what they
check (the files, the warnings) does not depend on what the cubin holds."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cellfuse.gpu_runtime import kernel_cache
from cellfuse.gpu_runtime.kernel_cache import Compiled, cubin, unpack
from cellfuse.graph_model import CellError

no_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
as_root = hasattr(os, "geteuid") and os.geteuid() == 0
needs_permissions = pytest.mark.skipif(as_root, reason="root reads and writes whatever the permissions say")

TINY = 'extern "C" __global__ void k(float* p) { p[0] = 1; }\n'
ELF = b"\x7fELF"


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    """A cache folder of the test's own, and nothing remembered in memory before or after the test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("CELLFUSE_CACHE_DIR", str(folder))
    memories = (kernel_cache._compiled, kernel_cache.nvcc_version)  # before a test puts a fake in their place
    for memory in memories:
        memory.cache_clear()
    yield folder
    for memory in memories:
        memory.cache_clear()


@pytest.fixture
def fake_nvcc(monkeypatch):
    """nvcc replaced by a fake whose cubin names the source; returns the sources it was asked to compile."""
    compiled = []

    def compile_(source, arch, options):
        compiled.append(source)
        return kernel_cache.Compiled(f"cubin of {source} for {arch}".encode(), {})

    monkeypatch.setattr(kernel_cache, "_compile", compile_)
    monkeypatch.setattr(kernel_cache, "nvcc_version", lambda: "fake nvcc 1.0")
    return compiled


def only_file(cache) -> Path:
    files = list((cache / "kernels").iterdir())
    assert len(files) == 1, files
    return files[0]


def no_nvcc_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"nvcc ran: {args}")

    monkeypatch.setattr(kernel_cache.subprocess, "run", refuse)


@pytest.mark.nvcc
@no_nvcc
def test_a_kernel_compiled_once_is_read_back_without_nvcc(cache, monkeypatch):
    first = cubin(TINY, "sm_90")
    assert first.startswith(ELF)
    assert unpack(only_file(cache).read_bytes()) == (Compiled(first, {}), None)
    kernel_cache._compiled.cache_clear()  # as a new process would start (nvcc's version aside)
    no_nvcc_runs(monkeypatch)
    assert cubin(TINY, "sm_90") == first


@pytest.mark.nvcc
@no_nvcc
def test_a_truncated_file_is_compiled_again_and_fixed(cache, caplog):
    first = cubin(TINY, "sm_90")
    path = only_file(cache)
    path.write_bytes(path.read_bytes()[:100])
    kernel_cache._compiled.cache_clear()
    with caplog.at_level(logging.WARNING, logger=kernel_cache.__name__):
        assert cubin(TINY, "sm_90") == first
    assert [str(path) in r.getMessage() for r in caplog.records] == [True]
    assert unpack(path.read_bytes()) == (Compiled(first, {}), None)


@pytest.mark.nvcc
@no_nvcc
def test_a_compile_error_names_the_generated_line():
    source = 'extern "C" __global__ void k(float* p) {\n    // the value\n    p[0] = nothing_here;\n}\n'
    with pytest.raises(CellError) as error:
        cubin(source, "sm_90")
    assert str(error.value) == ("nvcc could not compile the generated kernels:\n"
                                'line 3: identifier "nothing_here" is undefined\n    p[0] = nothing_here;')


def test_without_nvcc_the_error_says_where_to_look(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(CellError, match=r"^nvcc could not be run \(.*\); is the CUDA toolkit on the PATH\?$"):
        cubin(TINY, "sm_90")


def _truncated(path):
    path.write_bytes(path.read_bytes()[:-1])


def _garbage(path):
    path.write_bytes(b"not a cubin at all, " * 10)


def _empty(path):
    path.write_bytes(b"")


def _another_cubin(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def _a_folder(path):
    path.unlink()
    path.mkdir()


def _unreadable(path):
    path.chmod(0)


@pytest.mark.parametrize("damage", [_truncated, _garbage, _empty, _another_cubin, _a_folder,
                                    pytest.param(_unreadable, marks=needs_permissions)],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_file_is_logged_compiled_again_and_replaced(cache, fake_nvcc, caplog, damage):
    first = cubin("k", "sm_90")
    path = only_file(cache)
    damage(path)
    kernel_cache._compiled.cache_clear()
    with caplog.at_level(logging.WARNING, logger=kernel_cache.__name__):
        assert cubin("k", "sm_90") == first
    assert [str(path) in r.getMessage() for r in caplog.records] == [True]
    assert fake_nvcc == ["k", "k"]
    assert unpack(path.read_bytes()) == (Compiled(first, {}), None)


@needs_permissions
def test_an_unwritable_folder_still_gives_the_cubin(cache, fake_nvcc, caplog):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING, logger=kernel_cache.__name__):
            assert cubin("k", "sm_90") == b"cubin of k for sm_90"
    finally:
        cache.chmod(0o700)
    assert len(caplog.records) == 1 and str(cache / "kernels") in caplog.records[0].getMessage()
    assert not (cache / "kernels").exists()


def test_a_file_where_the_folder_should_be_still_gives_the_cubin(cache, fake_nvcc, caplog):
    """The unwritable folder of a test that runs as root too, which permissions do not stop."""
    cache.write_text("")
    with caplog.at_level(logging.WARNING, logger=kernel_cache.__name__):
        assert cubin("k", "sm_90") == b"cubin of k for sm_90"
    assert len(caplog.records) == 1 and str(cache / "kernels") in caplog.records[0].getMessage()


def test_each_arch_options_and_nvcc_have_a_file_of_their_own(cache, fake_nvcc, monkeypatch):
    cubin("k", "sm_90")
    cubin("k", "sm_90a")
    cubin("k", "sm_90", ("-O2",))
    monkeypatch.setattr(kernel_cache, "nvcc_version", lambda: "fake nvcc 2.0")
    kernel_cache._compiled.cache_clear()
    cubin("k", "sm_90")
    assert len(list((cache / "kernels").iterdir())) == 4 and len(fake_nvcc) == 4


def test_a_process_remembers_its_cubins_in_memory(cache, fake_nvcc):
    first = cubin("k", "sm_90")
    only_file(cache).unlink()
    assert cubin("k", "sm_90") == first and fake_nvcc == ["k"]


def test_the_cache_folder_is_the_users_unless_the_environment_names_one(cache, monkeypatch):
    assert kernel_cache.kernels_dir() == cache / "kernels"
    monkeypatch.delenv("CELLFUSE_CACHE_DIR")
    import platformdirs

    assert kernel_cache.cache_dir() == Path(platformdirs.user_cache_dir("cellfuse"))


COMPILE_IN_A_PROCESS = """
import sys
from cellfuse.gpu_runtime.kernel_cache import cubin
open(sys.argv[1], "wb").write(cubin(sys.argv[2], "sm_90"))
"""


@pytest.mark.slow
@pytest.mark.nvcc
@no_nvcc
def test_two_processes_compiling_one_kernel_at_once_both_get_it(cache, tmp_path):
    outs = [tmp_path / f"out{i}.cubin" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE_IN_A_PROCESS, str(out), TINY], env=os.environ,
                              stderr=subprocess.PIPE, text=True) for out in outs]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    first, second = (out.read_bytes() for out in outs)
    assert first.startswith(ELF) and first == second
    assert unpack(only_file(cache).read_bytes()) == (Compiled(first, {}), None)


# every thread's 64 values live at once: more than 16 registers hold
SPILLER = """extern "C" __global__ void k(const float* p, float* q) {
    float v[64];
    #pragma unroll
    for (int i = 0; i < 64; ++i) v[i] = p[i * blockDim.x + threadIdx.x];
    float s = 0.0f;
    #pragma unroll
    for (int i = 0; i < 64; ++i) s += v[i] * v[63 - i] + v[(i + 1) % 64];
    q[threadIdx.x] = s;
}
"""


@pytest.mark.nvcc
@no_nvcc
def test_ptxas_report_of_spills_is_kept_with_the_cubin(cache):
    assert kernel_cache.compiled(TINY, "sm_90").spills == {}
    spilled = kernel_cache.compiled(SPILLER, "sm_90", ("-O3", "-maxrregcount=16")).spills
    assert list(spilled) == ["k"] and spilled["k"] > 0
    kernel_cache._compiled.cache_clear()
    assert kernel_cache.compiled(SPILLER, "sm_90", ("-O3", "-maxrregcount=16")).spills == spilled


def test_the_spill_report_is_read_from_ptxas_words():
    report = ("ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
              "ptxas info    : Function properties for a\n"
              "    216 bytes stack frame, 216 bytes spill stores, 216 bytes spill loads\n"
              "ptxas info    : Used 255 registers\n"
              "ptxas info    : Function properties for b\n"
              "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")
    assert kernel_cache.spills(report) == {"a": 216}


def _half_the_sms_lstm():
    """The LSTM's kernels on tensor cores at B=64 planned for 66 SMs: 16 blocks of K a warp."""
    from dataclasses import replace

    from cellfuse.codegen import make_plan, plan_kernels
    from cellfuse.codegen.scheduler import H100
    from cellfuse.graph_model import Sizes, load_template

    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "tensor", replace(H100, sm_count=66))
    return plan_kernels(plan)


def _fake_ptxas(monkeypatch, spills_as_written: int, spills_unrolled: int):
    """compiled() replaced: the persistent kernel spills as the arguments say, by how its loops are
    unrolled; returns the sources compiled."""
    seen = []

    def compiled(source, arch, options=("-O3",)):
        seen.append(source)
        bytes_ = spills_unrolled if "#pragma unroll 8" in source else spills_as_written
        return Compiled(f"cubin {len(seen)}".encode(), {"cf_lstm_persistent": bytes_} if bytes_ else {})

    monkeypatch.setattr(kernel_cache, "compiled", compiled)
    return seen


def test_a_kernel_that_does_not_spill_is_compiled_once_as_written(monkeypatch):
    kernels = _half_the_sms_lstm()
    seen = _fake_ptxas(monkeypatch, 0, 0)
    assert kernel_cache.fitted(kernels, "sm_90") == (kernels, b"cubin 1")
    assert seen == [kernels.module_source()]


def test_a_kernel_that_spills_is_compiled_with_its_k_loops_unrolled_less(monkeypatch):
    kernels = _half_the_sms_lstm()
    seen = _fake_ptxas(monkeypatch, 216, 0)
    chosen, cubin_ = kernel_cache.fitted(kernels, "sm_90")
    assert cubin_ == b"cubin 2" and chosen.sources.keys() == kernels.sources.keys()
    assert chosen.name_of == kernels.name_of and chosen.name_of is not kernels.name_of
    written, unrolled = kernels.sources["cf_lstm_persistent"], chosen.sources["cf_lstm_persistent"]
    assert "#pragma unroll 8" not in written and unrolled.count("#pragma unroll 8") == 2  # products, scales
    assert unrolled.replace("#pragma unroll 8", "#pragma unroll") == written
    assert seen == [kernels.module_source(), chosen.module_source()]


def _bf16_lstm_on_tensor_cores():
    from cellfuse.codegen import make_plan, plan_kernels
    from cellfuse.graph_model import Sizes, load_template

    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "tensor", precision="bf16")
    return plan, plan_kernels(plan)


def _spilling_where(monkeypatch, spills) -> list[str]:
    """ptxas faked: the LSTM's persistent kernel spills 8 bytes where `spills(source)`."""
    seen = []

    def compiled(source, arch, options=("-O3",)):
        seen.append(source)
        return Compiled(f"cubin {len(seen)}".encode(), {"cf_lstm_persistent": 8} if spills(source) else {})

    monkeypatch.setattr(kernel_cache, "compiled", compiled)
    return seen


def test_a_kernel_that_spills_with_its_fragments_of_w_is_written_without_them_in_the_end(monkeypatch):
    """The bf16 LSTM's kernel on tensor cores keeps fragments of W in registers (codegen's
    gemm_mma.fragments: at B=64, 12 of a warp's 16 iterations over K in 96 registers); faked to spill with
    any, it is written again with 32 registers fewer for them each time (8 iterations, then 4), which
    still spills, then without them, its loops still unrolled whole, compiled four times; the export says
    how it was written."""
    from cellfuse.codegen.cuda_export import emit

    plan, kernels = _bf16_lstm_on_tensor_cores()
    seen = _spilling_where(monkeypatch, lambda source: "cf_wf" in source)
    chosen, cubin_ = kernel_cache.fitted(kernels, "sm_90")
    written = chosen.sources["cf_lstm_persistent"]
    assert "cf_wf" not in written and "#pragma unroll 8" not in written and cubin_ == b"cubin 4"
    assert written == kernels.rewritten(["cf_lstm_persistent"], fragments=0).sources["cf_lstm_persistent"]
    assert len(seen) == 4 and seen[3] == chosen.module_source()
    for n, source in zip((12, 8, 4), seen, strict=False):  # (the fourth has none)
        assert f"uint2 cf_wf0[{n}][4];" in source
    fit = kernel_cache.ExportFit()
    assert "cf_wf" not in emit(plan, fit=fit).text
    assert fit.rewritten == {"cf_lstm_persistent": (8, "W's fragments left in shared memory")}


def test_a_kernel_that_spills_with_its_fragments_of_w_keeps_as_many_as_fit(monkeypatch):
    """Faked to spill only with more than 64 registers of fragments, the kernel keeps 8 of its iterations'
    fragments in registers (64 registers), compiled twice."""
    from cellfuse.codegen.cuda_export import emit

    plan, kernels = _bf16_lstm_on_tensor_cores()
    seen = _spilling_where(monkeypatch, lambda source: "cf_wf0[12]" in source)
    chosen, cubin_ = kernel_cache.fitted(kernels, "sm_90")
    assert "uint2 cf_wf0[8][4];" in chosen.sources["cf_lstm_persistent"] and cubin_ == b"cubin 2"
    assert chosen.sources == kernels.rewritten(["cf_lstm_persistent"], fragments=64).sources
    assert len(seen) == 2
    fit = kernel_cache.ExportFit()
    assert "uint2 cf_wf0[8][4];" in emit(plan, fit=fit).text
    assert fit.rewritten == {"cf_lstm_persistent": (8, "W's fragments in at most 64 registers a thread")}


def test_a_kernel_that_spills_more_unrolled_less_is_kept_as_written(monkeypatch):
    kernels = _half_the_sms_lstm()
    _fake_ptxas(monkeypatch, 60, 216)
    assert kernel_cache.fitted(kernels, "sm_90") == (kernels, b"cubin 1")


def test_a_kernel_that_spills_is_kept_as_written_where_unrolled_it_does_not_compile(monkeypatch, caplog):
    kernels = _half_the_sms_lstm()

    def compiled(source, arch, options=("-O3",)):
        if "#pragma unroll 8" in source:
            raise CellError("nvcc could not compile the generated kernels:\nline 1: no")
        return Compiled(b"as written", {"cf_lstm_persistent": 216})

    monkeypatch.setattr(kernel_cache, "compiled", compiled)
    with caplog.at_level(logging.WARNING, logger=kernel_cache.__name__):
        assert kernel_cache.fitted(kernels, "sm_90") == (kernels, b"as written")
    assert "they do not compile" in caplog.text


def test_of_two_kernels_that_spill_only_the_one_that_spills_less_unrolled_is_so(monkeypatch):
    """The LSTM's direction on tensor cores (216 bytes as written, none unrolled) and its kernel at H=1024
    on CUDA cores (faked: more unrolled), in one module: the first unrolled, the second as written,
    compiled a third time."""
    from dataclasses import replace

    from cellfuse.codegen import make_plan
    from cellfuse.codegen.kernel_set import KernelSet
    from cellfuse.codegen.persistent_cuda import persistent_source
    from cellfuse.codegen.scheduler import H100
    from cellfuse.graph_model import Sizes, load_template

    kernels = KernelSet({}, {})
    for name, sizes, schedule in (("cf_a", Sizes(100, 64, 512, 512), "tensor"),
                                  ("cf_b", Sizes(100, 8, 1024, 1024), "persistent")):
        plan = make_plan(load_template("lstm"), sizes, schedule, replace(H100, sm_count=66))
        launch = plan.layers[0].persistent
        kernels.add(launch, persistent_source(launch, "@NAME@"), name)
    unrolled = {name: kernels.rewritten([name], 8).sources[name] for name in ("cf_a", "cf_b")}
    seen = []

    def compiled(source, arch, options=("-O3",)):
        seen.append(source)
        spills = {"cf_a": 0 if unrolled["cf_a"] in source else 216,
                  "cf_b": 400 if unrolled["cf_b"] in source else 100}
        return Compiled(f"cubin {len(seen)}".encode(), spills)

    monkeypatch.setattr(kernel_cache, "compiled", compiled)
    chosen, cubin_ = kernel_cache.fitted(kernels, "sm_90")
    assert chosen.sources == {"cf_a": unrolled["cf_a"], "cf_b": kernels.sources["cf_b"]}
    assert cubin_ == b"cubin 3" and seen[-1] == chosen.module_source()


def test_a_kept_file_whose_spill_report_cannot_be_read_is_a_fault():
    payload = b"\xff\xff\xff\x00{not json" + b"\x7fELF"
    header = kernel_cache._HEADER.pack(kernel_cache.MAGIC, hashlib.sha256(payload).digest(), len(payload))
    data = header + payload
    assert unpack(data) == (None, "holds no spill report that can be read")


def test_an_export_writes_the_kernels_as_fitted_and_names_those_rewritten(monkeypatch):
    from dataclasses import replace

    from cellfuse.codegen import make_plan
    from cellfuse.codegen.cuda_export import emit
    from cellfuse.codegen.scheduler import H100
    from cellfuse.graph_model import Sizes, load_template

    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "tensor", replace(H100, sm_count=66))
    _fake_ptxas(monkeypatch, 216, 0)
    fit = kernel_cache.ExportFit()
    text = emit(plan, fit=fit).text
    assert fit.rewritten == {"cf_lstm_persistent": (216, "its loops over K unrolled 8 at a time")}
    assert fit.failed is None
    assert text.count("#pragma unroll 8") == 2
    assert "#pragma unroll 8" not in emit(plan).text


def test_an_export_without_persistent_kernels_compiles_nothing(monkeypatch):
    from cellfuse.codegen import make_plan
    from cellfuse.codegen.kernel_set import plan_kernels
    from cellfuse.graph_model import Sizes, load_template

    kernels = plan_kernels(make_plan(load_template("lstm"), Sizes(10, 4, 8, 8), "hoisted"))
    seen = _fake_ptxas(monkeypatch, 216, 0)
    assert kernel_cache.ExportFit()(kernels) is kernels and seen == []


def test_an_export_whose_kernels_nvcc_cannot_compile_writes_them_as_planned(monkeypatch):
    kernels = _half_the_sms_lstm()

    def no_nvcc(*args, **kwargs):
        raise CellError("nvcc could not be run (no such file); is the CUDA toolkit on the PATH?")

    monkeypatch.setattr(kernel_cache, "compiled", no_nvcc)
    fit = kernel_cache.ExportFit()
    assert fit(kernels) is kernels
    assert fit.rewritten == {} and fit.failed.startswith("nvcc could not be run")
