"""A Plan for people: what `cellfuse plan` prints (`describe`), and the JSON of `plan --json` and the
editor's plan panel (`summary`)."""

from __future__ import annotations

from .dtypes import FLOAT32
from .gemm_routes import on_tensor_cores, route
from .plan import GemmLaunch, Plan, launch_name
from .roofline import H100_SXM, roofline


def summary(plan: Plan) -> dict:
    """The plan as plain data: what `plan --json` prints."""
    tensor_cores = tensor_core_groups(plan)
    return {
        "cell": plan.cell_name,
        "schedule": plan.schedule,
        "precision": plan.precision,
        "sizes": {"seq": plan.sizes.seq, "batch": plan.sizes.batch, "input": plan.sizes.input,
                  "hidden": plan.sizes.hidden, "layers": plan.sizes.layers},
        "gemm_groups": [{"name": g.name, "matmuls": list(g.matmuls), "hoisted": g.hoisted,
                         "folded": sorted(g.folded), "tensor_cores": g.name in tensor_cores}
                        for g in plan.groups],
        "fused_kernels": [{"name": i.name, "nodes": list(i.nodes), "hoisted": i.hoisted,
                           "inputs": list(i.inputs), "outputs": list(i.outputs)} for i in plan.islands],
        "launches_per_step": plan.launches_per_step,
        "launches_before_loop": len(plan.layers[0].prologue),
        "flops_per_step": plan.flops_per_step(),
        "bytes_per_step": plan.bytes_per_step(),
        # at an H100 SXM's published peaks (codegen.roofline): ms of arithmetic, bytes, barriers, bound
        "roofline_h100_sxm": roofline(plan, H100_SXM).to_json(),
        "cuda_graph": plan.cuda_graph,
        "hoisted_chunk_steps": plan.chunk_steps,
        "layer_streams": plan.layer_streams,
        "persistent": None if not plan.layers[0].persistent else {
            "blocks": plan.layers[0].persistent.blocks, "threads": plan.layers[0].persistent.threads,
            "row_groups": plan.layers[0].persistent.row_groups,
            "barriers_per_step": plan.layers[0].persistent.barriers_per_step,
            "exchange_waits_per_step": plan.layers[0].persistent.exchange_waits_per_step,
            "smem_bytes_per_block": plan.layers[0].persistent.smem_bytes,
            "weights_on_chip": all(i.on_chip for i in plan.layers[0].persistent.items
                                   if isinstance(i.launch, GemmLaunch)),
            "tensor_cores": any(i.mma for i in plan.layers[0].persistent.items),
            "tensor_core_math": _tensor_core_math(plan),
            "cooperative": plan.layers[0].persistent.cooperative,
            "note": plan.layers[0].persistent.note},
        "dropped": list(plan.dead),
    }


