"""A cell file is untrusted input, and the exported .cu is compiled and run by whoever exports it: whatever
a valid cell holds (its name, description, node ids and constants), the generated source is the code the
cell's graph asks for, with the cell's text only in comments and identifiers, and it compiles without a
warning."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import unicodedata
from dataclasses import replace

import numpy as np
import pytest
from compile_cuda import nvcc_cubin, nvcc_ptx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_cells import draw_cell

from cellfuse.codegen import SCHEDULES, KernelSet, generate_cuda, make_plan, plan_kernels
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.c_text import c_stem, comment_text, float_literal
from cellfuse.codegen.cuda_kernels import PRELUDE
from cellfuse.codegen.kernel_abi import INT_MAX
from cellfuse.codegen.kernel_set import backward_kernels
from cellfuse.codegen.persistent_cuda import PERSISTENT_PRELUDE
from cellfuse.graph_model import (
    Cell,
    CellBuilder,
    CellError,
    Sizes,
    analyze,
    cell_from_text,
    load_template,
    sigmoid,
    tanh,
    template_names,
)
from cellfuse.graph_model.lengths import masked

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

SIZES = Sizes(seq=5, batch=3, input=7, hidden=6, layers=2)
F32_MAX = float(np.finfo(np.float32).max)


def fit(sizes: Sizes, cell) -> Sizes:
    """The sizes, with input = hidden for a cell that ties the two widths (it runs at no others)."""
    return replace(sizes, input=sizes.hidden) if analyze(cell).ties else sizes

# Text that would be code, or would swallow code, if it reached the source outside a comment.
HOSTILE = ("\n#error INJECTED\n", "*/ int INJECTED; /*", "/*", "*/", "\\", "\\\n", "\\ \t\n", "??/", "??/\n",
           "\r", "\r\n", "\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x00", "\x1b[2J", "\ud800", "\udfff",
           "\u202e", "\u2066", "\u200b", "\ufeff", "#define INJECTED 1", '"', "'", "//", "\t",
           "σ(W x + b)", "Ünïcødé ✓", "1", " ")
HOSTILE_NAME = "1 */ #x\n#error INJECTED\\"
HOSTILE_DESCRIPTION = "h = tanh(W x)\n#error INJECTED\r\u2028 */ int injected; /* ?? \u202e\x00 \ud800 \\"
# Valid node ids that are C keywords or names the generated code itself uses.
HOSTILE_IDS = ("int", "float", "return", "e", "r", "j", "width", "rows", "one", "zero", "st", "ws", "t",
               "seq", "batch", "params", "y", "INT_MAX", "NULL", "CHECK", "cf_sigmoid", "cf_blocks", "expf",
               "main", "__global__", "_Bool", "CELLFUSE_DEMO_MAIN", "handle", "stream", "init", "final",
               "out", "gemm0", "k0", "v", "p0_h", "b_x", "l0", "b_l0_dout_dy")
EXTREME_CONSTS = (-0.0, 0.0, -1.0, 1e-45, -1e-45, 5e-324, -1e-300, 1.17549435e-38, F32_MAX, -F32_MAX, 3.4e38,
                  1e-46, 123456789.0, 0.1)

PREPROCESSOR_LINE = re.compile(r"#(include <\w+\.h>|define [A-Za-z]\w*[ (].*"
                               r"|ifdef (CELLFUSE_DEMO_MAIN|CF_DEMO_BACKWARD|CF_DEMO_BIDIRECTIONAL"
                               r"|__CUDA_ARCH__)"
                               r"|if __CUDA_ARCH__ >= 900"
                               r"|else|endif)"
                               r"| *#pragma unroll( \d+)?|#pragma nv_diag_suppress \d+")
# What a C compiler removes before it reads tokens (GCC also joins a backslash followed by blanks).
_SPLICE = re.compile(r"\\[ \t]*\n")
_COMMENT_OR_LITERAL = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)


def code_tokens(source: str) -> list[str]:
    """The source as the compiler reads it, lines joined and comments and literals removed, split at
    blanks."""
    return _COMMENT_OR_LITERAL.sub(" ", _SPLICE.sub("", source)).split()


def printable(ch: str) -> bool:
    """Not a character that breaks a line, or hides or reorders text (controls, format characters)."""
    category = unicodedata.category(ch)
    return category[0] in "LMNPS" or category == "Zs"


def harmless_twin(cell: Cell) -> Cell:
    """The same graph, under a name that is its own C stem and with no description."""
    twin = cell.copy()
    twin.name, twin.description = c_stem(cell.name), ""
    return twin


def rename_nodes(cell: Cell, ids) -> None:
    for node, new in zip(list(cell.nodes), ids, strict=False):
        if not cell.has(new):
            cell.rename(node.id, new)


def check_export(cell: Cell, sizes: Sizes, schedule: str, backward: bool = False,
                 bidirectional: bool = False) -> str:
    """The exported text of a cell with hostile text (with the backward pass's launcher, with `backward`;
    with both directions' launcher, with `bidirectional`): the cell's text only in comments, every
    preprocessor line one the generator writes, no character that hides or breaks lines; returns the
    text."""
    text = generate_cuda(cell, sizes, schedule, backward=backward, bidirectional=bidirectional).text
    text.encode("utf-8")  # no lone surrogate
    for line in text.split("\n"):
        assert all(printable(ch) for ch in line), ascii(line)
        if line.lstrip().startswith("#"):
            assert PREPROCESSOR_LINE.fullmatch(line), line
    twin = generate_cuda(harmless_twin(cell), sizes, schedule, backward=backward,
                         bidirectional=bidirectional).text
    assert code_tokens(text) == code_tokens(twin)
    return text


hostile_text = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(HOSTILE)), max_size=6).map("".join)


finite_float32 = st.one_of(st.sampled_from(EXTREME_CONSTS), st.floats(-F32_MAX, F32_MAX))


@st.composite
def hostile_cells(draw) -> tuple[Cell, Sizes, str]:
    """A random valid cell with a hostile name, description, node ids and constants, sizes and a schedule."""
    cell = draw_cell(draw, name=draw(hostile_text), max_rounds=4)
    cell.description = draw(hostile_text)
    for node in cell.of_op("const"):
        node.value = draw(finite_float32)
    rename_nodes(cell, draw(st.lists(st.sampled_from(HOSTILE_IDS), unique=True, max_size=len(cell.nodes))))
    sizes = Sizes(seq=draw(st.integers(1, 4)), batch=draw(st.integers(1, 3)), input=draw(st.integers(1, 9)),
                  hidden=draw(st.integers(1, 9)), layers=draw(st.integers(1, 2)))
    return cell, sizes, draw(st.sampled_from(SCHEDULES))


def hostile_template(name: str) -> Cell:
    cell = load_template(name)
    cell.name, cell.description = HOSTILE_NAME, HOSTILE_DESCRIPTION
    for node, value in zip(cell.of_op("const"), EXTREME_CONSTS, strict=False):
        node.value = value
    rename_nodes(cell, HOSTILE_IDS)
    return cell


def compile_objects(sources: list[str], tmp_path) -> None:
    """Compiles whole exported files, host code and demo program too, with every warning an error, in one
    nvcc call. cuBLAS's headers need not be installed: a stub declares what the files use, with cuBLAS's
    own signatures."""
    (tmp_path / "cublas_v2.h").write_text(CUBLAS_STUB)
    files = []
    for i, source in enumerate(sources):
        files.append(f"export{i}.cu")
        (tmp_path / files[-1]).write_text(source, encoding="utf-8")
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-c", "-Werror", "all-warnings", "-DCELLFUSE_DEMO_MAIN",
                           f"-I{tmp_path}", *files], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


CUBLAS_STUB = """\
#pragma once
#include <cuda_runtime.h>
typedef struct cublasContext* cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId);
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                           int m, int n, int k, const float* alpha, const float* A, int lda,
                           const float* B, int ldb, const float* beta, float* C, int ldc);
