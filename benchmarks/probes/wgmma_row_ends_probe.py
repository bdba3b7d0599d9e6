"""The warpgroup GEMM of the LSTM's input (x [T*B, 512] @ W [512, 2048], T=100) timed alone, each of its
row layouts: 128 rows a block, every row computed; blocks of 8 steps of 16 batch rows, told the rows'
lengths (uniform in 10..100, longest first: the ended blocks skipped); the same blocks with every row
running to T (nothing skipped: what the layout alone costs). Medians of --runs, ms.

    python3 benchmarks/probes/wgmma_row_ends_probe.py [--batch 64] [--runs 50]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from cellfuse.gpu_runtime.cuda_executor import gpu_modules, warpgroup_gemms
from cellfuse.gpu_runtime.event_timing import median_ms
from cellfuse.gpu_runtime.wgmma_gemms import Operands


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    drv = gpu_modules()[0]
    T, B, n, k, width = args.seq, args.batch, 2048, 512, 512
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(T // 10, T + 1, B))[::-1].astype(np.float32)
    x = rng.standard_normal((T * B, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    x_d, w_d, c_d = drv.to_device(x), drv.to_device(w), drv.mem_alloc(4 * T * B * n)
    ends = drv.to_device(np.repeat(lengths[:, None], width, axis=1))
    full = drv.to_device(np.full((B, width), float(T), np.float32))
    pieces = drv.mem_alloc(4 * 2 * n * k)
    stream = drv.Stream()
    gemms = warpgroup_gemms()
    plain = Operands(int(c_d), int(x_d), int(w_d), int(pieces), T * B, n, k, k, n, n, False, False)
    gemms.image_call(plain, stream)()
    cases = {"128 rows a block": plain,
             "8 steps x 16 rows, lengths uniform": replace(plain, lengths=int(ends), lengths_ld=width,
                                                           batch=B),
             "8 steps x 16 rows, all T long": replace(plain, lengths=int(full), lengths_ld=width, batch=B)}
    print(f"x [{T}*{B}, {k}] @ W [{k}, {n}], lengths {int(lengths.min())}..{int(lengths.max())} "
          f"(mean {lengths.mean():.1f}), ms:")
    for _ in range(2):  # in turns, twice
        for name, op in cases.items():
            call = gemms.gemm_call(op, stream)
            call()
            print(f"  {name:36s} {median_ms(drv, call, stream, args.runs):.4f}", flush=True)


if __name__ == "__main__":
    main()
