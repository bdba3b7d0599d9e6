"""A hoisted GEMM's sums left scaled for the persistent kernel that alone reads them (codegen.scaled_sums):
which plans leave them so, the lowering's GEMM without its pass, and the kernel's loads that undo the
scales (compiled in test_cuda_compile; run against the reference on the GPU by the executors' tests)."""

from __future__ import annotations

import re

from cellfuse.codegen import make_plan, plan_kernels
from cellfuse.codegen.gemm_routes import f16x3_steps, scales
from cellfuse.codegen.lowering import Gemm, lower
from cellfuse.graph_model import Sizes, load_template

BIG = Sizes(100, 64, 512, 512, 2)  # GEMMs outside the loop on tensor cores


def scaled(name: str, schedule: str = "tensor", sizes: Sizes = BIG, **kw) -> list[tuple[str, ...]]:
    plan = make_plan(load_template(name), sizes, schedule, **kw)
    return [lp.persistent.scaled for lp in plan.layers]


def test_each_layers_input_projection_is_left_scaled_for_its_kernel():
    assert scaled("lstm") == [("l0.gemm0.out",), ("l1.gemm0.out",)]
    assert scaled("gru_cho", "persistent") == [("l0.gemm0.out",), ("l1.gemm0.out",)]


def test_where_the_sums_are_unscaled_by_their_pass():
    """A plan that saves its steps (the backward pass reads the projections too), a GEMM in float32 (too
    small for tensor cores: nothing to undo), one with a bias (the pass adds it), one read by a block per
    row (the layer-normalised LSTM's), a kernel of elementwise work alone (IndRNN's: its loads of chunks
    of steps would wait for the unscaling), and a 16-bit plan (no scales)."""
    assert scaled("lstm", save_steps=True) == [(), ()]
    assert scaled("lstm", sizes=Sizes(100, 1, 512, 512, 2)) == [(), ()]
    assert scaled("gru") == [(), ()]
    assert scaled("layernorm_lstm") == [(), ()]
    assert scaled("indrnn", "persistent") == [(), ()]
    assert scaled("lstm", precision="bf16") == [(), ()]
    plan = make_plan(load_template("lstm"), BIG, "graph")
    assert all(lp.persistent is None for lp in plan.layers)


def test_the_gemm_runs_without_its_pass_by_the_split_copies():
    """Lowered, the layer's GEMM is marked scaled: by the split copies its calls are the copies' and
    cuBLAS's, no pass (the warpgroup GEMM, where it measures faster, undoes its scales itself); its
    scales are its split's row maxima and W's column maxima."""
    program = lower(make_plan(load_template("lstm"), BIG, "tensor"))
    gemms = [i for i in program.instructions if isinstance(i, Gemm)]
    assert [(g.launch.group, g.route, g.scaled) for g in gemms] == [("gemm0", "f16x3-or-wgmma", True)] * 2
    g = gemms[0].launch
    names = [step.name for step in f16x3_steps(g, gemms[0].rows, g.k, scaled=True)]
    assert "cf_f16x3_unscale_sums" not in names and "cf_f16x3_unscale_sums" in [
        step.name for step in f16x3_steps(g, gemms[0].rows, g.k)]
    rows, columns = scales(g, gemms[0].rows, g.k)
    split = next(step for step in f16x3_steps(g, gemms[0].rows, g.k, scaled=True)
                 if step.name == "cf_split_f16x3_copies" and step.args[1].of == "a")
    assert split.args[2] == rows  # (the maxima A's split finds and writes)
    assert columns.of == "kept"


def test_the_kernel_undoes_the_scales_of_each_value_it_loads():
    """The scaled projection (the four gates' columns) is loaded a step ahead as it is, beside its row's
    largest magnitude (row t * batch + r of the GEMM's), and unscaled as the step uses it, with its
    column of W; the kernel takes the two maxima after its buffers."""
    plan = make_plan(load_template("lstm"), BIG, "tensor")
    source = plan_kernels(plan).sources["cf_lstm_persistent"]
    code = re.sub(r"//[^\n]*", "", source)
    projection = re.search(r"cf_next1_0\[u\] = \((b\d+) \+ \(size_t\)t \* batch \* 2048\)", code)[1]
    # read only where loaded ahead (before the loop and in it), as it is, and as the kernel's parameter
    assert len(re.findall(rf"\b{projection}\b", code)) == 2 * 4 + 1
    assert code.count("cf_next1_rmax[u] = cf_rmax0 ? cf_rmax0[(size_t)t * batch + r] : 0.0f;") == 2
    used = re.findall(r"cf_f16x3_unscaled_by\(cf_now1_\d+\[u\], cf_now1_rmax\[u\], cf_cmax0, (\d+ \+ )?j\)",
                      code)
    assert sorted(used) == ["", "1024 + ", "1536 + ", "512 + "]
    assert re.search(r"const float\* __restrict__ cf_rmax0,\s+const float\* __restrict__ cf_cmax0\)", code)