#include <library_types.h>
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16F = 74, CUBLAS_COMPUTE_32F_FAST_16BF = 75,
               CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                            int lda, const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasSaxpy(cublasHandle_t handle, int n, const float* alpha, const float* x, int incx,
                           float* y, int incy);
cublasStatus_t cublasSgeam(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                           int m, int n, const float* alpha, const float* A, int lda, const float* beta,
                           const float* B, int ldb, float* C, int ldc);
"""


# -- comments and names ----------------------------------------------------------------------------
@pytest.mark.parametrize("text", [*HOSTILE, HOSTILE_NAME, HOSTILE_DESCRIPTION, "a ??/ \\ ", "x*/*/", "/*/",
                                  "***///", "end \\\\", "end ??/??/ \t"])
def test_comment_text_stays_one_comment_on_one_line(text):
    got = comment_text(text)
    assert all(printable(ch) for ch in got), ascii(got)
    assert not got.endswith(("\\", "??/", " "))  # nor "??/", a backslash where trigraphs are on
    assert code_tokens(f"int a;  // {got}\nint b;") == ["int", "a;", "int", "b;"]
    assert code_tokens(f"int a; /* {got} */ int b;") == ["int", "a;", "int", "b;"]


@pytest.mark.parametrize("run", ["\\", "??/", " \\"])
def test_comment_text_takes_linear_time_on_a_long_run_of_continuations(run):
    start = time.perf_counter()
    assert comment_text(run * 50_000 + "x").endswith("x")
    assert time.perf_counter() - start < 2.0  # a backtracking search would take minutes


def test_comment_text_leaves_ordinary_text_as_it_is():
    for text in ("h = tanh(W x + U h + b)", "GRU (Cho et al., 2014): r * h before U", "σ(W x) ⊙ h", "a/b*c"):
        assert comment_text(text) == text


@pytest.mark.parametrize(("name", "stem"), [
    ("LSTM", "lstm"), ("Elman RNN", "elman_rnn"), ("1cell", "c_1cell"), ("42", "c_42"), ("", "cell"),
    ("!!! ***", "cell"), ("_x__y_", "x_y"), ("Ünïcode", "n_code"), ("σ", "cell"), ("int", "int"),
    (HOSTILE_NAME, "c_1_x_error_injected"), ("Long name " * 100, ("long_name_" * 7)[:64]),
    ("1" + "x" * 100, "c_1" + "x" * 61), ("9" + "_" * 61 + "ab", "c_9_ab"),
])
def test_the_c_stem_of_any_name_is_a_valid_ascii_name(name, stem):
    assert c_stem(name) == stem
    assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", stem)
    assert c_stem(stem) == stem


@pytest.mark.parametrize("name", ["1cell", "", "max", "int", "σ", "Elman RNN"])
def test_a_name_that_is_no_c_name_gives_valid_macros_and_functions(name):
    cell = load_template("elman")
    cell.name = name
    text = generate_cuda(cell, SIZES).text
    stem = c_stem(name)
    assert f"int cellfuse_{stem}_forward(" in text
    # Prefixed, so that a cell called "max" does not redefine <limits.h>'s MAX_INPUT.
    assert f"#define CELLFUSE_{stem.upper()}_INPUT 7" in text


def test_what_a_cell_file_can_hold_is_exported_as_comments():
    """JSON escapes give any string, a NUL and a lone surrogate included."""
    text = load_template("elman").to_json()
    text["name"], text["description"] = "nul\x00 cell", "\ud800 half a pair\n#error INJECTED\\"
    cell = cell_from_text(json.dumps(text))
    assert cell.description.startswith("\ud800")
    source = check_export(cell, SIZES, "hoisted")
    assert source.split("\n")[0] == "// nul cell: half a pair #error INJECTED"


def test_a_hostile_description_and_name_stay_in_comments():
    cell = load_template("gru")
    cell.name, cell.description = HOSTILE_NAME, HOSTILE_DESCRIPTION
    text = check_export(cell, SIZES, "hoisted")
    lines = text.split("\n")
    assert lines[0] == "// 1 * / #x #error INJECTED\\: h = tanh(W x) #error INJECTED * / int injected; / * ??"
    assert lines[1].startswith("// Generated by CellFuse")
    assert not any(line.lstrip().startswith("#error") for line in lines)
    assert "injected" not in code_tokens(text)


@pytest.mark.parametrize("ending", ["\\", "\\ ", "\\\t", "??/", "\\\\", "??/ "])
def test_a_description_ending_in_a_line_continuation_does_not_swallow_the_next_line(ending):
    cell = load_template("elman")
    cell.description = "trailing" + ending
    text = check_export(cell, SIZES, "hoisted")
    first, second = text.split("\n")[:2]
    assert first == "// Elman RNN: trailing" and second.startswith("// Generated")


@pytest.mark.parametrize("name", template_names())
def test_hostile_templates_export_only_comments_of_their_text(name):
    cell = hostile_template(name)
    for schedule in SCHEDULES:
        check_export(cell, fit(SIZES, cell), schedule)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_cells())
def test_random_hostile_cells_export_only_comments_of_their_text(drawn):
    check_export(*drawn)


# -- constants -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "literal"), [
    (1.0, "1.0f"), (-1.0, "(-1.0f)"), (0.1, "0.1f"), (-0.0, "(-0.0f)"), (1e-45, "1e-45f"), (1e-46, "0.0f"),
    (-1e-46, "(-0.0f)"), (3.4e38, "3.4e+38f"), (F32_MAX, "3.4028235e+38f"), (123456789.0, "1.2345679e+08f"),
    (2, "2.0f"),
])
def test_a_constant_is_written_as_the_float32_the_executors_compute_with(value, literal):
    assert float_literal(value) == literal


@settings(max_examples=300, deadline=None)
@given(finite_float32)
def test_a_float_literal_reads_back_as_the_same_float32(value):
    literal = float_literal(value)
    single = np.float32(literal.strip("()").removesuffix("f"))
    assert single == np.float32(value) and np.signbit(single) == np.signbit(np.float32(value))
    assert re.fullmatch(r"\d+(\.\d+)?(e[+-]\d+)?f|\(-\d+(\.\d+)?(e[+-]\d+)?f\)", literal)


def const_cell(value: float) -> Cell:
    """h' = tanh(x W + h U) * -c, with c a const of the given value."""
    b = CellBuilder("consts", input=4, hidden=4)
    x, h = b.input("x"), b.state("h")
    c = b.const(value, "c")
    pre = x @ b.weight("W", "input", "hidden") + h @ b.weight("U", "hidden", "hidden")
    new = (tanh(pre) * -c).named("h_new")
    b.update(h, new)
    b.output(new)
    return b.build()


