"""A CellRNN's plans for one set of sizes, dtype and device, and the runner that executes them: made once,
run by every call of the module's custom ops (see ops).

A runner's `forward` takes the module's tensors and returns new ones: y, the final states and, where the
steps are saved for a backward pass, a `reserve` (a uint8 tensor, as cuDNN's reserve space) that holds
them; `backward` takes the reserve back. So any number of forward calls can wait for their backward
passes, and autograd holds what each one needs.

On the CPU the numpy executor runs the plans, in float32 or float64, in its own buffers: the reserve is
a copy of them. On a CUDA device, see cuda_runner: the kernels compute in torch's tensors, on torch's
current stream.

Inputs of bfloat16 or float16 run the plans of that precision (codegen.precision; emulated in float32 on
the CPU), forward and backward: the backward pass's gradients are float32 (see codegen.backward_plan), and
the ops give x's and the initial states' back in their dtypes.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from ..codegen import make_plan
from ..codegen.backward_plan import BackwardPlan, backward_plan
from ..codegen.plan import H100, Plan, Target
from ..graph_model import Cell, CellError, Sizes
from .tensor_layout import TensorLayout

log = logging.getLogger(__name__)

# The rung whose machinery every backward pass uses, and what `auto` falls back to on the GPU where the
# measured rung cannot save its steps for one.
GRAPH = "graph"
DTYPES = {"cpu": (torch.float32, torch.float64, torch.bfloat16, torch.float16),
          "cuda": (torch.float32, torch.bfloat16, torch.float16)}
# the precision of the plans that inputs of each dtype run (float32's, and float64's on the CPU: fp32)
PRECISIONS = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# the torch dtype of each storage type of codegen.dtypes, by name
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# A call's `direction`, which is also its runner's lane: which direction of a layer it runs, and whether
# beside the other direction's run (side by side on two streams: its persistent kernels then take half of
# the SMs, so that both directions' kernels are resident at once) or alone on the GPU.
FORWARD, REVERSE, FORWARD_BESIDE, REVERSE_BESIDE = range(4)


def direction_of(reverse: bool, beside: bool) -> int:
    return (FORWARD_BESIDE if beside else FORWARD) + int(reverse)


def dtype_names(device_type: str) -> str:
    return ", ".join(str(d) for d in DTYPES[device_type])


def precision_of(dtype: torch.dtype) -> str:
    return PRECISIONS.get(dtype, "fp32")


def param_dtypes(x: torch.dtype) -> tuple[torch.dtype, ...]:
    """The dtypes of parameters that run with inputs of dtype `x`: x's, and float32 with 16-bit inputs (as
    under torch.autocast: they are packed into 16-bit weights)."""
    return (x, torch.float32) if x in PRECISIONS else (x,)


@dataclass(frozen=True)
class Plans:
    """The plans of one set of sizes on one kind of device: `forward` runs without a backward pass to
    follow (the rung `cellfuse bench` times), `train` saves its steps for `backward`."""

    forward: Plan
    train: Plan
    backward: BackwardPlan

    @property
    def schedule(self) -> str:
        return self.forward.schedule

    @cached_property
    def layout(self) -> TensorLayout:
        return TensorLayout(self.train, self.backward)


def device_target(device: torch.device, share: int = 1) -> Target:
    """A GPU's numbers for a persistent plan; with `share` runs side by side, its part of the SMs, so that
    the persistent kernels of all of them are resident at once."""
    props = torch.cuda.get_device_properties(device)
    return Target(props.multi_processor_count // share, props.shared_memory_per_block_optin)


def make_plans(cell: Cell, sizes: Sizes, schedule: str, device: torch.device, share: int = 1,
               precision: str = "fp32", float32_states: Collection[str] | None = None) -> Plans:
    """The plans of the rung `schedule` (not `auto`: ops.plans resolves it) at these sizes on the device,
    for one of `share` runs side by side on it, in `precision` (a 16-bit plan keeping `float32_states` in
    float32; None: those that accumulate)."""
    target = device_target(device, share) if device.type == "cuda" else H100

    def plan(rung: str, save: bool) -> Plan:
        return make_plan(cell, sizes, rung, target, save_steps=save, precision=precision,
                         float32_states=float32_states)

    if device.type == "cpu":
        # the numpy executor runs the plan that saves its steps, with a backward pass to follow or not
        train = plan(schedule, True)
        return Plans(train, train, backward_plan(train))
    forward = plan(schedule, False)
    try:
        train = plan(schedule, True)
        backward = backward_plan(train)
    except CellError as e:
        if schedule == GRAPH:
            raise
        # The rung measured fastest forward may not fit on chip with its steps saved for the backward pass.
        log.info("'%s' cannot run with its steps saved (%s); training runs '%s'", schedule, e, GRAPH)
        train = plan(GRAPH, True)
        backward = backward_plan(train)
    return Plans(forward, train, backward)


class Runner(ABC):
    """The forward and backward runs of one set of plans."""

    def __init__(self, plans: Plans):
        self.plans = plans
        self.schedule = plans.schedule
        self.layout = plans.layout
        # held by a caller for a whole run: a runner's buffers (the numpy executor's, the GPU's packed
        # weights and replay memory) are one run's at a time
        self.lock = threading.Lock()

    @abstractmethod
    def forward(self, x: torch.Tensor, states: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                save: bool, shared: bool = False) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """y [T, B, hidden], the final states [L, B, hidden] (in the order of `layout.state_ids`) and the
        reserve: the saved steps where `save`, else empty. Where `shared` and not `save`, the outputs may
        be views of one tensor."""

    @abstractmethod
    def backward(self, dy: torch.Tensor, dfinals: Sequence[torch.Tensor], x: torch.Tensor,
                 states: Sequence[torch.Tensor], params: Sequence[torch.Tensor], y: torch.Tensor,
                 reserve: torch.Tensor, input_grad: bool = True
                 ) -> tuple[torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """The gradients of x (None unless `input_grad`), of the initial states and of the parameters
        (grouped: see TensorLayout.gradients), for the seeds dy and dfinals, of the forward run that
        returned y and the reserve."""


class NumpyRunner(Runner):
    """The numpy executor in its own buffers; a reserve is a copy of all of them."""

    def __init__(self, plans: Plans, dtype: torch.dtype):
        from ..codegen.lowering import execution_order
        from ..gpu_runtime.numpy_backward import NumpyBackward
        from ..gpu_runtime.numpy_executor import NumpyExecutor

        super().__init__(plans)
        plan = plans.train
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        zeros = {key: np.zeros(shape, np.float32) for key, shape in plan.params.items()}
        self.executor = NumpyExecutor(plan, zeros, np_dtype)
        # its gradient buffers join the executor's
        self.backward_pass = NumpyBackward(self.executor)
        # the weight buffers stored in 16 bits, rounded as the parameters are packed into them
        self.rounded = [name for name in self.layout.weight_buffers if name in self.executor.rounded]
        self.order = list(execution_order(self.executor.program, self.executor.prefer))
        self.views = {name: torch.from_numpy(arr) for name, arr in self.executor.buf.items()}
        self.saved = list(plan.buffers)  # the forward buffers, in the order a reserve holds them

    def forward(self, x, states, params, save, shared=False):
        views, plan = self.views, self.plans.train
        views["x"].copy_(x.reshape(-1))
        for state, value in zip(plan.state_ids, states, strict=True):
            views[f"init.{state}"].copy_(value.reshape(-1))
        self.layout.pack(views, params)
        for name in self.rounded:
            views[name].copy_(torch.from_numpy(self.executor.round(name, self.executor.buf[name])))
        for instr in self.order:
            self.executor.execute(instr)
        s = plan.sizes
        T, B, H, L = s.seq, s.batch, s.hidden, s.layers
        # (the 16-bit values, emulated in float32, in the caller's dtypes: exactly)
        y = views[plan.layers[-1].output_seq][B * H:].view(T, B, H).to(x.dtype, copy=True)
        finals = [views[f"final.{state}"].view(L, B, H).to(value.dtype, copy=True)
                  for state, value in zip(plan.state_ids, states, strict=True)]
        reserve = (torch.cat([views[name] for name in self.saved]).view(torch.uint8) if save
                   else torch.empty(0, dtype=torch.uint8))
        return y, finals, reserve

    def backward(self, dy, dfinals, x, states, params, y, reserve, input_grad=True):
        views = self.views
        at = 0
        saved = reserve.view(views["x"].dtype)
        for name in self.saved:  # the forward run's buffers back, then the gradients' start values
            n = views[name].numel()
            views[name].copy_(saved[at:at + n])
            at += n
        backward = self.plans.backward
        for name in backward.buffers:
            views[name].fill_(backward.start_value(name))
        self.layout.seed(views, dy, dfinals)
        for instr in self.backward_pass.instructions:
            self.executor.execute(instr)
        return self.layout.gradients(views, input_grad)
