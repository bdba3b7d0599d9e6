"""A plan's precision: which buffers a bf16 or fp16 plan stores in 16 bits, every access typed as its
buffer, the rounding emulated by the numpy executor, and the results within a bound stated in units of the
16-bit type's rounding of the float64 reference, for every template."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from compile_cuda import nvcc_cubin
from forward_errors import relative_error
from random_cells import random_cell
from tiers import slow_beyond

from cellfuse.codegen import make_plan
from cellfuse.codegen.backward_plan import backward_plan, sixteen_bit_grads
from cellfuse.codegen.dtypes import BFLOAT16, FLOAT16, FLOAT32, round_to
from cellfuse.codegen.gemm_routes import gemm_ex_types
from cellfuse.codegen.kernel_set import backward_kernels, plan_kernels
from cellfuse.codegen.lowering import Copy, Loop, lower
from cellfuse.codegen.plan import H100, Access, GemmLaunch, KernelLaunch, grad_of, launch_name
from cellfuse.codegen.precision import (
    BOUND_UNITS,
    PRECISIONS,
    UNIT,
    Float32Only,
    accumulating_states,
    forward_tolerance,
)
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import (
    CellError,
    Sizes,
    init_params,
    load_template,
    resolve_run,
    run_reference,
    template_names,
)

SIXTEEN_BIT_RUNGS = ["naive", "combined", "fused", "hoisted", "graph", "wavefront", "persistent", "tensor"]
SIZES = Sizes(seq=20, batch=4, input=32, hidden=32, layers=2)

# nvcc's compiles of the 16-bit kernels: bf16's in the default tier, fp16's (the same code with the other
# type's names and conversions) in the slow one
COMPILED_PRECISIONS = slow_beyond(["bf16", "fp16"], 1)


def test_rounding_is_to_nearest_with_ties_to_even_and_keeps_infinities_and_nans():
    ones = np.array([1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 3 * 2.0**-9, np.inf, -np.inf, np.nan])
    bf = round_to(BFLOAT16, ones)
    np.testing.assert_array_equal(bf[:6], [1.0, 1.0, 1 + 2.0**-6, 1 + 2.0**-7, np.inf, -np.inf])
    assert np.isnan(bf[6]) and bf.dtype == np.float64
    assert round_to(FLOAT16, np.array([65519.0, 65520.0], np.float32)).tolist() == [65504.0, np.inf]
    assert round_to(BFLOAT16, np.array([3.4e38], np.float32))[0] == np.inf  # beyond bf16's largest
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    for dtype in (BFLOAT16, FLOAT16):
        once = round_to(dtype, x)
        np.testing.assert_array_equal(round_to(dtype, once), once)  # representable numbers stay
        assert np.abs(once - x).max() <= np.abs(x).max() * 2.0**-8


@pytest.mark.parametrize("name, expected", [("lstm", {"c"}), ("gru", {"h"}), ("elman", set()),
                                            ("indrnn", set()), ("slstm", {"c", "m", "n"}), ("sru", {"c"})])
def test_the_states_a_step_adds_to_are_the_accumulating_ones(name, expected):
    assert accumulating_states(load_template(name)) == expected


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_16_bit_plan_types_its_buffers_by_role_and_every_access_as_its_buffer(name, precision):
    cell = load_template(name)
    sixteen = PRECISIONS[precision]
    keep = accumulating_states(cell)
    for schedule in SIXTEEN_BIT_RUNGS:
        plan = make_plan(cell, SIZES, schedule, precision=precision)
        assert plan.precision == precision
        # the persistent kernels' GEMM operands (and the states that live there) stay float32 too
        operands = {item.launch.a.buffer for lp in plan.layers if lp.persistent
                    for item in lp.persistent.items if isinstance(item.launch, GemmLaunch)}
        states = keep | {s for s in plan.state_ids for lp in plan.layers
                         if lp.state_read[s].buffer in operands}
        kept = operands | {f"{e}.{s}" for s in states for e in ("init", "final")}
        kept |= {lp.state_read[s].buffer for s in states for lp in plan.layers}
        gemms = [g for lp in plan.layers for g in (*lp.prologue, *lp.step) if isinstance(g, GemmLaunch)]
        for g in gemms:
            assert plan.buffers[g.c.buffer].dtype == FLOAT32  # accumulators
            a, w = plan.buffers[g.a.buffer].dtype, plan.buffers[g.w].dtype
            assert a == w, (schedule, g.group)  # cuBLAS multiplies operands of one type
        for buffer in plan.buffers.values():
            if buffer.role in ("gemm", "bias") or buffer.name in kept:
                assert buffer.dtype == FLOAT32, (schedule, buffer.name)
            elif buffer.role in ("input", "value", "state", "init", "final", "output"):
                assert buffer.dtype == sixteen, (schedule, buffer.name)
        for lp in plan.layers:
            for launch in (*lp.prologue, *lp.step):
                accesses = ([launch.a, launch.c] if isinstance(launch, GemmLaunch)
                            else [acc for _, acc in (*launch.inputs, *launch.outputs)])
                for acc in accesses:
                    assert acc.dtype == plan.buffers[acc.buffer].dtype, (schedule, acc)
        for instr in lower(plan).instructions:  # the states' copies in and out too
            for copy in (instr.body if isinstance(instr, Loop) else (instr,)):
                if isinstance(copy, Copy):
                    for acc in (copy.src, copy.dst):
                        assert acc.dtype == plan.buffers[acc.buffer].dtype, (schedule, acc)


def test_the_caller_chooses_the_float32_states():
    cell = load_template("lstm")
    every = make_plan(cell, SIZES, "graph", precision="bf16", float32_states=())
    assert all(b.dtype == BFLOAT16 for b in every.buffers.values() if b.role in ("state", "init", "final"))
    both = make_plan(cell, SIZES, "graph", precision="bf16", float32_states=("c", "h"))
    assert all(b.dtype == FLOAT32 for b in both.buffers.values() if b.role in ("init", "final", "output"))
    with pytest.raises(CellError, match=r"float32 states \['q'\] are not states of cell 'LSTM'"):
        make_plan(cell, SIZES, "graph", precision="bf16", float32_states=("q",))


def test_float32_is_the_plan_of_before_and_unknown_precisions_and_persistent_rungs_are_refused():
    cell = load_template("lstm")
    assert make_plan(cell, SIZES, "graph", precision="fp32") == make_plan(cell, SIZES, "graph")
    with pytest.raises(CellError, match="unknown precision 'fp8' \\(precisions: fp32, bf16, fp16\\)"):
        make_plan(cell, SIZES, "graph", precision="fp8")
    wide = Sizes(seq=4, batch=64, input=2048, hidden=2048)
    for schedule in ("persistent", "tensor"):
        with pytest.raises(CellError, match="the weights of gemm1 do not fit on chip at hidden size 2048"):
            make_plan(cell, wide, schedule, precision="bf16")
    assert forward_tolerance("fp32") == 1e-4 and forward_tolerance("bf16") == 4 * 2.0**-8


def _errors(cell, precision: str, schedule: str, seq: int = 20, **plan_options) -> float:
    rng = np.random.default_rng(0)
    params = init_params(cell, SIZES.layers, SIZES.input, SIZES.hidden, 0)
    inputs = {"x": rng.uniform(-1.0, 1.0, (seq, SIZES.batch, SIZES.input)).astype(np.float32)}
    ref = run_reference(cell, params, inputs, SIZES.layers)
    _, _, x, initial = resolve_run(cell, params, inputs, SIZES.layers)
    sizes = Sizes(seq, SIZES.batch, SIZES.input, SIZES.hidden, SIZES.layers)
    plan = make_plan(cell, sizes, schedule, precision=precision, **plan_options)
    return relative_error(NumpyExecutor(plan, params, np.float32).run(x, initial), ref) / UNIT[precision]


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_every_template_in_16_bits_is_within_the_bound_of_the_float64_reference(name, precision):
    cell = load_template(name)
    for schedule in ("fused", "graph", "wavefront", "persistent", "tensor"):
        units = _errors(cell, precision, schedule)
        assert units < BOUND_UNITS, f"{name} {schedule} {precision}: {units:.2f} units of rounding"
    # the emulation rounds: a 16-bit run is not float32's (float32 is within 1e-4 of the reference)
    assert _errors(cell, precision, "graph") > 1e-4 / UNIT[precision] or name == "slstm"


@pytest.mark.parametrize("seed", range(4))
def test_random_cells_in_bf16_are_within_the_bound(seed):
    cell = random_cell(seed)
    units = _errors(cell, "bf16", "graph")
    assert units < BOUND_UNITS, f"random cell {seed}: {units:.2f} units of rounding"


@pytest.mark.nvcc
@pytest.mark.parametrize("precision", COMPILED_PRECISIONS)
def test_the_kernels_of_a_16_bit_plan_include_their_types_header_and_compile(precision, tmp_path):
    for name in ("lstm", "layernorm_lstm"):
        plan = make_plan(load_template(name), SIZES, "graph", precision=precision)
        source = plan_kernels(plan).module_source()
        dtype = PRECISIONS[precision]
        assert f"#include <{dtype.header}>" in source and f"const {dtype.c}* __restrict__" in source
        assert any(isinstance(launch, KernelLaunch) for lp in plan.layers for launch in lp.step)
        nvcc_cubin(source, tmp_path)


@pytest.mark.nvcc
@pytest.mark.parametrize("precision", COMPILED_PRECISIONS)
def test_the_tensor_rungs_kernels_multiply_in_16_bits_and_compile(precision, tmp_path):
    """One mma.sync of the 16-bit type per sixteen k (no fp16 splits of float32 values), for a step with one
    GEMM (the LSTM) and with two and an exchange (Cho's GRU), at the LSTM's full sizes too; a step that
    reduces rows and prefetches its 16-bit values (the layer-normalised LSTM)."""
    suffix = {"bf16": "bf16", "fp16": "f16"}[precision]
    cases = (("lstm", Sizes(100, 64, 512, 512, 1)), ("gru_cho", SIZES), ("layernorm_lstm", SIZES))
    for name, sizes in cases:
        plan = make_plan(load_template(name), sizes, "tensor", precision=precision)
        source = plan_kernels(plan).module_source()
        assert f"cf_mma_{suffix}(acc[x]" in source and "cf_split_f16x3(a4" not in source
        assert f"m16n8k16.row.col.f32.{suffix}.{suffix}.f32" in source
        # the weights on chip in the 16-bit type, each fragment's two registers one 8-byte load
        dtype = PRECISIONS[precision]
        assert f"reinterpret_cast<{dtype.c}*>(cf_smem + " in source and "const uint2 w2 = " in source
        assert f"cf_pack_{suffix}(w4" not in source
        nvcc_cubin(source, tmp_path)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_tensor_rungs_warps_keep_fragments_of_w_in_registers_where_they_fit(precision):
    """A warp's 16-bit fragments of W, the same at every step, are loaded into registers once, before the
    loop, as many of its iterations over K as FRAGMENT_REGISTERS holds (at B=64, 12 of its 16; at B=8, all
    4), the rest loaded from shared memory at each step; none where the kernel is written without them,
    nor for float32's three fp16 products (W split in shared memory)."""
    from cellfuse.codegen.tiling import FRAGMENT_REGISTERS

    for batch, iters, kept in ((64, 16, 12), (8, 4, 4)):
        plan = make_plan(load_template("lstm"), Sizes(100, batch, 512, 512, 1), "tensor", precision=precision)
        kernels = plan_kernels(plan)
        source = kernels.sources["cf_lstm_persistent"]
        nb = 4 if batch == 64 else 2  # the warp tile's products side by side
        assert f"uint2 cf_wf0[{kept}][{nb}];" in source and 2 * kept * nb <= FRAGMENT_REGISTERS
        assert f"for (int j = 0; j < {iters}; ++j) {{" in source
        assert f"const uint2 w2 = j < {kept} ? cf_wf0[j][x] : *(const uint2*)(wt + x * " in source
        without = kernels.rewritten(["cf_lstm_persistent"], fragments=0).sources["cf_lstm_persistent"]
        assert "cf_wf" not in without and "const uint2 w2 = *(const uint2*)(wt + x * " in without
    fp32 = plan_kernels(make_plan(load_template("lstm"), Sizes(100, 64, 512, 512, 1), "tensor"))
    assert "cf_wf" not in fp32.module_source()


@pytest.mark.nvcc
@pytest.mark.slow  # three backward modules through nvcc: about 10 s on 2 cores
@pytest.mark.parametrize("precision", COMPILED_PRECISIONS)
def test_the_tensor_rungs_reverse_loop_multiplies_in_16_bits_and_compiles(precision, tmp_path):
    """The backward pass's persistent launch of a 16-bit tensor plan: one mma.sync of the 16-bit type per
    sixteen k, W^T on chip in that type, the gates' gradient staged from 16 bits, four values a load where
    K comes in fours, else one (the LSTM at its full sizes, Cho's GRU with two GEMMs a step, the GRU's K
    of 3 x 330 at B=256, where the step meets at a grid barrier and stages dG)."""
    dtype = PRECISIONS[precision]
    cases = (("lstm", Sizes(100, 64, 512, 512, 1), True), ("gru_cho", SIZES, True),
             ("gru", Sizes(20, 256, 330, 330, 1), False))
    for name, sizes, fours in cases:
        forward = make_plan(load_template(name), sizes, "tensor", save_steps=True, precision=precision)
        source = backward_kernels(backward_plan(forward)).module_source()
        assert f"cf_mma_{dtype.suffix}(acc[x]" in source and "cf_split_f16x3(a4" not in source
        assert f"reinterpret_cast<{dtype.c}*>(cf_smem + " in source
        assert ("__ldcg((const uint2*)(a + " in source) == fours
        assert dtype.load("__ldcg(a + ").removesuffix(")") in source
        nvcc_cubin(source, tmp_path)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_weights_on_chip_take_half_the_room(precision):
    """The tensor rung keeps a 16-bit plan's weights in its type: half the shared memory of float32's, so
    that the LSTM's stay on chip at H=1536 (not in float32) and H=2048 is refused, naming the size."""
    def shared(plan):
        (item,) = [i for i in plan.layers[0].persistent.items if isinstance(i.launch, GemmLaunch)]
        return item, plan.layers[0].persistent.shared

    lstm = load_template("lstm")
    item, regions = shared(make_plan(lstm, Sizes(100, 64, 1024, 1024, 1), "tensor", precision=precision))
    tiling = item.tiling
    assert tiling.w_itemsize == 2
    assert 2 * tiling.w_floats(1024) == dataclasses.replace(tiling, w_itemsize=4).w_floats(1024)
    (_, at), = regions.weights
    assert regions.floats - at >= tiling.w_floats(1024)  # (what follows the weights starts after them)
    h1536 = Sizes(100, 64, 1536, 1536, 1)
    plan = make_plan(lstm, h1536, "tensor", precision=precision)
    item, _ = shared(plan)
    assert item.on_chip and item.mma
    from cellfuse.codegen.plan_text import describe

    assert f"weights (in {precision}) and output in shared memory" in describe(plan)
    item, _ = shared(make_plan(lstm, h1536, "tensor"))
    assert not item.on_chip
    with pytest.raises(CellError, match="the weights of gemm1 do not fit on chip at hidden size 2048"):
        make_plan(lstm, Sizes(100, 64, 2048, 2048, 1), "tensor", precision=precision)



@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_plan_says_how_each_gemm_multiplies_in_16_bits(precision):
    """`cellfuse plan` in 16 bits: cuBLAS's GEMMs and the tensor rung's on tensor cores in the 16-bit type,
    the persistent rung's on the CUDA cores on rounded operands; no three fp16 products anywhere, and no
    GEMM words on an elementwise kernel."""
    from cellfuse.codegen.plan_text import describe

    cores = f"on tensor cores ({precision} into float32)"
    rounded = f"on the CUDA cores, its operands rounded to {precision}"
    for schedule, step_gemm in (("graph", cores), ("tensor", cores), ("persistent", rounded)):
        text = describe(make_plan(load_template("lstm"), Sizes(100, 64, 512, 512, 1), schedule,
                                  precision=precision))
        lines = text.splitlines()
        assert "3xFP16" not in text, schedule
        assert cores in next(line for line in lines if line.strip().startswith("gemm0")), schedule
        # (a persistent kernel's GEMM is said in its step's lines, cuBLAS's among the groups)
        said = [line for line in lines if "gemm1 (" in line] if schedule != "graph" else [
            line for line in lines if line.strip().startswith("gemm1 ")]
        assert len(said) == 1 and step_gemm in said[0], schedule
        assert all("cores" not in line for line in lines if line.strip().startswith("k0 (")), schedule



def test_the_plan_says_a_16_bit_gemm_of_float32_operands_multiplies_them_at_tf32s_rate():
    """The GRU's h is a float32 state in bf16 too: its step GEMM multiplies float32 operands through
    cuBLAS, which the plan says, where its GEMM of the 16-bit x multiplies in bf16."""
    from cellfuse.codegen.plan_text import describe

    lines = describe(make_plan(load_template("gru"), Sizes(100, 64, 512, 512, 1), "graph",
                               precision="bf16")).splitlines()
    gemm0, gemm1 = (next(line for line in lines if line.strip().startswith(g + " "))
                    for g in ("gemm0", "gemm1"))
    assert "on tensor cores (bf16 into float32)" in gemm0
    assert ("on tensor cores (float32 operands, in cuBLAS's fast bf16 compute type: as TF32, at its rate)"
            in gemm1)


@pytest.mark.nvcc
@pytest.mark.slow  # the persistent rung's 16-bit modules through nvcc: about 8 s on 2 cores
@pytest.mark.parametrize("precision", COMPILED_PRECISIONS)
def test_the_persistent_rungs_kernels_round_what_they_multiply_and_compile(precision, tmp_path):
    """On the CUDA cores a 16-bit GEMM multiplies values rounded to the type (exact products in float32):
    the weights as they are loaded into shared memory, the operand as it is staged, polled or loaded
    (staged rows at B=64, products in registers at B=1)."""
    suffix = {"bf16": "bf16", "fp16": "f16"}[precision]
    for batch in (1, 64):
        sizes = Sizes(100, batch, 512, 512, 1)
        plan = make_plan(load_template("lstm"), sizes, "persistent", precision=precision)
        source = plan_kernels(plan).module_source()
        assert source.count(f"cf_round_{suffix}(") >= 3 and "cf_mma_" not in source.split("extern")[-1]
        nvcc_cubin(source, tmp_path)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", ["lstm", "gru", "layernorm_lstm"])
def test_an_exchanged_operand_is_rounded_once_by_its_writer_for_the_cuda_cores(name, precision):
    """A 16-bit GEMM on the CUDA cores multiplies its exchanged operand as the block that wrote it rounded
    it when it published it (its initial values and each step's), not as each block that stages it
    rounds it; tensor cores, which round as they load it, get it as it is. Staged rows at B=64, products
    in registers at B=1; a block per row (the layer norm's) publishes as the elementwise launches do."""
    suffix = {"bf16": "bf16", "fp16": "f16"}[precision]
    for schedule, rounded in (("persistent", True), ("tensor", False)):
        for batch in (1, 64):
            sizes = Sizes(100, batch, 512, 512, 1)
            plan = make_plan(load_template(name), sizes, schedule, precision=precision)
            source = plan_kernels(plan).module_source()
            values = re.findall(r"cf_publish\([^;]*?, (?:t \+ 2|1u),\s*([^;]*)\);", source)
            assert values, (name, schedule, batch)
            assert all(v.startswith(f"cf_round_{suffix}(") == rounded for v in values), (schedule, values)
            assert not re.search(rf"cf_round_{suffix}\(__uint_as_float\(\(unsigned\)w", source)


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_a_16_bit_backward_plan_keeps_its_gradients_float32_but_the_gemm_outputs_it_multiplies(name,
                                                                                             schedule):
    """As PyTorch's mixed precision does: every gradient float32, except that of a GEMM output whose GEMM
    multiplied 16-bit values (16-bit operands, or a persistent loop's, which it rounds), stored in 16
    bits so that dA += dC @ W^T and dW += A^T @ dC multiply 16-bit operands too (no bias's column sum of
    such a gradient: a 16-bit plan folds no bias into a GEMM, so every bias's gradient is summed from
    float32 parts); every access in its buffer's type; each cuBLAS GEMM's operands of one type, every
    GEMM multiplying in the 16-bit type, the reverse loop's of a persistent plan too, reading the 16-bit
    gradient, with W^T on chip in 16 bits."""
    cell = load_template(name)
    forward = make_plan(cell, SIZES, schedule, H100, save_steps=True, precision="bf16")
    plan = backward_plan(forward)
    dtypes = {name: b.dtype for name, b in (*forward.buffers.items(), *plan.buffers.items())}
    sixteen = {name for name, b in plan.buffers.items() if b.dtype != FLOAT32}
    looped = {g.c.buffer for lp in forward.layers if lp.persistent for g in lp.step
              if isinstance(g, GemmLaunch)}
    gemm_outputs = {grad_of(g.c.buffer) for lp in forward.layers for g in (*lp.prologue, *lp.step)
                    if isinstance(g, GemmLaunch)
                    and (forward.buffers[g.w].dtype != FLOAT32 or g.c.buffer in looped)}
    gemm_outputs &= plan.buffers.keys()  # (the LSTM's two are one: backward_plan.same_gradients)
    # (and 16-bit copies of the float32 h of the persistent rungs: sixteen_bit_operands)
    copies = {name for name in sixteen if not name.startswith(grad_of(""))}
    assert sixteen - copies == gemm_outputs and gemm_outputs
    assert bool(copies) == (schedule == "tensor")
    launches = [launch for lb in plan.layers for launch in (*lb.step, *lb.after)]
    loop = [item for lb in plan.layers if lb.persistent for item in lb.persistent.items]
    for launch in (*launches, *(item.launch for item in loop)):
        for acc in _accesses(launch):
            assert acc.dtype == dtypes[acc.buffer], f"{launch_name(launch)}: {acc.buffer}"
        if isinstance(launch, GemmLaunch):
            assert launch.multiply == BFLOAT16
    cublas = [g for lb in plan.layers for g in (*lb.after, *(() if lb.persistent else lb.step))
              if isinstance(g, GemmLaunch)]
    assert cublas
    for g in cublas:
        assert dtypes[g.a.buffer] == dtypes[g.w] == g.w_dtype, f"{g.group}: {g.a.buffer} by {g.w}"
    gemms = [item for item in loop if isinstance(item.launch, GemmLaunch)]
    assert bool(gemms) == (schedule == "tensor")
    for item in gemms:  # the reverse loop's GEMM reads the 16-bit gradient, W^T rounded on chip
        assert dtypes[item.launch.a.buffer] == BFLOAT16 and item.tiling.w_itemsize == 2


@pytest.mark.parametrize("seed, schedule", [(28, "graph"), (59, "tensor")])
def test_a_weight_that_gemms_of_both_types_multiply_has_a_16_bit_copy_for_cublas(seed, schedule):
    """A weight that one GEMM multiplies by a float32 operand (a float32 state, or a persistent loop's
    operand) and another, through cuBLAS, by a 16-bit one: cuBLAS multiplies operands of one type, so the
    second reads a 16-bit copy of the weight, a buffer of its own made from the same parameter, whose
    gradient adds to the parameter's (forward and backward, every cuBLAS GEMM of one type)."""
    cell = random_cell(seed)
    forward = make_plan(cell, SIZES, schedule, H100, save_steps=True, precision="bf16")
    plan = backward_plan(forward)
    copies = [b for name, b in forward.buffers.items() if name.endswith(".bfloat16")]
    assert copies and all(b.role == "weight" and b.dtype == BFLOAT16 for b in copies)
    keys = [part.key for part in forward.param_parts()]
    assert all(keys.count(b.sources[0]) == 2 for b in copies)
    buffers = {**forward.buffers, **plan.buffers}
    cublas = [g for lp in forward.layers for g in (*lp.prologue, *(() if lp.persistent else lp.step))]
    cublas += [g for lb in plan.layers for g in (*lb.after, *(() if lb.persistent else lb.step))]
    for g in cublas:
        if isinstance(g, GemmLaunch):
            assert buffers[g.a.buffer].dtype == buffers[g.w].dtype == g.w_dtype, (g.group, g.a.buffer, g.w)
            gemm_ex_types(g)


def test_a_16_bit_backward_plan_that_would_mix_gradient_types_is_refused():
    cell = load_template("lstm")
    forward = make_plan(cell, SIZES, "graph", save_steps=True, precision="bf16")
    gemm = next(g for g in forward.layers[0].step if isinstance(g, GemmLaunch))
    buffers = dict(forward.buffers)
    buffers[gemm.c.buffer] = dataclasses.replace(buffers[gemm.c.buffer], role="value")
    with pytest.raises(Float32Only, match=f"would mix 16-bit and float32 gradients in '{gemm.c.buffer}'"):
        backward_plan(dataclasses.replace(forward, buffers=buffers))



@pytest.mark.parametrize("float32_first", [True, False])
def test_two_gemms_of_either_type_into_one_gradient_are_refused_in_either_order(float32_first):
    """A 16-bit GEMM and a float32 one writing one output buffer: its gradient would be read as both."""
    forward = make_plan(load_template("lstm"), SIZES, "graph", save_steps=True, precision="bf16")
    lp = forward.layers[0]
    x_w = next(g for g in lp.prologue if isinstance(g, GemmLaunch))
    h_u = next(g for g in lp.step if isinstance(g, GemmLaunch))
    assert forward.buffers[x_w.w].dtype == BFLOAT16
    buffers = {**forward.buffers, "U.float32": dataclasses.replace(forward.buffers[h_u.w], dtype=FLOAT32)}
    wide = dataclasses.replace(h_u, group="h@U into x@W's", w="U.float32", c=x_w.c)
    prologue = [wide, *lp.prologue] if float32_first else [*lp.prologue, wide]
    layers = [dataclasses.replace(lp, prologue=prologue), *forward.layers[1:]]
    with pytest.raises(Float32Only, match=f"would mix 16-bit and float32 gradients in '{x_w.c.buffer}'"):
        sixteen_bit_grads(dataclasses.replace(forward, buffers=buffers, layers=layers))


def _accesses(launch) -> list[Access]:
    if isinstance(launch, GemmLaunch):
        return [launch.a, launch.c]
    return [acc for _, acc in (*launch.inputs, *launch.outputs)]


@pytest.mark.parametrize("name, schedule, copied", [("lstm", "tensor", True), ("lstm", "persistent", True),
                                                    ("lstm", "graph", False), ("gru", "tensor", True)])
def test_a_weights_gradient_of_a_float32_h_multiplies_a_16_bit_copy_of_it(name, schedule, copied):
    """On the persistent rungs a 16-bit plan keeps h float32 (its loop's GEMM operand, rounded as the GEMM
    multiplies it), and the gradient of h @ U is 16-bit: dU += h^T @ dgates multiplies it and h
    converted to 16 bits after the loop (a kernel of its own, overwriting its buffer whole), not float32
    operands; the reverse loop reads the same 16-bit gradient (the LSTM's gradient of x @ W too, the same
    values, stored once, in every layer: an upper layer's x @ W multiplies a 16-bit copy of the outputs
    below)."""
    forward = make_plan(load_template(name), SIZES, schedule, H100, save_steps=True, precision="bf16")
    plan = backward_plan(forward)
    converted = 0
    for lb in plan.layers:
        after, y = list(lb.after), f"l{lb.layer}.out.y"
        du = next(g for g in after if isinstance(g, GemmLaunch) and g.group == "gemm1 dW")
        if not copied:  # (y of the 16-bit type)
            assert forward.buffers[y].dtype == BFLOAT16 and du.a.buffer == y
            continue
        converted += 1
        copy = f"{y}.all.bfloat16"
        merged = name == "lstm"
        assert (du.a.buffer, du.w) == (copy, grad_of(f"l{lb.layer}.gemm{0 if merged else 1}.out"))
        assert du.a.dtype == du.w_dtype == plan.buffers[du.w].dtype == BFLOAT16
        convert = after[after.index(du) - 1]
        assert isinstance(convert, KernelLaunch) and convert.body == ()
        (_, src), = convert.inputs
        (_, dst), = convert.outputs
        assert (src.buffer, src.dtype, dst.buffer, dst.dtype) == (y, FLOAT32, copy, BFLOAT16)
        assert convert.rows == du.k and convert.width == du.m and dst.slot == du.a.slot == "all"
        assert copy in plan.overwritten and not plan.restarted(copy)
        if lb.persistent:
            (loop,) = [item.launch for item in lb.persistent.items if isinstance(item.launch, GemmLaunch)]
            assert loop.a.buffer == du.w
    assert bool(converted) == copied


@pytest.mark.parametrize("name", ["gru_cho", "mgu"])
def test_a_weights_gradient_over_a_float32_state_multiplies_the_16_bit_twin_of_its_gradient(name):
    """On the `naive` rung each matmul is a GEMM of its own: h @ U_z multiplies the float32 state h, and so
    its gradient is float32, while that of x @ W_z, the same values, is 16-bit. dU_z multiplies that twin
    and h converted to 16 bits, not float32 operands."""
    forward = make_plan(load_template(name), SIZES, "naive", save_steps=True, precision="bf16")
    plan = backward_plan(forward)
    du = next(g for g in plan.layers[-1].after if isinstance(g, GemmLaunch) and g.group == "gemm1 dW")
    assert plan.buffers[grad_of("l0.gemm1.out")].dtype == FLOAT32
    assert (du.a.buffer, du.w) == ("l0.out.y.all.bfloat16", grad_of("l0.gemm0.out"))
    assert du.a.dtype == du.w_dtype == plan.buffers[du.w].dtype == BFLOAT16


@pytest.mark.parametrize("name, schedule", [("lstm", "tensor"), ("lstm", "persistent"), ("gru", "graph")])
def test_an_upper_layers_input_gemm_multiplies_a_16_bit_copy_of_the_float32_outputs_below(name, schedule):
    """Where the outputs below are float32 (the persistent rungs' h, a GRU's h everywhere), the upper
    layer's prologue converts them into a 16-bit copy first, and its input GEMM multiplies the copy by
    16-bit weights; the backward pass's gradient of that operand goes straight into the outputs' below,
    with no kernel and no gradient buffer of the copy."""
    forward = make_plan(load_template(name), SIZES, schedule, H100, save_steps=True, precision="bf16")
    below = forward.buffers["l0.out.y"]
    assert below.dtype == FLOAT32
    convert, gemm = forward.layers[1].prologue[:2]
    assert isinstance(convert, KernelLaunch) and convert.body == () and isinstance(gemm, GemmLaunch)
    (_, src), = convert.inputs
    (_, copy), = convert.outputs
    assert src.buffer == "l0.out.y" and forward.buffers[copy.buffer].dtype == BFLOAT16
    assert gemm.a == copy and gemm.a.dtype == gemm.w_dtype == forward.buffers[gemm.w].dtype == BFLOAT16
    plan = backward_plan(forward)
    after = plan.layers[0].after  # (layer 1's, reversed)
    d_a = next(g for g in after if isinstance(g, GemmLaunch) and g.group == f"{gemm.group} dA")
    assert d_a.c == dataclasses.replace(src, buffer=grad_of(src.buffer))
    assert grad_of(copy.buffer) not in plan.buffers
    assert not any(isinstance(k, KernelLaunch) and k.island.startswith(convert.island) for k in after)
