"""benchmarks/step_profile.py edits the generated persistent kernels to time them with parts taken out
(ablations) and with changes that keep their results (variants): each edit must find what it edits in
the kernels it is meant for, or the profile times the kernel as it is under the edit's name."""

from __future__ import annotations

import pytest
from compile_cuda import nvcc_cubin
from script_loader import load_script

from cellfuse.codegen import make_plan
from cellfuse.gpu_runtime import cuda_backward, cuda_executor
from cellfuse.graph_model import Sizes, load_template


def _script():
    return load_script("benchmarks/step_profile.py")


SMALL, FULL = Sizes(20, 64, 64, 64), Sizes(100, 64, 512, 512)


def _kernels(precision: str, sizes: Sizes = SMALL):
    plan = make_plan(load_template("lstm"), sizes, "tensor", save_steps=True, precision=precision)
    return (cuda_executor.plan_kernels(plan),
            cuda_backward.backward_kernels(cuda_backward.backward_plan(plan)))


def test_every_edit_applies_to_the_float32_tensor_rungs_kernels_and_the_16_bit_ones_say_where_not():
    """Every ablation and variant edits the LSTM's float32 tensor-rung kernels, forward and backward (one
    whose edits apply where found, at least one of them at the LSTM's full sizes: staging, which only the
    backward's K of 2048 has, the rest coming through exchanges); in bf16, those of float32's three fp16
    products do not apply (NotApplicable: the profile records None), nor unrolling 8 or 4 where W's fragments
    stay in registers (their loop unrolled whole; a kernel written to unroll less keeps none)."""
    script = _script()
    for precision in ("fp32", "bf16"):
        for name, edits in {**script.ABLATIONS, **script.VARIANTS}.items():
            changed = []
            where_found = edits and all(script.WHERE_FOUND in edit for edit in edits)
            for made in _kernels(precision, FULL if where_found else SMALL):
                before = dict(made.sources)
                kept = "cf_wf" in made.module_source()  # W's fragments in registers (gemm_mma.fragments)
                if precision == "bf16" and ("small" in repr(edits) or "f16x3" in repr(edits)
                                            or kept and name.startswith("k loops unrolled")):
                    with pytest.raises(script.NotApplicable):
                        script._ablate(made, edits)
                    continue
                changed.append(script._ablate(made, edits).sources != before)
            if where_found:
                assert any(changed), (precision, name)
            else:
                assert all(c == bool(edits) for c in changed), (precision, name)


@pytest.mark.slow
@pytest.mark.nvcc
def test_the_variants_kernels_compile(tmp_path):
    """What each variant makes of the float32 tensor rung's kernels, forward and backward, compiles."""
    script = _script()
    for edits in script.VARIANTS.values():
        for made in _kernels("fp32"):
            nvcc_cubin(script._ablate(made, edits).module_source(), tmp_path)