@pytest.mark.parametrize("schedule", ["naive", "hoisted"])
def test_the_negation_of_a_negative_constant_is_no_decrement(schedule):
    plan = make_plan(const_cell(-1.0), SIZES, schedule)
    source = plan_kernels(plan).module_source()
    assert "(-(-1.0f))" in source and "--" not in source


@pytest.mark.parametrize("value", [1e39, -1e39, 3.4028236e38, 1e308])
def test_a_constant_beyond_float32_is_refused_naming_the_node_that_uses_it(value):
    cell = const_cell(value)
    with pytest.raises(CellError, match=r"node 'neg': its constant .* beyond float32's range"):
        generate_cuda(cell, SIZES)
    with pytest.raises(CellError, match="node 'neg'"):  # the CUDA runtime compiles these kernels
        plan_kernels(make_plan(cell, SIZES, "naive"))


# -- sizes -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("cell", "sizes", "what"), [
    ("elman", Sizes(5, 3, 7, 2**31), "hidden is 2147483648"),
    ("elman", Sizes(5, 3, 2**31 + 5, 6), "input is 2147483653"),
    ("lstm", Sizes(5, 3, 7, 2**29), "the N of GEMM gemm0 of layer 0 is 2147483648"),
    ("elman", Sizes(2**16, 2**15, 7, 6), r"\(seq \+ 1\) \* batch is 2147516416"),
])
def test_sizes_beyond_the_generated_int_indices_are_refused(cell, sizes, what):
    message = f"too large for the generated CUDA: {what}, and its int indices hold at most 2147483647"
    with pytest.raises(CellError, match=message):
        generate_cuda(load_template(cell), sizes)
    with pytest.raises(CellError, match=message):
        plan_kernels(make_plan(load_template(cell), sizes, "hoisted"))