def describe(plan: Plan) -> str:
    """The plan for people: what `cellfuse plan` prints."""
    s = plan.sizes
    sizes = f"seq {s.seq}, batch {s.batch}, input {s.input}, hidden {s.hidden}, layers {s.layers}"
    persistent = plan.layers[0].persistent
    if persistent:
        launches = ("one cooperative launch runs every step of a layer" if persistent.cooperative else
                    "one launch runs every step of a layer, its blocks independent of each other")
    else:
        launches = f"{plan.launches_per_step} launch(es) per step"
    lines = [f"cell '{plan.cell_name}', schedule '{plan.schedule}', {sizes}",
             f"{launches}, {len(plan.layers[0].prologue)} before the loop; per step "
             f"{plan.flops_per_step() / 1e6:.1f} MFLOP, {plan.bytes_per_step() / 2**20:.2f} MiB"]
    if plan.precision != "fp32":
        sixteen = sorted(name for name, b in plan.buffers.items() if b.dtype.itemsize == 2)
        kept = sorted(name for name, b in plan.buffers.items()
                      if b.dtype.itemsize == 4 and b.role not in ("gemm", "bias"))
        lines.append(f"precision {plan.precision}: GEMMs multiply {plan.precision} values into float32; "
                     f"stored in {plan.precision}: {', '.join(sixteen)}"
                     + (f"; kept float32: {', '.join(kept)}" if kept else ""))
    if plan.chunk_steps:
        lines.append(f"hoisted launches run in chunks of {plan.chunk_steps} steps on a stream of their "
                     "own, beside the loop")
    if plan.layer_streams:
        lines.append("each layer's steps run on a stream of their own: layer l runs a chunk of steps "
                     f"beside layer l-1's next chunk, its GEMMs planned by cuBLAS for "
                     f"1/{plan.side_by_side} of the SMs")
    if plan.cuda_graph:
        lines.append("the whole forward pass is captured once into a CUDA graph and replayed")
    lines += ["", "GEMM groups:"]
    tensor_cores = tensor_core_groups(plan)
    sixteen_bit = plan.precision != "fp32"
    # (a GEMM the warpgroup GEMM may take runs whichever of the two measures faster on an sm_90 GPU)
    rows = tensor_cores_rows(plan)
    or_wgmma = {g.group for g in plan.layers[0].prologue if isinstance(g, GemmLaunch)
                and g.group in tensor_cores and route(g, rows) == "f16x3-or-wgmma"}
    for g in plan.groups:
        where = "hoisted: once for all steps" if g.hoisted else f"every step, stage {g.stage}"
        # (in 16 bits, every GEMM that cuBLAS runs: those of a persistent kernel are said below)
        if g.name in tensor_cores or (sixteen_bit and (g.hoisted or not persistent)):
            where += f", on tensor cores ({_cublas_math(plan, g.name)})"
        where += (", or 3xTF32 in the warpgroup GEMM where that measures faster on an sm_90 GPU"
                  if g.name in or_wgmma else "")
        folded = f"; bias folded: {', '.join(sorted(g.folded))}" if g.folded else ""
        lines.append(f"  {g.name:8s} {g.left} @ [{', '.join(g.weights)}] -> {', '.join(g.matmuls)}  "
                     f"({where}{folded})")
    lines += ["", "kernels:"]
    for isl in plan.islands:
        where = "hoisted" if isl.hoisted else f"stage {isl.stage}"
        lines.append(f"  {isl.name:8s} ({where}) {', '.join(isl.nodes) or 'stores'}")
        lines.append(f"           reads {', '.join(isl.inputs) or '-'}; "
                     f"writes {', '.join(isl.outputs) or '-'}")
    lines += ["", "one step, in order:"]
    if persistent:
        p = persistent
        rows = p.group_rows
        split = (f"{p.column_blocks} column blocks x {p.row_groups} row groups of {rows} rows"
                 if p.row_groups > 1 else f"{p.column_blocks} column blocks, every row")
        lines[-1] = (f"one step, in order, in each of {p.blocks} blocks of {p.threads} threads ({split}; "
                     f"{p.waits_text}, {p.smem_bytes / 1024:.1f} KiB of shared memory per block):")
        for item in p.items:
            units = ", ".join(str(p.unit(w)) for w in item.columns)
            if item.whole:
                what = "every block computes all of it"
            elif item.by_rows:
                what = "a block per row"
            else:
                weights = ("weights" if item.tiling is None or item.tiling.w_itemsize == 4
                           else f"weights (in {plan.precision})")
                kept = ((weights, item.on_chip), ("output", item.output_on_chip))
                on_chip = [name for name, yes in kept if yes]
                what = f"{units} column(s) per block" + (f", {' and '.join(on_chip)} in shared memory"
                                                         if on_chip else "")
                if item.mma:
                    what += f", on tensor cores ({_tensor_core_math(plan)})"
                elif sixteen_bit and isinstance(item.launch, GemmLaunch):
                    what += f", on the CUDA cores, its operands rounded to {plan.precision}"
                what += ", products in registers" if item.in_registers else ""
            wait = ""
            if item.barrier:
                wait = ("grid barrier, then " if p.grid_barrier(item)
                        else f"wait for {item.launch.a.buffer} in its exchange, then ")
            lines.append(f"  {wait}{launch_name(item.launch)} ({what})")
        for ex in p.exchange:
            lines.append(f"  {ex.buffer} also goes to an exchange of (step, value) pairs, polled by the "
                         "blocks that read it")
        if persistent.note:
            lines.append(f"  note: {persistent.note}")
    else:
        lines += [f"  {launch_name(launch)}" for launch in plan.layers[0].step]
    if plan.dead:
        lines += ["", f"not computed (nothing depends on them): {', '.join(plan.dead)}"]
    lines += ["", f"roofline at an {H100_SXM.name}'s published peaks: {roofline(plan, H100_SXM).text()}"]
    return "\n".join(lines)


def _tensor_core_math(plan: Plan) -> str:
    """How a GEMM on tensor cores multiplies in the plan's precision (in float32, each product as three
    fp16 ones over scaled rows and columns: f16x3.cuh)."""
    if plan.precision != "fp32":
        return f"{plan.precision} into float32"
    return "3xFP16, rows and columns scaled"


def _cublas_math(plan: Plan, group: str) -> str:
    """How cuBLAS multiplies a GEMM group of the first layer on tensor cores: as `_tensor_core_math`, but
    in 16 bits a GEMM of float32 operands (a float32 state's: precision's module doc) in cuBLAS's fast
    compute type for the 16-bit type, which rounds as TF32 does, at TF32's rate."""
    first = plan.layers[0]
    launch = next((g for g in (*first.prologue, *first.step)
                   if isinstance(g, GemmLaunch) and g.group == group), None)
    if plan.precision != "fp32" and launch is not None and launch.w_dtype == FLOAT32:
        return f"float32 operands, in cuBLAS's fast {plan.precision} compute type: as TF32, at its rate"
    return _tensor_core_math(plan)


def tensor_cores_rows(plan: Plan) -> int:
    """The rows of a hoisted GEMM's launch: `chunk_steps` steps' where the plan has chunks, all otherwise."""
    return plan.chunk_steps * plan.sizes.batch if plan.chunk_steps else plan.sizes.seq * plan.sizes.batch


def tensor_core_groups(plan: Plan) -> list[str]:
    """The GEMM groups whose hoisted launches run on tensor cores (see `on_tensor_cores`): in
    chunks of `chunk_steps` steps where the plan has them, whole otherwise."""
    rows = tensor_cores_rows(plan)
    return [g.group for g in plan.layers[0].prologue
            if isinstance(g, GemmLaunch) and on_tensor_cores(rows, g.n, g.k)]


# Each rung in one line, for people choosing one (the editor's schedule list, its tooltips).
SCHEDULE_LINES = {
    "naive": "every matmul its own GEMM and every op its own kernel, at every step",
    "combined": "matmuls that share an operand run as one GEMM",
    "fused": "each island of elementwise ops runs as one kernel",
    "hoisted": "GEMMs that depend on no state run once for all steps, beside the loop",
    "graph": "the hoisted plan captured once into a CUDA graph and replayed",
    "wavefront": "graph, with each layer on streams of its own, a chunk of steps behind the layer below",
    "persistent": "each layer's whole step loop in one kernel, its recurrent weights kept on chip "
                  "(they must fit in the GPU's shared memory)",
    "tensor": "persistent, with its GEMMs on tensor cores as three fp16 products each, rows and columns "
              "scaled (float32's accuracy; needs compute capability 8.0 or later)",
}
