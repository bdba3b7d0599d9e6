"""Storage types: every buffer and access of a plan carries its element type (float32 unless a plan's
precision says otherwise, see test_precision), and the emitters write a kernel's pointers, loads and
stores from that type's entry of the table: a kernel of half-precision storage here."""

from __future__ import annotations

import dataclasses

import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen import SCHEDULES, make_plan
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.cuda_kernels import PRELUDE
from cellfuse.codegen.dtypes import BFLOAT16, COMPUTE, DTYPES, FLOAT16, FLOAT32, DType, bits
from cellfuse.codegen.kernel_set import kernel_source
from cellfuse.codegen.plan import Access, GemmLaunch, KernelLaunch
from cellfuse.graph_model import Sizes, load_template, template_names

HALF = FLOAT16


def _accesses(launch):
    match launch:
        case GemmLaunch():
            return [launch.a, launch.c]
        case KernelLaunch():
            return [acc for _, acc in (*launch.inputs, *launch.outputs)]


@pytest.mark.parametrize("name", template_names())
def test_every_access_is_of_its_buffers_type(name):
    for schedule in [s for s in SCHEDULES if s != "auto"]:
        plan = make_plan(load_template(name), Sizes(5, 3, 24, 24, 2), schedule, save_steps=True)
        back = backward_plan(plan)
        buffers = {**plan.buffers, **back.buffers}
        launches = [launch for lp in plan.layers for launch in (*lp.prologue, *lp.step)]
        launches += [launch for lb in back.layers for launch in (*lb.step, *lb.after)]
        for launch in launches:
            for acc in _accesses(launch):
                assert acc.dtype == buffers[acc.buffer].dtype == FLOAT32, (schedule, launch, acc)


def test_the_table_holds_float32_and_the_16_bit_types_and_kernels_compute_in_float32():
    assert DTYPES == {"float32": FLOAT32, "bfloat16": BFLOAT16, "float16": FLOAT16} and COMPUTE == FLOAT32
    assert (FLOAT32.c, FLOAT32.itemsize) == ("float", 4)
    assert (FLOAT32.load("p[j]"), FLOAT32.store("v")) == ("p[j]", "v")
    assert (BFLOAT16.c, BFLOAT16.itemsize, BFLOAT16.header) == ("__nv_bfloat16", 2, "cuda_bf16.h")
    assert BFLOAT16.store("v") == "__float2bfloat16_rn(v)" and FLOAT16.load("p[j]") == "__half2float(p[j])"


def _stored_as(launch: KernelLaunch, dtype: DType) -> KernelLaunch:
    def retyped(pairs):
        return tuple((v, dataclasses.replace(acc, dtype=dtype)) for v, acc in pairs)

    return dataclasses.replace(launch, inputs=retyped(launch.inputs), outputs=retyped(launch.outputs))


def _kernels_stored_as_half() -> list[str]:
    """The LSTM's fused kernel (a thread per element) and the layer-normalised LSTM's kernels that reduce
    rows (a block per row), their memory in half precision."""
    lstm = make_plan(load_template("lstm"), Sizes(5, 3, 24, 24), "fused").layers[0].step
    norm = make_plan(load_template("layernorm_lstm"), Sizes(5, 3, 24, 24), "fused").layers[0].step
    kernels = [launch for launch in lstm if isinstance(launch, KernelLaunch)]
    kernels += [launch for launch in norm if isinstance(launch, KernelLaunch) and launch.reduces_rows]
    return [kernel_source(_stored_as(k, HALF), f"k{i}") for i, k in enumerate(kernels)]


def test_a_kernel_of_another_storage_type_converts_as_it_loads_and_stores():
    sources = _kernels_stored_as_half()
    for source in sources:
        assert "const __half* __restrict__" in source and "__half* __restrict__" in source
        assert "__half2float(" in source and "__float2half_rn(" in source
        assert "float* __restrict__" not in source  # no pointer of float32 left
    assert any("cf_partial" in source for source in sources)  # a block per row among them


@pytest.mark.nvcc
def test_a_kernel_of_another_storage_type_compiles(tmp_path):
    nvcc_cubin("#include <cuda_fp16.h>\n" + PRELUDE + "\n".join(_kernels_stored_as_half()), tmp_path)


def test_access_of_another_type_is_another_access():
    assert Access("b") != Access("b", dtype=HALF)


def test_bits_are_what_a_memset_of_the_types_width_writes():
    """The value's bits in memory of the type: float32's 32, a 16-bit type's 16 (a backward pass's start
    values: its ones, zeros and the NaN of buffers written whole)."""
    assert [bits(FLOAT32, v) for v in (0.0, 1.0)] == [0, 0x3F800000]
    assert [bits(BFLOAT16, v) for v in (0.0, 1.0, -2.0)] == [0, 0x3F80, 0xC000]
    assert [bits(FLOAT16, v) for v in (0.0, 1.0, -2.0)] == [0, 0x3C00, 0xC000]
    for dtype in (BFLOAT16, FLOAT16):
        assert bits(dtype, float("nan")) == dtype.nan_bits