def test_the_exported_launcher_refuses_a_sequence_its_ints_cannot_count():
    text = generate_cuda(load_template("gru"), SIZES).text
    guard = ("    if (seq < 0 || batch < 0 || ((long long)seq + 1) * batch > INT_MAX)\n"
             "        return (int)cudaErrorInvalidValue;\n")
    forward = text.index("int cellfuse_gru_forward(")
    assert text.index(guard) > forward and text.index(guard) < text.index("cublasSetStream", forward)
    assert "with (seq + 1) * batch at most INT_MAX" in "\n".join(text.split("\n")[:3])


BOUNDARY = Sizes(seq=5, batch=3, input=INT_MAX, hidden=INT_MAX, layers=2)


def test_the_largest_sizes_the_int_indices_hold_are_accepted():
    plan_kernels(make_plan(load_template("elman"), BOUNDARY, "hoisted"))


def test_a_node_named_as_a_buffers_variable_declares_no_unused_pointer():
    """The backward launcher declares a forward buffer's pointer only where its code reads it: a weight
    whose id is the output sequence's variable, named in a comment, does not count as a read (nvcc's
    -Werror refuses an unused variable)."""
    b = CellBuilder("collide", input=3, hidden=4)
    x, h = b.input("x"), b.state("h")
    b.update(h, sigmoid(h))
    out = tanh(x @ b.weight("W", "input", "hidden") + b.weight("b_l0_dout_dy", "hidden")).named("out")
    b.output(out)
    text = generate_cuda(b.build(), Sizes(3, 2, 3, 4, 1), "hoisted", backward=True).text
    launcher = text[text.index("_backward(cublasHandle_t"):]
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", launcher[:launcher.index("\n}\n")], flags=re.DOTALL)
    declared = re.findall(r"\w+\* (b_\w+) = \(\w+\*\)ws;", code)
    assert "b_l0_dout_dy" in launcher and declared
    for name in declared:
        assert len(re.findall(rf"\b{name}\b", code)) > 1, name


