"""A kernel with a thread per element of segments laid end to end, the grid striding over all of them,
each segment's elements handled by statements of its own: the CUDA runner's one-launch copies
(pack_kernel, gradient_gather) are such kernels."""

from __future__ import annotations

from collections.abc import Sequence


def segment_kernel(head: str, segments: Sequence[tuple[int, str, Sequence[str]]],
                   before: Sequence[str] = ()) -> str:
    """The kernel declared by `head` (up to its body's brace), over `segments`: each (its elements, the
    declarations that follow `k`, the element's index in the segment, in its `const long long` line, and
    its statements); `before`: the body's lines before the segments' loop (where there are no segments,
    the whole body)."""
    lines = [f"{head} {{", *before]
    if not segments:
        return "\n".join([*lines, "}", ""])
    total = sum(n for n, _, _ in segments)
    lines += ["    const long long stride = (long long)gridDim.x * blockDim.x;",
              f"    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < {total}LL; "
              "e += stride) {"]
    start = 0
    for i, (n, place, statements) in enumerate(segments):
        lines += [f"        {'if' if i == 0 else '} else if'} (e < {start + n}LL) {{",
                  f"            const long long k = e - {start}LL, {place};",
                  *(f"            {s}" for s in statements)]
        start += n
    lines += ["        }", "    }", "}", ""]
    return "\n".join(lines)
