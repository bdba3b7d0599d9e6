"""Where a training step's time goes, on the GPU: each instruction of a schedule's forward program and of
its backward program timed alone (CUDA events on its stream, the median of --reps runs), and the
persistent kernels timed again with parts of them taken out (their results are then wrong; only their
time is measured), so that the grid barrier, the per-step GEMM and the elementwise island each show
their share. With --variants, the persistent kernels timed again with changes that keep their results
(each variant's outputs, and a training step's gradients, checked against the kernels' as they are):
a change to the generated kernels tried on the GPU, A/B in one run, before it is made in codegen.

    python benchmarks/step_profile.py lstm:64 gru:64 lstm:1 --json results/step_profile.json
    python benchmarks/step_profile.py lstm:64 --schedule tensor --precision bf16 --ablations whole
    python benchmarks/step_profile.py lstm:64 --schedule tensor --inference --ablations whole \
        --variants "rows unscaled"
    python benchmarks/step_profile.py lstm:64 --schedule tensor --k-chunk 1024 \
        --ablations "whole,no staging (where staged)"

A CASE is TEMPLATE:BATCH (T=100, input=hidden=512 unless --seq/--hidden say otherwise). With
--inference, the forward program of inference (no step saved for a backward pass: the one the forward
benchmark times) instead of a training step's two programs. With --k-chunk, the tensor rung's GEMMs
stage K in chunks of that many columns where shared memory holds them (of the first of
tiling.MMA_K_CHUNKS otherwise) instead of the widest of MMA_K_CHUNKS that fits: a plan of another shape,
timed in a run of its own. With --sms N, the plans are made for N SMs (66: a direction's half of an H100
or H200, as two directions side by side are planned), their blocks then alone on the GPU.

    python benchmarks/step_profile.py lstm:64 gru:64 --schedule tensor --inference --sms 66 \
        --ablations whole --variants "k loops unrolled 8"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
from datetime import UTC, datetime

import numpy as np

import cellfuse.codegen.persistent as persistent
import cellfuse.gpu_runtime.cuda_backward as cuda_backward
import cellfuse.gpu_runtime.cuda_executor as cuda_executor
from cellfuse.codegen.lowering import Gemm, Kernel, Persistent
from cellfuse.codegen.scheduler import make_plan
from cellfuse.gpu_runtime import kernel_cache
from cellfuse.gpu_runtime.event_timing import median_ms
from cellfuse.gpu_runtime.kernel_cache import fitted
from cellfuse.graph_model import Sizes, init_params, load_template

# Each ablation: (pattern, replacement) edits of a persistent kernel's source (and WHERE_FOUND, for an
# edit that leaves a kernel without the pattern as it is).
_NO_GEMM = (r"rb < rows; rb \+= (\d+)", r"rb < 0; rb += \1")  # no staging, no products, no stores
# staging and stores only: the loop over K of the CUDA cores' products, or of the tensor cores' (counted
# where W's fragments stay in registers, gemm_mma.fragments, whose loads before the loop go too)
_NO_FMA = (r"for \(int (it = 0; it < |j = 0; j < )\d+;|for \(int (k = ks \* \d+; k < )",
           lambda m: f"for (int {m[1]}0;" if m[1] else f"for (int {m[2]}0 && k < ")
_NO_ELEMENTWISE = (r"(?m)^\s*p\d+\[\(long long\)r \* \d+ \+ j\] \+?= [^;]*;\s*$", "")
_NO_SYNC = (r"grid\.sync\(\);", ";")
# the operand's rows not copied into the stage (the products run on what it held): what staging costs,
# where a GEMM stages its rows (not where they come through an exchange: an edit that may find nothing);
# a float32 operand's 16-byte copies, or a 16-bit one's four values stored as float32
WHERE_FOUND = "where found"
_NO_STAGING = (r"cf_copy16\(s, [^;]*;|\*\(float4\*\)\(cf_stage \+ [^;]*\) = make_float4\([^;]*;", ";",
               WHERE_FOUND)
# the two small fp16 products of a float32 one (hi * lo, lo * hi) left out: one fp16 product each
_ONE_F16 = (r"(?m)^\s*cf_mma_f16\(small\[x\], [^;]*;\s*$", "")
# the rows of a float32 GEMM's operand on tensor cores left unscaled (their largest magnitudes, then
# unused, compiled away)
_NO_ROW_SCALES = [(r"const float s0 = cf_f16x3_scale\(m0\), s1 = cf_f16x3_scale\(m1\);",
                   "const float s0 = 1.0f, s1 = 1.0f;")]
# the loops over K unrolled 8 at a time where they are unrolled whole, in every kernel: the tensor cores'
# (the products', the rows' scales'), whose trip count nvcc does not know (it starts at the warp's
# share), and the CUDA cores' (`for (int it = 0; ...)`). The executors compile a kernel that spills so
# where it has more than 8 iterations (kernel_cache.fitted); where nothing spills it cost 1% to 28%
# (benchmarks/results/h200_2026-11-30_unroll_8_over_8_e25739a.txt, made with a variant that unrolled 8
# only loops of more than 8 iterations: gemm_fma.k_loop_unroll's rule in every kernel).
def _unrolled(n: int) -> tuple[str, str]:
    return r"#pragma unroll(\n\s*for \(int (?:k = ks \* \d+;|it = 0; it < \d+;))", rf"#pragma unroll {n}\1"
# the tensor cores' products with W's fragments made from A's (in registers) instead of loaded from shared
# memory (or kept in registers: gemm_mma.fragments): what W's loads cost
_NO_W_LOADS = (r"const (uint[24]) (w[24]) = (?:j < \d+ \? cf_wf\d+\[j\]\[x\] : )?"
               r"\*\(const uint[24]\*\)\(wt \+ x \* \d+ \+ k\);",
               lambda m: (f"const {m[1]} {m[2]} = make_{m[1]}(" +
                          ", ".join(["a4[0].x == 0.0f ? (unsigned)x : (unsigned)k"] * int(m[1][-1])) + ");"))
SMS = 0  # --sms
ABLATIONS = {
    "whole": [],
    "no grid barrier": [_NO_SYNC],
    "no GEMM": [_NO_GEMM],
    "GEMM staging only (no FMAs)": [_NO_FMA],
    "no elementwise stores": [_NO_ELEMENTWISE],
    "barrier only": [_NO_GEMM, _NO_ELEMENTWISE],
    "no staging (where staged)": [_NO_STAGING],
    "one fp16 product (no small ones)": [_ONE_F16],
    "no W loads (tensor cores)": [_NO_W_LOADS],
}
# Changes that keep the results (to rounding: sums in another order), checked and timed with --variants.
VARIANTS = {
    # what the rows' scales cost: the results the same only where every row's values lie in fp16's range
    # unscaled (an LSTM's h, in inference; "matches" says whether they did)
    "rows unscaled": _NO_ROW_SCALES,
    "k loops unrolled 8": [_unrolled(8)],
    # (the GRU's float32 inference kernel at B=256 on tensor cores: 255 registers, as written and unrolled
    # 8 spilling 36 bytes or none by ptxas's chance, unrolled 4 224 and none:
    # tests/codegen/test_kernel_registers.py)
    "k loops unrolled 4": [_unrolled(4)],
}
# a variant's largest difference from the kernels' results, relative to the largest of those (or to 1)
VARIANT_TOLERANCE = 1e-4


class NotApplicable(Exception):
    """An ablation takes out something a kernel does not have (a cell with no recurrent GEMM, say)."""


def _ablate(kernels, edits):
    for name, source in kernels.sources.items():
        if "grid_group" not in source:
            continue
        for pattern, replacement, *where_found in edits:
            source, n = re.subn(pattern, replacement, source)
            if not n and not where_found:
                raise NotApplicable(f"{pattern!r} is not in {name}")
        kernels.sources[name] = source
    return kernels


def _describe(instr, batch: int) -> str:
    match instr:
        case Gemm(launch=g):
            return f"GEMM m={instr.rows} n={g.n} k={g.k}"
        case Kernel(launch=k):
            return f"kernel {k.island} ({k.rows} rows)"
        case Persistent():
            return "persistent kernel"
    return type(instr).__name__


def _time(ex, instr, reps: int, splits: list[int] | None = None) -> float:
    """The median time of one instruction alone; a backward instruction's GEMMs on tensor cores split
    their operands into the backward pass's own room (`splits`), the forward's being smaller."""
    stream = ex.streams[getattr(instr, "stream", 0)]
    calls = ex._calls(instr, 0, None, splits)

    def run():
        for call in calls:
            call()
    for _ in range(2):  # warm
        run()
    return median_ms(ex.drv, run, stream, reps, idle=True)


def _target():
    """The GPU's target, or with --sms, one of that many of its SMs (a direction's half of them, as two
    directions side by side are planned): the plan's blocks then run alone on the GPU."""
    target = cuda_executor.device_target()
    return dataclasses.replace(target, sm_count=SMS) if SMS else target


