"""Where the CUDA executor puts its buffers in its one allocation (no GPU needed)."""

from cellfuse.gpu_runtime.cuda_executor import ALIGNMENT, aligned_offsets


def test_each_buffer_starts_at_an_alignment_boundary_after_the_one_before():
    nbytes = [4, 256, 0, 12, 260]
    offsets, span = aligned_offsets(nbytes)
    assert offsets == [0, 256, 512, 512, 768] and span == 768 + 512
    assert all(o % ALIGNMENT == 0 for o in offsets)
    for (o, n), nxt in zip(zip(offsets, nbytes, strict=True), [*offsets[1:], span], strict=True):
        assert o + n <= nxt  # no two overlap
