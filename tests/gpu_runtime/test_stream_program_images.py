"""Where a StreamProgram puts the kernels that make W's images for its warpgroup GEMMs, on stand-ins for
the driver and cuBLAS: in the image list that `weights_changed` runs on the caller's stream whenever the
weights change, before any run reads them (a run's side streams start after what its caller's stream
holds), never in the run's own list. There nothing orders an image before the GEMMs on other streams that
read it: a two-layer `wavefront` or `graph` module's first call at B=256 read layer 1's image before it
was made, and a second module's first call over new weights read zeros
(docs/results/2026-11-30-widest-chunks-and-a-first-call-bug.md)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from cellfuse.codegen import kernel_set
from cellfuse.codegen.lowering import lower
from cellfuse.codegen.scheduler import make_plan
from cellfuse.gpu_runtime import driver, stream_program
from cellfuse.gpu_runtime.launch_list import LaunchList
from cellfuse.graph_model import Sizes, load_template

IMAGE = "cf_wgmma_image"


class Resources:
    """_Resources without a GPU: kernels and handles are numbers."""

    def __init__(self, kernels, arch, capability, streams, what, lane, sm_target=0):
        self.capability, self.name_of, self.sm_target = capability, kernels.name_of, sm_target
        self.module = SimpleNamespace(handle=1)
        self.handles = list(range(100, 100 + streams))
        self.scalars = np.array([1.0, 0.0], np.float32)
        self._numbers = itertools.count(1000)

    def point(self, s, stream):
        pass

    def function(self, name):
        return next(self._numbers)

    def wgmma_functions(self):
        return 7, 8


@pytest.fixture
def stand_ins(monkeypatch):
    numbers = itertools.count(5000)
    monkeypatch.setattr(stream_program, "_Resources", Resources)
    monkeypatch.setattr(stream_program, "route_choice", lambda *args: "wgmma")  # as measured at B=256
    monkeypatch.setattr(driver, "new_stream", lambda: next(numbers))
    monkeypatch.setattr(driver, "new_event", lambda: next(numbers))
    cu = SimpleNamespace(cuFuncSetAttribute=lambda *args: (0,),
                         CUfunction_attribute=SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8))
    monkeypatch.setattr(driver, "bindings", lambda: cu)
    monkeypatch.setattr(LaunchList, "finish", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(LaunchList, "bind", lambda self, *args, **kwargs: None)


@pytest.mark.parametrize("schedule", ["wavefront", "graph"])
def test_w_images_are_made_when_the_weights_change_not_inside_a_run(stand_ins, schedule):
    plan = make_plan(load_template("lstm"), Sizes(100, 256, 512, 512, 2), schedule)
    program = lower(plan)
    made = stream_program.StreamProgram(plan, program.instructions, kernel_set.plan_kernels(plan), "sm_90a",
                                        (9, 0), 132, "the test's kernels", 0, program.sharing)
    assert len(made.images) == 2  # each layer's input weights, read by its hoisted GEMMs
    assert made._image_calls.names == [IMAGE, IMAGE]
    assert IMAGE not in made.names and made.names.count("cf_wgmma_gemm of gemm0") >= 2


@pytest.mark.parametrize("schedule", ["wavefront", "graph"])
def test_w_copies_are_made_when_the_weights_change_not_inside_a_run(stand_ins, monkeypatch, schedule):
    """Where the split copies run a GEMM of a weight, W's copies and column maxima (its region) are made
    with the images, once per layer's weights however many GEMMs read them; a run measures and splits x
    alone, its fp16 GEMMs reading alpha and beta from device memory (where x's split writes them), and
    its scratch has no room for W's region."""
    from cellfuse.codegen.gemm_routes import f16x3_layout
    from cellfuse.gpu_runtime.launch_list import GEMM_EX_DEVICE

    monkeypatch.setattr(stream_program, "route_choice", lambda *args: "copies")
    plan = make_plan(load_template("lstm"), Sizes(100, 256, 512, 512, 2), schedule)
    program = lower(plan)
    made = stream_program.StreamProgram(plan, program.instructions, kernel_set.plan_kernels(plan), "sm_90a",
                                        (9, 0), 132, "the test's kernels", 0, program.sharing)
    assert sorted(made.images) == [stream_program.pieces_name(w, False) for w in ("l0.gemm0.w", "l1.gemm0.w")]
    layouts = [f16x3_layout(i.launch, i.rows, i.launch.k) for i in stream_program._flat(program.instructions)
               if getattr(i, "route", "").startswith("f16x3")]
    assert layouts and max(made.scratch.values()) == max(int(lay.kept_at) for lay in layouts)
    assert made.images[stream_program.pieces_name("l0.gemm0.w", False)] == int(layouts[0].kept_bytes)
    assert made._image_calls.names.count("cf_f16x3_maxima") == 2
    assert made._image_calls.names.count("cf_split_f16x3_copies") == 2
    gemms = made.names.count("cuBLAS's fp16 GEMM of gemm0")
    assert gemms >= 2 and made.names.count("cf_split_f16x3_copies") == gemms  # x's, not W's
    assert made.names.count("cf_f16x3_row_maxima") == gemms
    assert "cf_f16x3_maxima" not in made.names
    kinds = [op[0] for op, name in zip(made.calls._ops, made.calls.names, strict=True)
             if name == "cuBLAS's fp16 GEMM of gemm0"]
    assert kinds == [GEMM_EX_DEVICE] * gemms


def test_a_backward_program_keeps_w_transposed_and_splits_the_gradients_every_run(stand_ins, monkeypatch):
    """A backward program (the train plan's buffers, the backward plan's instructions, as cellfuse.nn
    makes it): its input gradient's GEMM reads the weights transposed, a region of their own made with
    the images; the weights' gradients multiply by the gates' gradient, not a weight, split at every run,
    once for both (lowering.w_regions_shared)."""
    from cellfuse.codegen.backward_plan import backward_plan

    monkeypatch.setattr(stream_program, "route_choice", lambda *args: "copies")
    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "graph", save_steps=True)
    backward = backward_plan(plan)
    made = stream_program.StreamProgram(plan, backward.instructions(), kernel_set.backward_kernels(backward),
                                        "sm_90a", (9, 0), 132, "the test's backward kernels")
    assert sorted(made.images) == [stream_program.pieces_name("l0.gemm0.w", True)]
    assert made._image_calls.names.count("cf_split_f16x3_copies") == 1
    gemms = sum(name.startswith("cuBLAS's fp16 GEMM") for name in made.names)
    # each GEMM's A, and W for the two weights' gradients: the gates' gradient once
    assert gemms == 3 and made.names.count("cf_split_f16x3_copies") == 4
    assert made.names.count("cf_f16x3_maxima") == 3  # dx's A finds its own; x^T, h^T, the gates' gradient
    shared = [i for i in backward.instructions() if getattr(i, "w_made_at", None) is not None]
    assert [i.launch.group for i in shared] == ["gemm1 dW"]


