"""Where the executor offers the warpgroup GEMM's route at all (no GPU needed: the rule alone)."""

from __future__ import annotations

from dataclasses import replace

from cellfuse.gpu_runtime.wgmma_gemms import Operands, usable


def test_the_route_is_taken_only_where_the_kernel_can_run_here():
    op = Operands(c=256, x=256, w=256, pieces=256, m=6400, n=512, k=512, lda=512, ldw=512, ldc=512,
                  trans_w=False, accumulate=False)
    assert usable((9, 0), op)
    assert not usable((8, 0), op) and not usable((10, 0), op)  # no sm_90a instructions there
    assert not usable((9, 0), replace(op, x=260))  # x's rows not on 16 bytes
    assert not usable((9, 0), replace(op, lda=514))
    assert not usable((9, 0), replace(op, c=260))  # C's pairs not on 8 bytes
    assert not usable((9, 0), replace(op, ldc=513))
    assert not usable((9, 0), replace(op, m=0))
    assert usable((9, 0), replace(op, m=65535 * 128)) and not usable((9, 0), replace(op, m=65535 * 128 + 1))
    # rows of a batch with lengths: blocks of 8 steps of 16 rows, a taller grid than 128 rows a block
    # where the steps are not a multiple of 8 (T=2047, B=4096: 65504 blocks of rows, or 65536)
    tall = replace(op, m=2047 * 4096)
    assert usable((9, 0), tall) and not usable((9, 0), tall, 4096)
    assert not usable((9, 0), replace(tall, lengths=256, lengths_ld=512, batch=4096))
    assert usable((9, 0), replace(op, lengths=256, lengths_ld=512, batch=64))


def test_the_forward_keeps_what_its_gemms_on_tensor_cores_make_of_each_weight():
    """IndRNN's input GEMM (W a weight, 6400 x 512 x 512) and the LSTM's (6400 x 2048 x 512) get a place
    for W's region of the split copies (its fp16 copies, column maxima and their range) and, on a GPU
    where the warpgroup GEMM may run, for its image of W (hi and lo floats), kept between forward passes;
    under `graph` (the input GEMM in chunks of 640 rows, the recurrent one of 64 rows a step: CUDA cores)
    and where W is not a weight, none is."""
    from cellfuse.codegen import make_plan
    from cellfuse.codegen.lowering import lower
    from cellfuse.gpu_runtime.cuda_executor import image_bytes
    from cellfuse.graph_model import Sizes, load_template

    def images(name, schedule, batch, weights=None, wgmma=True):
        plan = make_plan(load_template(name), Sizes(100, batch, 512, 512), schedule)
        weights = weights if weights is not None else {n for n, b in plan.buffers.items()
                                                       if b.role in ("weight", "stacked", "bias")}
        return image_bytes(lower(plan).instructions, weights, wgmma)

    found = images("indrnn", "persistent", 64)
    ((w, n, k, trans_w),) = {key for key, _ in found}
    assert (n, k, trans_w) == (512, 512, False)
    # (W's copies, then its column maxima and their range of 4 words, from 256 bytes)
    assert found == {((w, n, k, trans_w), "copies"): 2 * 3 * 512 * 512 + 4 * 512 + 256,
                     ((w, n, k, trans_w), "wgmma"): 4 * 2 * 512 * 512}
    assert list(images("indrnn", "persistent", 64, wgmma=False)) == [((w, n, k, trans_w), "copies")]
    assert images("indrnn", "persistent", 64, weights=set()) == {}
    assert [(key[1:], route) for key, route in images("lstm", "persistent", 64)] == [
        ((2048, 512, False), "copies"), ((2048, 512, False), "wgmma")]
    assert images("lstm", "graph", 64) == {}
