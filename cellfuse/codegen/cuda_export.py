"""The exported .cu: the kernels of a Plan, a host launcher that runs the whole forward pass with cuBLAS
for the GEMMs, optionally a launcher of the backward pass (the backward Plan's program, run after a
forward pass on the same workspace, whose saved steps it reads), and (behind CELLFUSE_DEMO_MAIN) a
program that checks and times them, the backward pass against finite differences of the forward
(resources/cuda/export_demo.cuh).

The launcher takes seq and batch at run time; input, hidden and layers are fixed when it is generated.
Its arrays are float32 in every precision: a 16-bit plan's launcher converts x, the parameters and the
initial states into its workspace (cf_convert, resources/cuda/convert.cuh) as it stores them in the plan's
types, multiplies with cublasGemmEx in those types, and converts y and the final states back.
Everything of the cell that reaches the text (its name, description and node ids) is a comment
(`comment_text`) or part of an identifier (`c_stem`, `c_name`, `_var`): a cell file is shared, and the
.cu is compiled and run by whoever exports it.
Row-major data, column-major cuBLAS: C[m,n] = A[m,k] @ W[k,n] is computed as C^T = W^T A^T, that is
cublasSgemm(N, N, n, m, k, W, ldw=n, A, lda, C, ldc).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

from ..graph_model.lengths import STEPS_LEFT
from .address import SEQ, Expr, Int, T, as_expr, c_address, rows_of
from .backward_plan import BackwardPlan, grad
from .c_text import CWriter, c_stem, comment_text
from .cuda_library import cuda_library
from .dtypes import COMPUTE_C, FLOAT32
from .gemm_routes import (
    F16X3_MAX_K,
    TENSOR_CORE_RULE,
    Ref,
    f16x3_layout,
    f16x3_steps,
    gemm_ex_types,
    may_run_on_tensor_cores,
)
from .kernel_abi import BLOCK, INT_MAX, kernel_params
from .kernel_set import KernelSet, backward_kernels, plan_kernels
from .lowering import Copy, Gemm, Instruction, Kernel, Loop, Persistent, Record, Wait, lower
from .persistent_cuda import persistent_buffers
from .plan import Access, Buffer, GemmLaunch, KernelLaunch, PersistentLaunch, Plan, grad_of


@dataclass
class CudaSource:
    text: str
    kernel_of_node: dict[str, str]  # node id -> the kernel (or GEMM) that computes it
    kernel_line: dict[str, int]  # kernel or GEMM name -> 1-based line where it is defined or called


# What a caller may make of a plan's kernels before they are written: the kernels as a compiler checked
# them (such as gpu_runtime.kernel_cache.fitted's, a kernel that spills written to unroll less).
Fit = Callable[[KernelSet], KernelSet]


def emit(plan: Plan, backward: BackwardPlan | None = None, bidirectional: bool = False,
         fit: Fit | None = None) -> CudaSource:
    """The self-contained .cu of a forward plan (see the module's docstring); with its `backward` plan,
    whose forward plan it must be, a backward launcher follows the forward one; with `bidirectional`, a
    launcher of both directions of the (one-layer) plan; the kernels as `fit` makes them where given."""
    return _Export(plan, backward, bidirectional, fit).source()


def has_exchanges(plan: Plan) -> bool:
    """Whether the plan's persistent kernels pass values through exchanges: arrays of their module, which
    one run at a time may use (two directions of a bidirectional launcher then run one after the other)."""
    return any(lp.persistent is not None and lp.persistent.exchange for lp in plan.layers)


def _var(buffer: str) -> str:
    """The C variable of a buffer: ASCII letters and digits stand for themselves, "_" is written "_u", "."
    "_d" and any other character "_x<hex>_", so that distinct names stay distinct identifiers."""
    return "b_" + "".join(ch if ch.isascii() and ch.isalnum() else _ESCAPES.get(ch, f"_x{ord(ch):x}_")
                          for ch in buffer)


_ESCAPES = {"_": "_u", ".": "_d"}


def _ptr(acc: Access, t: Expr | int = T) -> str:
    """The address of an access at step `t` (see `address.c_address`)."""
    return c_address(_var(acc.buffer), acc, t)


def _splits(g: GemmLaunch) -> bool:
    """Whether a GEMM may split its operands into fp16 pieces (a float32 GEMM; a 16-bit one multiplies as
    it is)."""
    return g.multiply == FLOAT32 and may_run_on_tensor_cores(g)




class _Export:
    """The text of one exported .cu, written part by part, top to bottom (see `source`)."""

    def __init__(self, plan: Plan, backward: BackwardPlan | None, bidirectional: bool = False,
                 fit: Fit | None = None):
        self.plan, self.backward, self.bidirectional = plan, backward, bidirectional
        self.sizes = plan.sizes
        self.stem = c_stem(plan.cell_name)
        self.macro = f"CELLFUSE_{self.stem.upper()}"  # the prefix keeps the macros apart from the headers'
        self.fn = f"cellfuse_{self.stem}_forward"
        fit = fit or (lambda kernels: kernels)
        self.kernels = fit(plan_kernels(plan))
        self.back_kernels = fit(backward_kernels(backward)) if backward else None
        if self.back_kernels:
            assert not set(self.back_kernels.sources) & set(self.kernels.sources), "a kernel name used twice"
            self.kernels.name_of.update(self.back_kernels.name_of)
        self.program = lower(plan, one_stream=True)
        self.max_batch = min((lp.persistent.batch for lp in plan.layers if lp.persistent), default=0)
        self.states = list(plan.state_ids)
        self.params = list(plan.params)
        self.param_index = {k: i for i, k in enumerate(self.params)}
        everything = (*self.program.instructions, *(backward.instructions() if backward else ()))
        flat = [i for instr in everything for i in (instr.body if isinstance(instr, Loop) else [instr])]
        self.flat = flat
        # the GEMMs that may run on tensor cores at some seq and batch: (rows, K, N, their workspace's bytes)
        self.splits = list(dict.fromkeys(
            (*dims, i.launch.n, f16x3_layout(i.launch, *dims).nbytes) for i in flat
            if isinstance(i, Gemm) and _splits(i.launch) for dims in [self._gemm_dims(i.launch)]))
        # The caller's memory: x, the parameters, the initial and final states, where the plan stores
        # them in float32 (as the caller's arrays are); the rest is workspace, with the converted copies
        # of the others last.
        caller = ("weight", "input", "init", "final")
        self.converted = [b for b in plan.buffers.values() if b.role in caller and b.dtype != FLOAT32]
        self.converted_names = {b.name for b in self.converted}
        self.forward_ws = [b for b in plan.buffers.values() if b.role not in caller] + self.converted
        # the gradients, after the forward pass's buffers, which a backward pass reads
        self.ws_buffers = self.forward_ws + (list(backward.buffers.values()) if backward else [])
        self.first_layer = set(map(id, (*plan.layers[0].prologue, *plan.layers[0].step)))
        self.kernel_line: dict[str, int] = {}  # kernel or GEMM -> its line
        self.w = CWriter()

    def source(self) -> CudaSource:
        self._header()
        self._kernels()
        self._sizes()
        self._helpers()
        self._workspace_bytes()
        self._forward()
        if self.backward:
            self._backward(self.backward)
        if self.bidirectional:
            self._both_directions()
        self._demo()
        return CudaSource(self.w.text(), self._kernel_of_node(), self.kernel_line)

    @property
    def _line(self) -> int:
        """The 1-based number of the next line written."""
        return len(self.w.lines) + 1

    # -- the parts of the file, top to bottom --------------------------------------------------------
    def _header(self) -> None:
        plan, sizes, w = self.plan, self.sizes, self.w
        title = f"{plan.cell_name}: {plan.description}" if plan.description else plan.cell_name
        w(f"// {comment_text(title)}",
          f"// Generated by CellFuse on {date.today().isoformat()}, "
          f"schedule '{comment_text(plan.schedule)}', for input {sizes.input}, hidden {sizes.hidden}, "
          f"{sizes.layers} layer(s); seq and batch are chosen at run time,",
          f"// with (seq + 1) * batch at most INT_MAX ({INT_MAX}).")
        if plan.precision != "fp32":
            kept = [st for st in self.states if plan.buffers[f"init.{st}"].dtype == FLOAT32]
            w(f"// In {plan.precision}: x, the weights, the outputs and the states are stored in 16 bits"
              + (f", but the states {comment_text(', '.join(kept))} in float32" if kept else "") + ";",
              "// the GEMMs multiply 16-bit operands into float32 and every kernel computes in float32. The",
              "// launcher's arrays are float32: it converts them into its workspace and the results back.")
        if plan.layers[0].persistent:
            w("// Each layer's steps run in one cooperative launch, which needs all its blocks resident at",
              "// once (the launcher checks that, and returns cudaErrorCooperativeLaunchTooLarge where they",
              "// are not).")
        else:
            w(f"// {plan.launches_per_step} launch(es) per time step and layer.")
        if plan.layer_streams:
            w("// Everything runs on one stream, the hoisted launches before each layer's loop and the",
              "// layers one after another (CellFuse's own runtime runs the hoisted launches in chunks",
              "// beside the loop and each layer's chunk of steps beside the layer below's next one, on",
              "// streams of their own).")
        elif plan.chunk_steps:
            w("// Everything runs on one stream, the hoisted launches before each layer's loop (CellFuse's",
              "// own runtime runs them in chunks on a second stream, beside the loop).")
        w("//",
          "// Build a program that checks and times it:",
          f"//   nvcc -O3 -arch=sm_90 -DCELLFUSE_DEMO_MAIN {self.stem}.cu -lcublas -o {self.stem}",
          f"//   ./{self.stem} [seq batch [PREFIX]]",
          *(("// With PREFIX it reads PREFIX.params.f32 (the parameters below, float32, concatenated in "
             "order)", "// and PREFIX.x.f32 ([seq, batch, input]), and writes PREFIX.y.f32 ([seq, batch, "
             "hidden]).") if not self.bidirectional else
            ("// It runs both directions (the launcher at the end). With PREFIX it reads PREFIX.params.f32",
             "// (the parameters below, float32, concatenated in order, the forward direction's then the",
             "// reverse one's) and PREFIX.x.f32 ([seq, batch, input]), and writes PREFIX.y.f32 ([seq,",
             "// batch, 2 * hidden]).")),
          "//",
          f"// Parameters of {self.fn}, in order (the keys of a CellFuse parameter file):",
          *(f"//   params[{self.param_index[k]}] = {comment_text(k)}" for k in self.params),
          "",
          "#include <cuda_runtime.h>",
          "#include <cublas_v2.h>",
          "#include <limits.h>",
          "#include <stddef.h>",
          "")

    def _kernels(self) -> None:
        """The kernels' module, each kernel's line noted; the backward pass's kernels after it."""
        first = self._line
        module = self.kernels.module_source()
        for i, line in enumerate(module.split("\n")):
            for name in self.kernels.sources:
                if f" {name}(" in line:
                    self.kernel_line[name] = first + i
        self.w(*module.split("\n"))
        if self.converted:
            self.w(*cuda_library("convert.cuh").split("\n"))
        if self.back_kernels:
            self.w(*"\n".join(self.back_kernels.sources.values()).split("\n"),
                   *cuda_library("fill_ones.cuh").split("\n"))

    def _sizes(self) -> None:
        sizes, macro = self.sizes, self.macro
        self.w(f"#define {macro}_LAYERS {sizes.layers}",
               f"#define {macro}_INPUT {sizes.input}",
               f"#define {macro}_HIDDEN {sizes.hidden}",
               f"#define {macro}_PARAMS {len(self.params)}",
               f"#define {macro}_STATES {len(self.states)}  /* {comment_text(', '.join(self.states))} */",
               "")

    def _helpers(self) -> None:
        """The launch grid of a count of threads, the tensor-core rule and the room its splits take."""
        w, flat = self.w, self.flat
        if self.backward or self.bidirectional or self.splits or self.converted or any(
                isinstance(i, Kernel) or isinstance(i, Gemm) and i.launch.bias for i in flat):
            with w.block("static unsigned cf_blocks(size_t n) {"):
                w(f"size_t b = (n + {BLOCK - 1}) / {BLOCK};",
                  "return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));")
            w("")
        if not self.splits:
            return
        w(f"/* A GEMM of at least 2^30 multiply-adds and K at most {F16X3_MAX_K} runs on tensor cores with",
          "   float32's accuracy, each product as three fp16 ones: its operands split by",
          "   cf_split_f16x3_copies into the workspace's first cf_split_bytes bytes. */",
          *TENSOR_CORE_RULE.split("\n"),
          "")
        with w.block("static size_t cf_split_bytes(int seq, int batch) {"):
            w("size_t most = 0;")
            for rows, k, n, nbytes in self.splits:
                w(f"if (cf_f16x3({rows.c(wide=False)}, {n}, {k.c(wide=False)}) && {nbytes.c()} > most)",
                  f"    most = {nbytes.c()};")
            w("return most;")
        w("")

    def _workspace_bytes(self) -> None:
        w = self.w
        w("static size_t cf_aligned(size_t n) { return (n + 255) / 256 * 256; }", "")
        w("/* Bytes of device workspace a forward pass of these sizes needs"
          + (", and a backward pass after it. */" if self.backward else ". */"))
        with w.block(f"size_t {self.fn[:-len('_forward')]}_workspace_bytes(int seq, int batch) {{"):
            w("size_t n = 0;")
            if self.splits:
                w("n += cf_aligned(cf_split_bytes(seq, batch));")
            for b in self.ws_buffers:
                w(f"n += {self._bytes(b)};  /* {comment_text(b.name)} */")
            w("return n;")
        w("")

    def _forward(self) -> None:
        plan, w, H = self.plan, self.w, self.sizes.hidden
        w("/* One forward pass on `stream`. x: [seq, batch, input]; params: device pointers, in the order",
          "   above; init_states: per state [layers, batch, hidden], or NULL (all zero); y: [seq, batch,",
          "   hidden]; final_states: per state [layers, batch, hidden], or NULL; workspace: see",
          "   *_workspace_bytes. Returns 0, or the first CUDA or cuBLAS error; cudaErrorInvalidValue, before",
          "   any work, where seq or batch is negative or (seq + 1) * batch is more than INT_MAX (launches",
          "   count rows in an int)" + ("," if self.max_batch else ". */"),
          *((f"   or batch is more than {self.max_batch}. */",) if self.max_batch else ()),
          f"int {self.fn}(cublasHandle_t handle, cudaStream_t stream, int seq, int batch, const float* x,",
          "        const float* const* params, const float* const* init_states, float* y,",
          "        float* const* final_states, void* workspace)")
        with w.block("{"):
            self._check_sizes()
            w("const float one = 1.0f, zero = 0.0f;  /* alpha and beta of the GEMMs */",
              "(void)one; (void)zero;  /* a cell may have no GEMM, or only GEMMs with a bias */",
              "unsigned char* ws = (unsigned char*)workspace;",
              "cublasStatus_t st = cublasSetStream(handle, stream);",
              "if (st != CUBLAS_STATUS_SUCCESS) return (int)st;")
            converted = self.converted_names
            if "x" not in converted:
                w("const float* b_x = x;")
            self._weights()
            for i, s in enumerate(self.states):
                if f"init.{s}" not in converted:
                    w(f"const float* {_var(f'init.{s}')} = init_states ? init_states[{i}] : NULL;")
                if f"final.{s}" not in converted:
                    w(f"float* {_var(f'final.{s}')} = final_states ? final_states[{i}] : NULL;")
            w(*self._split_room(self.program.instructions))
            for b in self.forward_ws:
                w(f"{b.dtype.c}* {_var(b.name)} = ({b.dtype.c}*)ws; ws += {self._bytes(b)};")
            w("")
            self._convert_in()
            self._stacked_weights()
            w("")
            for instr in self.program.instructions:
                self._instruction(instr, 0)
            output = plan.buffers[plan.layers[-1].output_seq]
            y_seq = f"{_var(output.name)} + (size_t)batch * {H}"
            if output.dtype == FLOAT32:
                w(f"cudaMemcpyAsync(y, {y_seq}, (size_t)seq * batch * {H} * sizeof(float), "
                  "cudaMemcpyDeviceToDevice, stream);")
            else:
                self._convert("y", y_seq, f"(size_t)seq * batch * {H}")
            for i, s in enumerate(self.states):
                if f"final.{s}" in converted:
                    b = plan.buffers[f"final.{s}"]
                    w("if (final_states)")
                    with w.indented():
                        self._convert(f"final_states[{i}]", _var(b.name), f"{self._rows(b)} * {b.width}")
            w("return (int)cudaGetLastError();")
        w("")

    def _backward(self, bp: BackwardPlan) -> None:
        plan, sizes, w, H = self.plan, self.sizes, self.w, self.sizes.hidden
        bfn = self.fn[:-len("_forward")] + "_backward"
        w("/* The backward pass of the forward pass just run on `stream` with the same seq, batch, x, params",
          "   and workspace (which holds every step the forward pass saved): the gradients of sum(dy * y)",
          "   plus, per state, sum(dfinal[s] * final[s]). dy: [seq, batch, hidden]; dfinal: per state",
          "   [layers, batch, hidden], or NULL (all zero); dx: [seq, batch, input]; dinit_states: per state",
          "   [layers, batch, hidden], or NULL (not wanted); dparams: per parameter, in the order above, its",
          "   shape. Returns as the forward pass does. */",
          f"int {bfn}(cublasHandle_t handle, cudaStream_t stream, int seq, int batch, const float* x,",
          "        const float* const* params, const float* dy, const float* const* dfinal, float* dx,",
          "        float* const* dinit_states, float* const* dparams, void* workspace)")
        with w.block("{"):
            self._check_sizes()
            w("const float one = 1.0f, zero = 0.0f;  /* alpha and beta of the GEMMs */",
              "(void)zero;",
              "unsigned char* ws = (unsigned char*)workspace;",
              "cublasStatus_t st = cublasSetStream(handle, stream);",
              "if (st != CUBLAS_STATUS_SUCCESS) return (int)st;",
              "const float* b_x = x;",
              "(void)b_x;")
            self._weights()
            declarations = len(w.lines)  # the workspace's pointers go here, once the body says which it uses
            w("",
              "/* Every gradient starts at zero (each launch adds into it; one that a kernel overwrites",
              "   whole needs nothing), then the seeds; ones are 1. */")
            for b in bp.buffers.values():
                n = f"{self._rows(b)} * {b.width}"
                if b.name in bp.overwritten:
                    continue
                if b.role == "ones":
                    w(f"cf_fill_ones<<<cf_blocks({n}), {BLOCK}, 0, stream>>>({_var(b.name)}, {n});")
                else:
                    w(f"cudaMemsetAsync({_var(b.name)}, 0, {n} * sizeof({b.dtype.c}), stream);")
            seed_y = f"{_var(grad_of(plan.layers[-1].output_seq))} + (size_t)batch * {H}"
            self._axpy(f"(size_t)seq * batch * {H}", "dy", seed_y)
            if self.states:
                with w.block("if (dfinal) {"):
                    for i, state in enumerate(self.states):
                        for lp in plan.layers:
                            self._axpy(f"batch * {H}", f"dfinal[{i}] + (size_t){lp.layer} * batch * {H}",
                                       _ptr(grad(lp.state_read[state]), SEQ))
            w("")
            for instr in bp.instructions():
                self._instruction(instr, 0)
            w("",
              "/* The gradients out: x's, the initial states', each parameter's (summed over its parts). */",
              f"cudaMemcpyAsync(dx, {_var(grad_of('x'))}, (size_t)seq * batch * {sizes.input} * "
              "sizeof(float), cudaMemcpyDeviceToDevice, stream);")
            if self.states:
                with w.block("if (dinit_states) {"):
                    for i, state in enumerate(self.states):
                        for lp in plan.layers:
                            w(f"cudaMemcpyAsync(dinit_states[{i}] + (size_t){lp.layer} * batch * {H}, "
                              f"{_ptr(grad(lp.state_read[state]), 0)}, (size_t)batch * {H} * sizeof(float), "
                              "cudaMemcpyDeviceToDevice, stream);")
            for key in self.params:
                w(f"cudaMemsetAsync(dparams[{self.param_index[key]}], 0, {math.prod(plan.params[key])} * "
                  f"sizeof(float), stream);  /* {comment_text(key)} */")
            for part in plan.param_parts():  # dparam[rows, width] += its columns of the buffer's gradient
                out = f"dparams[{self.param_index[part.key]}]"
                w(f"st = cublasSgeam(handle, CUBLAS_OP_N, CUBLAS_OP_N, {part.width}, {part.rows}, &one, "
                  f"{_var(grad_of(part.buffer))} + {part.col}, {part.ld}, &one, {out}, {part.width}, {out}, "
                  f"{part.width});  /* {comment_text(part.key)} */",
                  "if (st != CUBLAS_STATUS_SUCCESS) return (int)st;")
            w("return (int)cudaGetLastError();")
            # the code without its comments, which may name anything (a node's id may be a buffer's variable)
            code = re.sub(r"/\*.*?\*/|//[^\n]*", "", "\n".join(w.lines[declarations:]), flags=re.DOTALL)
            pointers = self._split_room(bp.instructions())
            for b in self.ws_buffers:  # a forward buffer the backward pass does not read is only stepped over
                used = re.search(rf"\b{_var(b.name)}\b", code)
                declare = f"{b.dtype.c}* {_var(b.name)} = ({b.dtype.c}*)ws; " if used else ""
                pointers.append(f"{declare}ws += {self._bytes(b)};")
            w.lines[declarations:declarations] = ["    " + line for line in pointers]
        w("")

    def _both_directions(self) -> None:
        """The launcher of one layer's two directions: the forward launcher twice, the second time over x
        reversed in time on a stream of its own, side by side where the kernels allow it."""
        w, stem_fn, H, width = self.w, self.fn[:-len("_forward")], self.sizes.hidden, self.sizes.input
        in_order = has_exchanges(self.plan)
        left = self.states.index(STEPS_LEFT) if STEPS_LEFT in self.states else None
        w(*cuda_library("directions.cuh").split("\n"), "")
        w("/* Bytes of device workspace a pass of both directions of these sizes needs. */")
        with w.block(f"size_t {stem_fn}_bidirectional_workspace_bytes(int seq, int batch) {{"):
            w(f"return 2 * cf_aligned({stem_fn}_workspace_bytes(seq, batch))",
              f"    + cf_aligned((size_t)seq * batch * {width} * sizeof(float))",
              f"    + 2 * cf_aligned((size_t)seq * batch * {H} * sizeof(float));")
        w("")
        w("/* Both directions of the layer: the forward one on `stream`, the reverse one"
          + (" on `stream`" if in_order else " on `stream_reverse` (with `handle_reverse`)"),
          "   over each batch row reversed in time"
          + (" (within its length: the initial value of its state" if left is not None else "")
          + (f" {STEPS_LEFT}, the steps past it staying in place)" if left is not None else "") + ",",
          "   " + ("after the forward one: the persistent kernels' exchanges are arrays of this file's "
                   "module, which one" if in_order else "side by side, joined back to `stream` at the end."),
          *(("   run at a time uses.",) if in_order else ()),
          f"   params: the forward direction's {self.macro}_PARAMS pointers, then the reverse one's;",
          "   init_states, final_states: per state [2, batch, hidden] (forward, reverse), or NULL; y:",
          "   [seq, batch, 2 * hidden], the forward direction's output, then the reverse one's in the steps'",
          "   order;",
          "   workspace: see *_bidirectional_workspace_bytes. Returns as the forward launcher does. */",
          f"int {stem_fn}_bidirectional_forward(cublasHandle_t handle, cublasHandle_t handle_reverse,",
          "        cudaStream_t stream, cudaStream_t stream_reverse, int seq, int batch, const float* x,",
          "        const float* const* params, const float* const* init_states, float* y,",
          "        float* const* final_states, void* workspace)")
        with w.block("{"):
            n = len(self.states)
            w("if (seq < 0 || batch < 0) return (int)cudaErrorInvalidValue;",
              f"const size_t one = cf_aligned({stem_fn}_workspace_bytes(seq, batch));",
              f"const size_t xs = cf_aligned((size_t)seq * batch * {width} * sizeof(float));",
              f"const size_t ys = cf_aligned((size_t)seq * batch * {H} * sizeof(float));",
              "unsigned char* ws = (unsigned char*)workspace;",
              "float* x_reverse = (float*)(ws + 2 * one);",
              "float* y_forward = (float*)(ws + 2 * one + xs);",
              "float* y_reverse = (float*)(ws + 2 * one + xs + ys);",
              f"const float* init_forward[{n} + 1];",
              f"const float* init_reverse[{n} + 1];",
              f"float* final_forward[{n} + 1];",
              f"float* final_reverse[{n} + 1];")
            with w.block(f"for (int i = 0; i < {n}; ++i) {{"):
                w("init_forward[i] = init_states ? init_states[i] : NULL;",
                  f"init_reverse[i] = init_states ? init_states[i] + (size_t)batch * {H} : NULL;",
                  "final_forward[i] = final_states ? final_states[i] : NULL;",
                  f"final_reverse[i] = final_states ? final_states[i] + (size_t)batch * {H} : NULL;")
            w("const float* left = " + (f"init_states ? init_states[{left}] : NULL;" if left is not None
                                        else "NULL;  /* every row the whole sequence long */"),
              f"cf_reverse_rows<<<cf_blocks((size_t)seq * batch * {width}), {BLOCK}, 0, stream>>>(x, "
              f"x_reverse, seq, batch, {width}, left, {H});")
            forward = (f"{self.fn}(handle, stream, seq, batch, x, params, init_states ? init_forward : NULL, "
                       "y_forward, final_states ? final_forward : NULL, ws)")
            reverse = (f"{self.fn}({'handle' if in_order else 'handle_reverse'}, "
                       f"{'stream' if in_order else 'stream_reverse'}, seq, batch, x_reverse, params + "
                       f"{self.macro}_PARAMS, init_states ? init_reverse : NULL, y_reverse, final_states ? "
                       "final_reverse : NULL, ws + one)")
            if in_order:  # both on `stream` (stream_reverse and handle_reverse unused)
                w("(void)handle_reverse; (void)stream_reverse;",
                  f"int e = {forward};",
                  f"if (!e) e = {reverse};")
            else:  # the reverse direction forks from `stream` after x's reversal and joins it at the end
                w("cudaEvent_t forked, joined;",
                  "int e = (int)cudaEventCreateWithFlags(&forked, cudaEventDisableTiming);",
                  "if (e) return e;",
                  "e = (int)cudaEventCreateWithFlags(&joined, cudaEventDisableTiming);",
                  "if (e) { cudaEventDestroy(forked); return e; }",
                  "e = (int)cudaEventRecord(forked, stream);",
                  "if (!e) e = (int)cudaStreamWaitEvent(stream_reverse, forked, 0);",
                  f"if (!e) e = {forward};",
                  f"if (!e) e = {reverse};",
                  "if (!e) e = (int)cudaEventRecord(joined, stream_reverse);",
                  "if (!e) e = (int)cudaStreamWaitEvent(stream, joined, 0);")
            w(f"if (!e) cf_join_directions<<<cf_blocks((size_t)seq * batch * {2 * H}), {BLOCK}, 0, stream>>>("
              f"y_forward, y_reverse, y, seq, batch, {H}, left, {H});",
              "if (!e) e = (int)cudaGetLastError();")
            if not in_order:
                w("cudaEventDestroy(forked);",
                  "cudaEventDestroy(joined);")
            w("return e;")
        w("")

    def _demo(self) -> None:
        stem_fn, w = self.fn[:-len("_forward")], self.w
        sizes = ", ".join(str(math.prod(shape)) for shape in self.plan.params.values()) or "0"
        bidirectional = self.bidirectional
        w("#ifdef CELLFUSE_DEMO_MAIN",
          f"#define CF_DEMO_FORWARD {self.fn}",
          *((f"#define CF_DEMO_BACKWARD {stem_fn}_backward",) if self.backward else ()),
          *((f"#define CF_DEMO_BIDIRECTIONAL {stem_fn}_bidirectional_forward",
             f"#define CF_DEMO_WORKSPACE {stem_fn}_bidirectional_workspace_bytes") if bidirectional else
            (f"#define CF_DEMO_WORKSPACE {stem_fn}_workspace_bytes",)),
          *(f"#define CF_DEMO_{size} {self.macro}_{size}" for size in ("PARAMS", "INPUT", "HIDDEN")),
          f"#define CF_DEMO_PARAM_SIZES {sizes}",
          "#endif",
          *cuda_library("export_demo.cuh").split("\n"))

    # -- pieces of the launchers ---------------------------------------------------------------------
    def _rows(self, b: Buffer) -> str:
        """A buffer's rows, as C (in size_t)."""
        return rows_of(b.rows).substitute({"layers": self.sizes.layers}).c()

    def _bytes(self, b: Buffer) -> str:
        """A buffer's bytes in the workspace, as C (in size_t): rounded up to 256, so that every buffer starts
        256-byte aligned whatever the types and sizes before it (a 16-bit buffer of an odd count of elements
        would leave the next float buffer misaligned), as the runtime lays its memory out."""
        return f"cf_aligned({self._rows(b)} * {b.width} * sizeof({b.dtype.c}))"

    def _buffer(self, name: str) -> Buffer:
        return self.plan.buffers[name] if name in self.plan.buffers else self.backward.buffers[name]

    def _split_room(self, instructions) -> list[str]:
        """The start of the workspace, where the GEMMs on tensor cores split their operands (see
        cf_split_bytes): named where these instructions split, stepped over where only the other pass
        does (the forward and backward passes find their buffers at the same places)."""
        if not self.splits:
            return []
        flat = [i for instr in instructions for i in (instr.body if isinstance(instr, Loop) else [instr])]
        room = "ws += cf_aligned(cf_split_bytes(seq, batch));"
        if any(isinstance(i, Gemm) and _splits(i.launch) for i in flat):
            return [f"unsigned char* cf_split = ws; {room}"]
        return [f"{room}  /* the other pass's splits */"]

    def _check_sizes(self) -> None:
        w = self.w
        w("if (seq < 0 || batch < 0 || ((long long)seq + 1) * batch > INT_MAX)",
          "    return (int)cudaErrorInvalidValue;")
        if self.max_batch:
            w(f"if (batch > {self.max_batch})  /* the persistent kernels are made for at most this batch */",
              "    return (int)cudaErrorInvalidValue;")

    def _weights(self) -> None:
        """The weights the kernels read where the caller keeps them (not the converted copies)."""
        for b in self.plan.buffers.values():
            if b.role == "weight" and b.name not in self.converted_names:
                self.w(f"const float* {_var(b.name)} = params[{self.param_index[b.sources[0]]}];  "
                       f"/* {comment_text(b.sources[0])} */")

    def _convert(self, dst: str, src: str, n: str) -> None:
        """A launch of cf_convert: n elements of src into dst, each in its own type."""
        self.w(f"cf_convert<<<cf_blocks({n}), {BLOCK}, 0, stream>>>({dst}, {src}, {n});")

    def _convert_in(self) -> None:
        """The caller's arrays into the workspace's copies of the plan's types (an initial state not given
        stays NULL: zeros; a final state not asked for stays NULL: not written)."""
        w = self.w
        for b in self.converted:
            n = f"{self._rows(b)} * {b.width}"
            match b.role:
                case "input":
                    self._convert(_var(b.name), "x", n)
                case "weight":
                    self._convert(_var(b.name), f"params[{self.param_index[b.sources[0]]}]", n)
                case "init":
                    i = self.states.index(b.name.split(".", 1)[1])
                    with w.block("if (init_states) {", "} else {"):
                        self._convert(_var(b.name), f"init_states[{i}]", n)
                    with w.indented():
                        w(f"{_var(b.name)} = NULL;")
                    w("}")
                case "final":
                    w(f"if (!final_states) {_var(b.name)} = NULL;")

    def _stacked_weights(self) -> None:
        plan, w = self.plan, self.w
        w("/* Weights of combined GEMMs, stacked along N; bias rows of hoisted GEMMs. */")
        for b in plan.buffers.values():
            if b.role == "stacked":
                shapes = [plan.params[key] for key in b.sources]
                n_total = sum(n for _, n in shapes)
                col = 0
                for key, (k, n) in zip(b.sources, shapes, strict=True):
                    param = f"params[{self.param_index[key]}]"
                    if b.dtype == FLOAT32:
                        w(f"cudaMemcpy2DAsync({_var(b.name)} + {col}, {n_total} * sizeof(float), {param}, "
                          f"{n} * sizeof(float), {n} * sizeof(float), {k}, cudaMemcpyDeviceToDevice, "
                          f"stream);  /* {comment_text(key)} */")
                    else:
                        w(f"cf_convert_rows<<<cf_blocks((size_t){k} * {n}), {BLOCK}, 0, stream>>>("
                          f"{_var(b.name)} + {col}, {n_total}, {param}, {n}, {k}, {n});  "
                          f"/* {comment_text(key)} */")
                    col += n
            elif b.role == "bias":
                col = 0
                for key, width in zip(b.sources, b.widths, strict=True):
                    if key:
                        w(f"cudaMemcpyAsync({_var(b.name)} + {col}, params[{self.param_index[key]}], "
                          f"{width} * sizeof(float), cudaMemcpyDeviceToDevice, stream);  "
                          f"/* {comment_text(key)} */")
                    else:
                        w(f"cudaMemsetAsync({_var(b.name)} + {col}, 0, {width} * sizeof(float), stream);")
                    col += width

    def _axpy(self, n: str, src: str, dst: str) -> None:
        self.w(f"st = cublasSaxpy(handle, (int)({n}), &one, {src}, 1, {dst}, 1);",
               "if (st != CUBLAS_STATUS_SUCCESS) return (int)st;")

    def _gemm_dims(self, g: GemmLaunch) -> tuple[Expr, Expr]:
        """A GEMM's rows and K, as expressions of seq and batch."""
        sizes = self.sizes
        seq_batch = sizes.seq * sizes.batch
        if g.row_kind in ("input", "hidden"):  # a weight's gradient: over all rows
            assert g.k == seq_batch, f"{g.group}: a sum over all rows whose K is not seq * batch"
            return Int(g.m), rows_of("seq")
        if g.row_kind == "one":  # a column sum: over the rows of the buffer it sums
            summed = self.backward.buffers[g.w].rows  # T*B rows, or B that every step added to
            assert g.k == {"seq": seq_batch, "batch": sizes.batch}[summed], f"{g.group}: K is not its rows"
            return Int(g.m), rows_of(summed)
        return rows_of(g.row_kind), Int(g.k)

    def _instruction(self, instr: Instruction, t: Expr | int) -> None:
        w = self.w
        match instr:
            case Gemm(launch=g, steps=None):
                self._gemm(g, t)
            case Kernel(launch=k, steps=None):
                rows = rows_of(k.row_kind)
                args = [_ptr(p.access, t) for p in kernel_params(k)]
                w(f"{self.kernels.name_of[k]}<<<cf_blocks({(rows * k.width).c()}), {BLOCK}, 0, stream>>>(",
                  f"    {', '.join(args + [rows.c(wide=False)])});")
            case Copy(src=src, dst=dst, width=width, step=step):
                at = SEQ if step is None else step
                size = f"(size_t)batch * {width} * sizeof({dst.dtype.c})"
                copy = (f"cudaMemcpyAsync({_ptr(dst, at)}, {_ptr(src, at)}, {size}, "
                        "cudaMemcpyDeviceToDevice, stream);")
                if self.plan.buffers[src.buffer].role == "init":  # the caller may pass no initial states
                    w(f"if (init_states) {copy}",
                      f"else cudaMemsetAsync({_ptr(dst, at)}, 0, {size}, stream);")
                elif self.plan.buffers[dst.buffer].role == "final":  # nor ask for the final ones
                    w(f"if (final_states) {copy}")
                else:
                    w(copy)
            case Loop(body=body, first=first, last=last, reverse=reverse):
                end = "seq" if last is None else str(last)
                with w.block(f"for (int t = {end} - 1; t >= {first}; --t) {{" if reverse else
                             f"for (int t = {first}; t < {end}; ++t) {{"):
                    for inner in body:
                        self._instruction(inner, T)
            case Persistent(launch=p):
                self._cooperative(p)
            case Gemm() | Kernel() | Record() | Wait():
                raise ValueError(f"the exported launcher runs on one stream, in whole launches: {instr!r}")
            case _:
                raise TypeError(f"the exporter cannot emit {instr!r}")

    def _gemm(self, g: GemmLaunch, t: Expr | int) -> None:
        w = self.w
        m, kk = self._gemm_dims(g)
        rows, k = m.c(wide=False), kk.c(wide=False)
        if id(g) in self.first_layer:
            self.kernel_line.setdefault(g.group, self._line)
        # a transposed operand is cuBLAS's op T, with its own row length (see the executor's call)
        op_w, op_a = ("CUBLAS_OP_T" if x else "CUBLAS_OP_N" for x in (g.trans_w, g.trans_a))
        ldw = g.k if g.trans_w else g.n
        bias_rows = [f"cf_bias_rows<<<cf_blocks({(m * g.n).c()}), {BLOCK}, 0, stream>>>("
                     f"{_ptr(g.c, t)}, {_var(g.bias)}, {rows}, {g.n}, {g.c.ld});"] if g.bias else []
        beta = "&one" if g.bias or g.accumulate else "&zero"  # (onto the bias rows)
        sgemm = (f"st = cublasSgemm(handle, {op_w}, {op_a}, {g.n}, {rows}, {k}, &one, {_var(g.w)}, "
                 f"{ldw}, {_ptr(g.a, t)}, {g.a.ld}, {beta}, {_ptr(g.c, t)}, {g.c.ld});  "
                 f"/* {comment_text(g.group)} */")
        if g.multiply != FLOAT32:  # a 16-bit plan's GEMM: in its operands' types (see gemm_ex_types)
            _, compute = gemm_ex_types(g)
            w(*bias_rows,
              f"st = cublasGemmEx(handle, {op_w}, {op_a}, {g.n}, {rows}, {k}, &one, {_var(g.w)}, "
              f"{g.w_dtype.cuda_c}, {ldw}, {_ptr(g.a, t)}, {g.a.dtype.cuda_c}, {g.a.ld}, {beta}, "
              f"{_ptr(g.c, t)}, {g.c.dtype.cuda_c}, {g.c.ld}, {COMPUTE_C[compute]}, CUBLAS_GEMM_DEFAULT);  "
              f"/* {comment_text(g.group)} */")
        elif not may_run_on_tensor_cores(g):
            w(*bias_rows, sgemm)
        else:
            with w.block(f"if (cf_f16x3({rows}, {g.n}, {k})) {{  /* {comment_text(g.group)} */", "} else {"):
                self._f16x3(g, m, kk, t, op_w)
            with w.indented():
                w(*bias_rows, sgemm)
            w("}")
        w("if (st != CUBLAS_STATUS_SUCCESS) return (int)st;")

    def _f16x3(self, g: GemmLaunch, m: Expr, kk: Expr, t: Expr | int, op_w: str) -> None:
        """A GEMM on tensor cores as three fp16 products: the calls of gemm_routes.f16x3_steps, as C (W's
        copies read as cuBLAS's `op_w`, W's own)."""
        where = {"a": _ptr(g.a, t), "w": _var(g.w), "c": _ptr(g.c, t),
                 "bias": _var(g.bias) if g.bias else "NULL"}
        # (W's region in the workspace too: the launcher makes W's copies at every call)
        region = {"workspace": as_expr(0), "kept": f16x3_layout(g, m, kk).kept_at}

        def value(arg) -> str:
            if isinstance(arg, Ref):  # (a byte offset into the workspace, cast to its elements)
                return (f"({arg.ctype}*)(cf_split + {(region[arg.of] + arg.offset).c()})" if arg.of in region
                        else where[arg.of])
            return as_expr(arg).c(wide=False)

        for step in f16x3_steps(g, m, kk):
            args = [value(arg) for arg in step.args]
            if step.kind == "zero":
                self.w(f"cudaMemsetAsync({args[0]}, 0, {(4 * as_expr(step.args[1])).c()}, stream);")
            elif step.kind == "kernel":
                self.w(f"{step.name}<<<cf_blocks({as_expr(step.threads).c()}), {BLOCK}, 0, stream>>>("
                       f"{', '.join(args)});")
            else:
                # (alpha and beta from the workspace, where A's split wrote them)
                split_w, ldw3, split_a, lda3, sums, ldd, scalars = args
                self.w("st = cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE);",
                       "if (st == CUBLAS_STATUS_SUCCESS)",
                       f"    st = cublasGemmEx(handle, {op_w}, CUBLAS_OP_N, {g.n}, {m.c(wide=False)}, "
                       f"{(3 * kk).c(wide=False)}, {scalars}, {split_w}, CUDA_R_16F, {ldw3}, {split_a}, "
                       f"CUDA_R_16F, {lda3}, {scalars} + 1, {sums}, CUDA_R_32F, {ldd}, CUBLAS_COMPUTE_32F, "
                       "CUBLAS_GEMM_DEFAULT);",
                       "cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST);",
                       "if (st != CUBLAS_STATUS_SUCCESS) return (int)st;")

    def _cooperative(self, p: PersistentLaunch) -> None:
        name, w = self.kernels.name_of[p], self.w
        args = persistent_buffers(p)
        with w.block(f"{{  /* every step of {p.label} in one cooperative launch */"):
            w("int cf_seq = seq, cf_batch = batch, cf_dev = 0, cf_sms = 0, cf_per_sm = 0;",
              *(f"const {self._buffer(b).dtype.c}* cf_p{i} = {_var(b)};" for i, b in enumerate(args)))
            table = ", ".join(["&cf_seq", "&cf_batch"] + [f"(void*)&cf_p{i}" for i in range(len(args))])
            w(f"void* cf_args[] = {{{table}}};",
              "cudaError_t cf_e = cudaGetDevice(&cf_dev);",
              "if (!cf_e) cf_e = cudaDeviceGetAttribute(&cf_sms, cudaDevAttrMultiProcessorCount, cf_dev);",
              f"if (!cf_e) cf_e = cudaFuncSetAttribute((const void*){name}, "
              f"cudaFuncAttributeMaxDynamicSharedMemorySize, {p.smem_bytes});",
              f"if (!cf_e) cf_e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cf_per_sm, {name}, "
              f"{p.threads}, {p.smem_bytes});",
              f"if (!cf_e && cf_per_sm * cf_sms < {p.blocks})  /* not all blocks resident at once */",
              "    cf_e = cudaErrorCooperativeLaunchTooLarge;",
              f"if (!cf_e) cf_e = cudaLaunchCooperativeKernel((const void*){name}, {p.blocks}, {p.threads}, "
              f"cf_args, {p.smem_bytes}, stream);",
              "if (cf_e) return (int)cf_e;")

    def _kernel_of_node(self) -> dict[str, str]:
        """Which kernel (or GEMM) computes each node of the cell, in its first layer."""
        plan, name_of = self.plan, self.kernels.name_of
        kernel_of_node: dict[str, str] = {}
        first = plan.layers[0]
        in_loop = first.persistent  # the launch that runs the steps, if one does
        for g in plan.groups:
            for n in (*g.matmuls, *g.folded):
                kernel_of_node[n] = name_of[in_loop] if in_loop and not g.hoisted else g.name
        for launch in (*first.prologue, *first.step):
            match launch:
                case KernelLaunch():
                    kernel = name_of[in_loop if in_loop and not launch.hoisted else launch]
                    for op in launch.body:
                        kernel_of_node[op.result] = kernel
                case GemmLaunch():
                    pass  # above, by group
                case _:
                    raise TypeError(f"unknown launch {launch!r}")
        return kernel_of_node
