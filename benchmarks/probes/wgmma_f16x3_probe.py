"""Where the time of a warpgroup GEMM of three fp16 products goes (wgmma_f16x3_kernel.cuh), beside the
route that runs the GEMMs outside the loop today: the LSTM's input GEMM and others, each piece timed
alone (W's columns' maxima and image, x's rows' maxima, the GEMM), the GEMM with parts changed (its
epilogue a plain store, its fence without operands, x's bits taken as its pieces: their results wrong,
only their times count), each checked against float64 first where its result is meant to be right.

    python3 benchmarks/probes/wgmma_f16x3_probe.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cellfuse.codegen.cuda_library import cuda_library
from cellfuse.gpu_runtime.cuda_executor import _compile, gpu_modules
from cellfuse.gpu_runtime.event_timing import median_ms

COLUMNS, STAGE_K, STAGES = 128, 32, 4
SMEM = STAGES * 2 * STAGE_K * COLUMNS * 2 + 2 * STAGES * 8
KERNEL = (Path(__file__).with_name("wgmma_f16x3_kernel.cuh").read_text()
          .replace('#include "f16x3.cuh"\n', ""))
EPILOGUE = ("ldexpf(big[at] + small[at] * (1.0f / 2048.0f), -(e + cf_f16x3_exponent(wm.x)))",
            "ldexpf(big[at + 1] + small[at + 1] * (1.0f / 2048.0f), -(e + cf_f16x3_exponent(wm.y)))")
VARIANTS = {
    "as built": KERNEL,
    "epilogue a plain store": KERNEL.replace(EPILOGUE[0], "big[at] + small[at]").replace(
        EPILOGUE[1], "big[at + 1] + small[at + 1]"),
    "fence without operands": KERNEL.replace(
        "        cf_wgmma_fence(h, l);",
        '        asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");'),
    "x's bits as its pieces": KERNEL.replace(
        "cf_split_f16x3(v[0] * scale, v[1] * scale, h[s][f], l[s][f]);",
        "h[s][f] = __float_as_uint(v[0]); l[s][f] = __float_as_uint(v[1]);"),
}
SHAPES = [(6400, 2048, 512), (25600, 2048, 512), (6400, 4096, 1024), (6400, 1536, 512), (6400, 512, 512)]


def main() -> None:
    drv = gpu_modules()[0]
    stream = drv.Stream()
    head = cuda_library("f16x3.cuh") + "".join(
        f"#define {name} {value}\n" for name, value in
        {"CF_COLUMNS": COLUMNS, "CF_STAGE_K": STAGE_K, "CF_STAGES": STAGES, "CF_SMEM": SMEM}.items())
    modules = {}
    for name, text in VARIANTS.items():
        module = drv.module_from_buffer(_compile(head + text, "sm_90a"))
        gemm = module.get_function("cf_wgmma_gemm")
        gemm.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM)
        modules[name] = (module, gemm.prepare("PPPPPiiiiii"))
    built = modules["as built"][0]
    columns = built.get_function("cf_wgmma_columns").prepare("PPiiii")
    image = built.get_function("cf_wgmma_image").prepare("PPiiii")
    row_maxima = built.get_function("cf_wgmma_row_maxima").prepare("PPiii")

    def timed(run) -> float:
        run()
        return median_ms(drv, run, stream, 50)

    def shape(m: int, n: int, k: int) -> str:
        rng = np.random.default_rng(1)
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        x_d, w_d, b_d = drv.to_device(x), drv.to_device(w), drv.to_device(b)
        c_d = drv.mem_alloc(4 * m * n)
        pieces = drv.mem_alloc(4 * n * k + 4 * n + 4 * m)
        rows = int(pieces) + 4 * n * k + 4 * n
        args = (pieces, w_d, n, k, n, 0)
        block = (256, 1, 1)

        def grid(threads: int) -> tuple[int, int]:
            return (threads + 255) // 256, 1

        times = {
            "W's columns": timed(lambda: columns.prepared_async_call(grid(n), block, stream, *args)),
            "W's image": timed(lambda: image.prepared_async_call(grid(n * k), block, stream, *args)),
            "x's rows": timed(lambda: row_maxima.prepared_async_call(grid(32 * m), block, stream, rows, x_d,
                                                                     m, k, k)),
        }
        want = x.astype(np.float64) @ w.astype(np.float64) + b
        line = f"{m} x {n} x {k}: " + ", ".join(f"{name} {ms:.4f}" for name, ms in times.items())
        for name, (_, gemm) in modules.items():
            tiles = (n // COLUMNS, (m + 127) // 128)
            ms = timed(lambda gemm=gemm, tiles=tiles: gemm.prepared_async_call(
                tiles, block, stream, c_d, x_d, rows, pieces, b_d, m, n, k, k, n, 0, shared_size=SMEM))
            line += f" | GEMM {name} {ms:.4f}"
            if name == "as built":
                got = drv.from_device(c_d, (m, n), np.float32)
                line += f" (error {np.max(np.abs(got - want)) / np.max(np.abs(want)):.1e})"
        return line + " ms"

    for m, n, k in SHAPES:
        print(shape(m, n, k), flush=True)


if __name__ == "__main__":
    main()