def _edited(kernels, arch: str, edits):
    """A plan's kernels as the executors compile them (kernel_cache.fitted), the persistent ones then
    edited, and their cubin."""
    kernels, cubin = fitted(kernels, arch)
    if not edits:
        return kernels, cubin
    kernels = _ablate(kernels, edits)
    return kernels, kernel_cache.cubin(kernels.module_source(), arch)


def precompile(cases, seq: int, hidden: int, schedule: str, ablations: dict, training: bool = True,
               precision: str = "fp32") -> None:
    """Every variant's modules compiled at once, into the kernel cache (nvcc runs one module on one core,
    and there are dozens of them): the timed runs then find them there."""
    from concurrent.futures import ThreadPoolExecutor

    drv = cuda_executor.gpu_modules()[0]
    major, minor = drv.Context.get_device().compute_capability()
    jobs = []
    for name, batch in cases:
        plan = make_plan(load_template(name), Sizes(seq, batch, hidden, hidden), schedule, _target(),
                         save_steps=training, precision=precision)
        for edits in ablations.values():
            jobs.append((cuda_executor.plan_kernels(plan), edits))
            if training:
                jobs.append((cuda_backward.backward_kernels(cuda_backward.backward_plan(plan)), edits))

    def compile_one(job):
        kernels, edits = job
        try:
            _edited(kernels, f"sm_{major}{minor}", edits)
        except NotApplicable:
            pass

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(compile_one, jobs))