# -- compiling -------------------------------------------------------------------------------------------
@pytest.mark.nvcc
@needs_nvcc
def test_an_export_without_and_one_with_the_backward_pass_compile(tmp_path):
    """Whole files, hostile names and constants in both, in one nvcc run: Cho's GRU, hoisted, forward
    only, and the layer-normalised LSTM on tensor cores, forward and backward (persistent kernels with
    blocks per row, exchanges, reverse loops), whose kernels use the inline PTX of the persistent
    kernels, which ptxas assembles here. The slow tier compiles every template's export, with and
    without the backward pass."""
    gru, norm = hostile_template("gru_cho"), hostile_template("layernorm_lstm")
    sources = [generate_cuda(gru, fit(SIZES, gru), "hoisted").text,
               generate_cuda(norm, fit(SIZES, norm), "tensor", backward=True).text]
    assert "_backward(" not in sources[0] and "int cellfuse_c_1_x_error_injected_backward(" in sources[1]
    for helper in ("cf_mma_f16", "cf_split_f16x3", "cf_copy16", "cf_prefetch_l2", "cf_copies_done",
                   "cf_publish", "cf_peek2"):
        assert sources[1].count(f"{helper}(") > 1, helper  # called, not only defined
    compile_objects(sources, tmp_path)


@pytest.mark.nvcc
@pytest.mark.slow  # whole files through nvcc: about 10 s on 2 cores
@needs_nvcc
def test_16_bit_exports_compile(tmp_path):
    """Whole files in 16 bits, hostile names in them, in one nvcc run: the LSTM's forward in bf16 on the
    persistent rung (states kept float32: c, and h, a persistent GEMM's operand), Cho's GRU in fp16,
    hoisted, with every state in 16 bits, and the layer-normalised LSTM in bf16 on tensor cores (mma.sync
    of 16-bit operands); their conversions at the launcher's edges are called."""
    lstm, gru, norm = (hostile_template(name) for name in ("lstm", "gru_cho", "layernorm_lstm"))
    sources = [generate_cuda(lstm, fit(SIZES, lstm), "persistent", precision="bf16").text,
               generate_cuda(gru, fit(SIZES, gru), "hoisted", precision="fp16", float32_states=[]).text,
               generate_cuda(norm, fit(SIZES, norm), "tensor", precision="bf16").text]
    assert "cf_mma_bf16(" in sources[2]
    # a 16-bit buffer of an odd count of elements leaves the next buffer where a float would be misaligned:
    # every buffer starts 256-byte aligned
    odd = generate_cuda(load_template("indrnn"), Sizes(4, 2, 7, 33, 1), "hoisted", precision="bf16").text
    steps = [line for line in odd.splitlines() if "ws +=" in line]
    assert len(steps) > 3 and all("ws += cf_aligned(" in line for line in steps)
    assert "CUDA_R_16F" in sources[1] and "cublasSgemm(" not in sources[1]
    assert "cf_convert_rows<<<" in sources[1]
    for source in sources:
        assert "cf_convert<<<" in source and "cublasGemmEx(" in source
    compile_objects(sources, tmp_path)