@pytest.mark.parametrize("route", ["copies", "wgmma"])
@pytest.mark.parametrize("cell, schedule, batch, layers",
                         [("lstm", "tensor", 64, 1), ("gru", "wavefront", 256, 2)])
def test_the_runners_memory_holds_each_programs_scratch_and_no_room_for_kept_weights(
        stand_ins, monkeypatch, route, cell, schedule, batch, layers):
    """cellfuse.nn's runner reserves each stream's scratch as split_bytes counts it: exactly what the
    forward and backward programs ask for where they split copies, W's region left out where they keep it
    among their images."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.nn.cuda_runner import Memory

    monkeypatch.setattr(stream_program, "route_choice", lambda *args: route)
    monkeypatch.setattr(driver, "resident_blocks", lambda *args: 1)
    plan = make_plan(load_template(cell), Sizes(100, batch, 512, 512, layers), schedule, save_steps=True)
    backward = backward_plan(plan)
    memory = Memory(plan, backward)
    program = lower(plan)
    forward = stream_program.StreamProgram(plan, program.instructions, kernel_set.plan_kernels(plan),
                                           "sm_90a", (9, 0), 132, "the test's kernels", 0, program.sharing)
    back = stream_program.StreamProgram(plan, backward.instructions(), kernel_set.backward_kernels(backward),
                                        "sm_90a", (9, 0), 132, "the test's backward kernels")
    for made, have in ((forward, memory.scratch), (back, memory.grad_scratch)):
        assert all(nbytes <= have.get(name, 0) for name, nbytes in made.scratch.items())
        if route == "copies":
            assert made.scratch == have
