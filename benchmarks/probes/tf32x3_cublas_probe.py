"""Whether cuBLAS's TF32 GEMM, given operands split into TF32 parts, beats its float32 GEMM at the shapes
of an LSTM's hoisted and gradient GEMMs with float32's accuracy: the question behind the executor's
3xTF32 GEMMs (see `cf_split_tf32x3`). Each operand x = hi + lo (hi = x rounded to TF32, lo = x - hi
rounded again); A's pieces (hi, hi, lo) against W's (hi, lo, hi) along K make the three products one
GEMM over 3K ("kcat"), timed beside the same three products as two or three accumulating calls. Errors
are the largest difference from a float64 product over the largest magnitude. "kcat raw hi" passes A and
W unsplit as the hi pieces (the tensor cores then leave out their low 13 bits, if cuBLAS does not round
them first: its error says which) beside lo pieces taken against the truncation. "kcat best of N" is the
fastest of the N algorithms cuBLASLt offers for the kcat GEMM (nvmath-python's Matmul), beside "kcat
heuristic", the first it offers: each execute is launched from Python, whose overhead per call (about
0.035 ms on an H100) can exceed the GEMM's own time and hide the differences. "3xfp16 kcat" is the same
GEMM as three fp16 products over A's rows and W's columns scaled by powers of two (the pieces the tensor
rung's persistent kernels multiply), one fp16 GEMM over 3K into float32 (torch.mm's out_dtype), its
error taken after the scales are undone. Needs PyTorch with CUDA (and nvmath-python for the algorithms):

    python3 benchmarks/probes/tf32x3_cublas_probe.py OUT.json [SHAPE ...]
"""

from __future__ import annotations

import json
import sys

import torch


def tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32 (10 bits of mantissa), to nearest, ties away from zero."""
    return ((x.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi = tf32(x)
    return hi, tf32(x - hi)


def truncated(x: torch.Tensor) -> torch.Tensor:
    """x with the 13 low bits of its mantissa cleared: what the tensor cores keep of a float32 as TF32."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def f16x3_pieces(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x scaled by a power of two per row (dim=1: A's) or per column (dim=0: W's), so that its largest
    magnitude lies in [2^14, 2^15), as fp16 hi and lo pieces, lo = (x - hi) * 2^11 (persistent.cuh's
    cf_split_f16x3), and the inverse scales."""
    m = x.abs().amax(dim=dim, keepdim=True)
    one = torch.ones_like(m)
    scale = torch.where(m > 0, torch.ldexp(one, 15 - torch.frexp(m).exponent), one)
    xs = x * scale
    hi = xs.half()
    return hi, ((xs - hi.float()) * 2048).half(), 1 / scale


def median_ms(f, n: int = 30) -> float:
    for _ in range(3):
        f()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        start.record()
        f()
        end.record()
    torch.cuda.synchronize()
    return sorted(start.elapsed_time(end) for start, end in events)[n // 2]


SHAPES = {"input 6400x512 @ 512x2048": (6400, 512, 2048),
          "IndRNN input 6400x512 @ 512x512": (6400, 512, 512),
          "dW 512x6400 @ 6400x2048": (512, 6400, 2048),
          "dx 6400x2048 @ 2048x512": (6400, 2048, 512), "B256 input 25600x512 @ 512x2048": (25600, 512, 2048),
          "H1024 6400x1024 @ 1024x4096": (6400, 1024, 4096),
          # around the executor's rule (2^30 multiply-adds: 1024 rows here), and graph's chunks of 10 steps
          **{f"input {m}x512 @ 512x2048": (m, 512, 2048) for m in (256, 640, 1024, 1280, 2560)}}


def measure(M: int, K: int, N: int, g: torch.Generator) -> dict[str, float]:
    """Errors and median times of C = A @ B, [M, K] @ [K, N], each way."""
    A = torch.randn(M, K, device="cuda", generator=g) * 0.5
    B = torch.randn(K, N, device="cuda", generator=g) * 0.05
    ref = A.double() @ B.double()

    def err(C: torch.Tensor) -> float:
        return ((C.double() - ref).abs().max() / ref.abs().max()).item()

    r = {}
    for tf32_on, label in ((False, "fp32"), (True, "tf32")):
        torch.backends.cuda.matmul.allow_tf32 = tf32_on
        r[f"{label} err"], r[f"{label} ms"] = err(A @ B), median_ms(lambda: A @ B)
    Ah, Al = split(A)
    Bh, Bl = split(B)
    A3, B3 = torch.cat([Ah, Ah, Al], 1), torch.cat([Bh, Bl, Bh], 0)
    r["3xtf32 kcat err"], r["3xtf32 kcat ms"] = err(A3 @ B3), median_ms(lambda: A3 @ B3)
    A2, B2 = torch.cat([Ah, Al], 1), torch.cat([Bh, Bh], 0)
    out = torch.empty(M, N, device="cuda")

    def two():
        torch.matmul(A2, B2, out=out)
        out.addmm_(Ah, Bl)

    def three():
        torch.matmul(Ah, Bh, out=out)
        out.addmm_(Ah, Bl)
        out.addmm_(Al, Bh)

    for label, f in (("2call", two), ("3call", three)):
        f()
        r[f"3xtf32 {label} err"], r[f"3xtf32 {label} ms"] = err(out), median_ms(f)
    # the same GEMM with A stored [3K, M] and read transposed, as a weight gradient's x^T arrives: neither
    # operand then has K contiguous
    At = A3.t().contiguous().t()
    r["3xtf32 kcat A^T err"], r["3xtf32 kcat A^T ms"] = err(At @ B3), median_ms(lambda: At @ B3)
    Ar, Br = torch.cat([A, A, A - truncated(A)], 1), torch.cat([B, B - truncated(B), B], 0)
    r["3xtf32 kcat raw hi err"], r["3xtf32 kcat raw hi ms"] = err(Ar @ Br), median_ms(lambda: Ar @ Br)
    r.update(algorithms(A3, B3, err))
    # three fp16 products over scaled rows of A and columns of W, one GEMM over 3K (fp16 in, float32 out):
    # hi * hi + hi' * lo + lo * hi', the primed pieces scaled down by 2^11 (exact, but for values that
    # fall below fp16's normal range, 2^-18 of their row's or column's largest)
    Fh, Fl, ra = f16x3_pieces(A, 1)
    Gh, Gl, cb = f16x3_pieces(B, 0)
    F3 = torch.cat([Fh, (Fh.float() / 2048).half(), Fl], 1)
    G3 = torch.cat([Gh, Gl, (Gh.float() / 2048).half()], 0)
    try:
        f16 = torch.mm(F3, G3, out_dtype=torch.float32)
    except TypeError:  # (a torch without fp16 GEMMs into float32)
        return r
    r["3xfp16 kcat err"] = err(f16 * ra * cb)
    r["3xfp16 kcat ms"] = median_ms(lambda: torch.mm(F3, G3, out_dtype=torch.float32))
    r["3xfp16 kcat split bytes"] = (F3.numel() + G3.numel()) * 2
    r["3xtf32 kcat split bytes"] = (A3.numel() + B3.numel()) * 4
    return r


def algorithms(A3: torch.Tensor, B3: torch.Tensor, err) -> dict[str, float]:
    """The kcat GEMM under each algorithm cuBLASLt offers for it, in TF32."""
    try:
        from nvmath.linalg.advanced import Matmul, MatmulComputeType
    except ImportError:
        return {}
    out = {}
    with Matmul(A3, B3, options={"compute_type": MatmulComputeType.COMPUTE_32F_FAST_TF32}) as mm:
        offered = mm.plan(preferences={"limit": 64})
        times = [median_ms(lambda a=a: mm.execute(algorithm=a)) for a in offered]
        best = min(range(len(times)), key=times.__getitem__)
        out["3xtf32 kcat heuristic ms"] = times[0]
        out[f"3xtf32 kcat best of {len(times)} ms"] = times[best]
        out["3xtf32 kcat best err"] = err(mm.execute(algorithm=offered[best]))
        out["3xtf32 kcat best algorithm"] = str(offered[best].tile), str(offered[best].stages)
    return out


def main(path: str, names: list[str]) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    results = {}
    for name, shape in SHAPES.items():
        if names and not any(n in name for n in names):
            continue
        results[name] = r = measure(*shape, g)
        print(name, {k: round(v, 4) if "ms" in k else v if isinstance(v, tuple) else float(f"{v:.3g}")
                    for k, v in r.items()}, flush=True)
    with open(path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                  indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