@pytest.mark.nvcc
@pytest.mark.slow  # whole files through nvcc: about 10 s on 2 cores
@needs_nvcc
def test_exports_of_both_directions_compile(tmp_path):
    """The launcher of both directions with its demo program: side by side (graph; persistent kernels
    planned for half of the SMs, where they have no exchanges), one after the other (persistent kernels
    with exchanges), rows of their own lengths (a steps-left state whose initial values it reads)."""
    one_layer = replace(SIZES, layers=1)
    lstm, gru = hostile_template("lstm"), masked(load_template("gru"))
    sources = [check_export(lstm, one_layer, "graph", bidirectional=True),
               check_export(lstm, one_layer, "persistent", bidirectional=True),
               generate_cuda(gru, one_layer, "tensor", bidirectional=True).text,
               generate_cuda(load_template("indrnn"), one_layer, "persistent", bidirectional=True).text]
    assert "side by side, joined back to `stream` at the end" in sources[0]
    assert "after the forward one: the persistent kernels' exchanges" in sources[1]
    assert "left = init_states ? init_states[1] : NULL;" in sources[2]  # after h: cf_len_left
    for text in sources:
        assert "_bidirectional_forward(cublasHandle_t handle, cublasHandle_t handle_reverse," in text
    compile_objects(sources, tmp_path)
    with pytest.raises(CellError, match="--bidirectional exports one layer, not 2"):
        generate_cuda(lstm, SIZES, "graph", bidirectional=True)
    with pytest.raises(CellError, match="a backward pass is exported for one direction"):
        generate_cuda(lstm, one_layer, "graph", backward=True, bidirectional=True)


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_hostile_exports_of_every_template_and_the_largest_sizes_compile(tmp_path):
    cells = [hostile_template(name) for name in template_names()]
    sources = [generate_cuda(cell, fit(SIZES, cell), SCHEDULES[i % len(SCHEDULES)]).text
               for i, cell in enumerate(cells)]
    sources.append(generate_cuda(load_template("elman"), BOUNDARY, "naive").text)
    compile_objects(sources, tmp_path)


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_exports_with_the_backward_pass_of_every_template_compile(tmp_path):
    """Hostile names too: the backward launcher and its demo check, for every template, on every schedule
    and on the persistent one (whose reverse loops are cooperative launches of their own)."""
    cells = [hostile_template(name) for name in template_names()]
    compile_objects([generate_cuda(cell, fit(SIZES, cell), schedule, backward=True).text
                     for i, cell in enumerate(cells)
                     for schedule in dict.fromkeys([SCHEDULES[i % len(SCHEDULES)], "persistent"])], tmp_path)