def profile(cell_name: str, batch: int, seq: int, hidden: int, schedule: str, reps: int,
            ablations: dict, training: bool = True, precision: str = "fp32", variants: dict | None = None
            ) -> dict:
    cell = load_template(cell_name)
    sizes = Sizes(seq, batch, hidden, hidden)
    params = init_params(cell, 1, hidden, hidden, 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((seq, batch, hidden)).astype(np.float32)
    dy = rng.standard_normal((seq, batch, hidden)).astype(np.float32)
    record: dict = {"cell": cell_name, "batch": batch, "seq": seq, "hidden": hidden, "schedule": schedule,
                    "training": training, "precision": precision}

    def run(edits, check: bool):
        """The programs' instructions timed with the persistent kernels edited, and, where `check`, their
        results (the forward pass's arrays, then a training step's gradients: a backward pass more, which
        an ablation's wrong results do not need); None where the edits do not apply."""
        cuda_executor.fitted = lambda kernels, arch, e=edits: _edited(kernels, arch, e)
        plan = make_plan(cell, sizes, schedule, _target(), save_steps=training,
                         precision=precision)
        try:
            ex = cuda_executor.CudaExecutor(plan, params)
        except NotApplicable:
            return None
        back = None
        try:
            back = cuda_backward.CudaBackward(ex) if training else None
            results = ex.run(x, {s: np.zeros((1, batch, hidden), np.float32) for s in cell.updates}).arrays()
            forward = [(_describe(i, batch), _time(ex, i, reps)) for i in ex.program.instructions]
            backward = []
            if back:
                if check:
                    grads = back.run(dy)
                    results.update({"dx": grads.dx, **{f"d{k}": v for k, v in grads.dparams.items()}})
                back.seed(dy)
                backward = [(_describe(i, batch), _time(ex, i, reps, back.splits))
                            for i in back.plan.instructions()]
        except NotApplicable:
            return None
        finally:
            if back:
                back.close()
            ex.close()
        return forward, backward, results

    def persistent_ms(forward, backward):
        return {"forward persistent ms": sum(t for d, t in forward if d == "persistent kernel"),
                "backward persistent ms": sum(t for d, t in backward if d == "persistent kernel")}

    whole = None
    try:
        for ablation, edits in {**ablations, **({"whole": []} if variants else {})}.items():
            done = run(edits, check=ablation == "whole" and bool(variants))
            record.setdefault("ablations", {})[ablation] = done and persistent_ms(*done[:2])
            if done and ablation == "whole":
                record["forward"], record["backward"], whole = *done[:2], done[2]
            print(cell_name, batch, ablation, record["ablations"][ablation], flush=True)
        for variant, edits in (variants or {}).items():
            done = run(edits, check=True)
            if done is None:
                record.setdefault("variants", {})[variant] = None
            else:
                differences = {name: float(np.max(np.abs(done[2][name] - want))
                                           / max(1.0, np.max(np.abs(want)))) for name, want in whole.items()}
                worst = max(differences, key=differences.get)
                record.setdefault("variants", {})[variant] = {
                    **persistent_ms(*done[:2]), "largest relative difference": differences[worst],
                    "in": worst, "matches": differences[worst] <= VARIANT_TOLERANCE}
            print(cell_name, batch, "variant", variant, record["variants"][variant], flush=True)
    finally:
        cuda_executor.fitted = fitted
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="TEMPLATE:BATCH")
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--schedule", default="persistent")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ablations", default=",".join(ABLATIONS),
                    help="which of the kernels' variants to time (default: all)")
    ap.add_argument("--inference", action="store_true",
                    help="the forward program of inference alone, not a training step's two programs")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--variants", default="",
                    help=f"changes of the kernels that keep their results, checked and timed: "
                         f"{', '.join(VARIANTS)}")
    ap.add_argument("--k-chunk", type=int, help="columns of K the tensor rung stages at a time")
    ap.add_argument("--sms", type=int, help="plan for this many SMs (a direction's half: 66 on an H100)")
    ap.add_argument("--json")
    args = ap.parse_args()
    global SMS
    SMS = args.sms or 0
    if args.k_chunk:
        persistent.MMA_K_CHUNKS = (args.k_chunk,)
    ablations = {name: ABLATIONS[name] for name in args.ablations.split(",")}
    variants = {name: VARIANTS[name] for name in args.variants.split(",") if name}
    cases = [(name, int(batch)) for name, batch in (case.split(":") for case in args.cases)]
    training = not args.inference
    precompile(cases, args.seq, args.hidden, args.schedule, {**ablations, **variants}, training,
               args.precision)
    records = []
    for case, (name, batch) in zip(args.cases, cases, strict=True):
        rec = profile(name, batch, args.seq, args.hidden, args.schedule, args.reps, ablations, training,
                      args.precision, variants)
        for part in ("forward", "backward") if training else ("forward",):
            print(f"{case} {part}:")
            for what, ms in rec[part]:
                print(f"    {ms:8.4f} ms  {what}")
        records.append(rec)
    if args.json:
        gpu = cuda_executor.device_description()
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "date": datetime.now(UTC).isoformat(timespec="seconds"),
                       "command": shlex.join(["python", *sys.argv]),
                       "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
