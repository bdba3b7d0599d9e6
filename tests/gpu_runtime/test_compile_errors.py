"""How a compile error of the generated kernels reads: nvcc's message and the line it points at."""

from __future__ import annotations

from cellfuse.gpu_runtime.kernel_cache import compile_error_lines


def test_a_compile_error_quotes_the_generated_line():
    source = "// k\n__global__ void k(float* y) {\n    y[0] = undefined_thing;\n}\n"
    stderr = ('kernel.cu(3): error: identifier "undefined_thing" is undefined\n'
              "1 error detected in the compilation of \"kernel.cu\".\n")
    assert compile_error_lines(stderr, source) == (
        'line 3: identifier "undefined_thing" is undefined\n    y[0] = undefined_thing;')
    assert compile_error_lines("nvcc fatal : Unsupported gpu architecture 'sm_1'", source) == (
        "nvcc fatal : Unsupported gpu architecture 'sm_1'")