def draw_hostile_cells(count: int) -> list[tuple[Cell, Sizes, str]]:
    """`count` random hostile cells, each with sizes and a schedule."""
    drawn: list[tuple[Cell, Sizes, str]] = []

    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(hostile_cells())
    def collect(example):
        drawn.append(example)

    collect()
    return drawn


def kernels_apart(kernel_sets: list[KernelSet]) -> str:
    """The kernels of several plans as one module, each plan's renamed apart: the kernel and what it names
    after itself (a persistent kernel's exchanges, name_x0, and its blocks per row, name_rows1), as two
    cells' persistent kernels may share a name."""
    parts = [PERSISTENT_PRELUDE, PRELUDE]
    for i, kernels in enumerate(kernel_sets):
        parts.extend(body.replace(name, f"{name}_e{i}") for name, body in kernels.sources.items())
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_random_hostile_cells_compile(tmp_path):
    """A few random hostile cells: their kernels in one module (renamed apart), and the whole files."""
    drawn = draw_hostile_cells(12)
    nvcc_cubin(kernels_apart([plan_kernels(make_plan(*example)) for example in drawn]), tmp_path)
    compile_objects([check_export(*example) for example in drawn], tmp_path)


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_random_hostile_cells_compile_with_the_backward_pass(tmp_path):
    """The backward analogue of the test above, in one nvcc call: the backward kernels of a few random
    hostile cells in one module (renamed apart), as the CUDA executor compiles them, and their whole files
    with the backward launcher and its demo check."""
    drawn = draw_hostile_cells(12)
    module = kernels_apart([backward_kernels(backward_plan(make_plan(*example, save_steps=True)))
                            for example in drawn])
    compile_objects([module, *(check_export(*example, backward=True) for example in drawn)], tmp_path)


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_the_largest_sizes_compile_with_the_backward_pass(tmp_path):
    """The backward analogue of the largest sizes' forward export above."""
    compile_objects([generate_cuda(load_template("elman"), BOUNDARY, "naive", backward=True).text], tmp_path)


@pytest.mark.nvcc
@needs_nvcc
def test_an_op_on_constants_that_underflows_or_overflows_compiles_without_a_warning(tmp_path):
    """float32 arithmetic on a cell's constants may leave float32's range (the numpy executor's does the
    same): nvcc's front end, folding it, would warn, and every warning is an error in these tests (PTX is
    as far as the front end goes)."""
    tiny, huge = float_literal(np.finfo(np.float32).tiny), float_literal(3e38)
    nvcc_ptx(PRELUDE + "\n__global__ void k(float* p) {\n"
               f"    p[0] = ({tiny} * {tiny});\n    p[1] = ({huge} * {huge});\n}}\n", tmp_path)


def test_a_byte_count_past_2_63_is_written_as_size_t_arithmetic_would_wrap_it():
    """A workspace's constant part at the largest sizes passes 2^64 bytes (a weight gradient's sums of
    INT_MAX x INT_MAX floats): folded in Python, it is written modulo 2^64 and unsigned, as the same sum
    in C's size_t would have wrapped, so that the file compiles; smaller constants are written as they are."""
    from cellfuse.codegen.address import Int, Sym

    assert Int(2**63 - 1).c() == str(2**63 - 1)
    assert Int(2**63).c() == "9223372036854775808ULL"
    assert (Sym("seq") + Int(2**64 + 256)).c() == "seq + 256ULL"
