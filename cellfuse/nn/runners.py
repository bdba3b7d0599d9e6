"""A CellRNN's plans and executors for one set of sizes, dtype and device: made once, run every step.

A runner holds a forward Plan made with `save_steps` and its backward Plan, an executor of each, and
torch's views of their buffers (see tensor_layout). One forward run's saved steps live in the buffers
until the next forward run overwrites them; `runs` counts the forward runs, so that a backward pass can
tell whether the buffers still hold its own forward run (see cell_function).

On the CPU the numpy executor runs the plans, in float32 or float64. On a CUDA device CellFuse's CUDA
executor runs them, float32, on its own non-blocking streams, ordered after and before the work on
torch's current stream by events; the tensors are copied into and out of its device buffers by torch on
the device, never through the host.
"""

from __future__ import annotations

import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..codegen import make_plan
from ..codegen.plan import Plan
from ..gpu_runtime.auto_schedule import AUTO, choose_schedule
from ..graph_model import Cell, CellError, Sizes
from .tensor_layout import TensorLayout

log = logging.getLogger(__name__)

# The rung whose machinery every backward pass uses, and what `auto` falls back to on the GPU where the
# measured rung cannot save its steps for one.
GRAPH = "graph"
DTYPES = {"cpu": (torch.float32, torch.float64), "cuda": (torch.float32,)}


def dtype_names(device_type: str) -> str:
    return " or ".join(str(d) for d in DTYPES[device_type])


class Runner(ABC):
    """The forward and backward runs of one plan on buffers that torch sees through `layout`."""

    layout: TensorLayout

    def __init__(self, schedule: str):
        self.schedule = schedule  # the rung that runs, `auto` resolved
        self.runs = 0

    def forward(self, x: torch.Tensor, states: Sequence[torch.Tensor],
                params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        self.layout.load(x, states, params)
        self._forward()
        self.runs += 1
        return self.layout.outputs()

    def backward(self, dy: torch.Tensor, dfinals: Sequence[torch.Tensor]
                 ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The gradients for the seeds, of the last forward run."""
        self.layout.seed(dy, dfinals)
        self._backward()
        return self.layout.gradients()

    @abstractmethod
    def _forward(self) -> None:
        """Runs the forward program on the buffers as they are."""

    @abstractmethod
    def _backward(self) -> None:
        """Runs the backward program on the buffers as they are."""


class NumpyRunner(Runner):
    def __init__(self, plan: Plan, dtype: torch.dtype):
        from ..codegen.lowering import execution_order
        from ..gpu_runtime.numpy_backward import NumpyBackward
        from ..gpu_runtime.numpy_executor import NumpyExecutor

        super().__init__(plan.schedule)
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        # The weights are copied from the parameters before every run; zeros until then.
        self.executor = NumpyExecutor(plan, _zeros(plan), np_dtype)
        self.backward_pass = NumpyBackward(self.executor)  # its gradient buffers join the executor's
        self.order = list(execution_order(self.executor.program, self.executor.prefer))
        views = {name: torch.from_numpy(arr) for name, arr in self.executor.buf.items()}
        self.layout = TensorLayout(plan, self.backward_pass.plan, views)

    def _forward(self) -> None:
        for instr in self.order:
            self.executor.execute(instr)

    def _backward(self) -> None:
        for instr in self.backward_pass.instructions:
            self.executor.execute(instr)


class _DeviceSpan:
    """Float32 device memory that the CUDA executor allocated, described by the CUDA array interface, so
    that torch.as_tensor sees it as a tensor without a copy. No stream: the runner orders the work."""

    def __init__(self, address: int, elements: int):
        self.__cuda_array_interface__ = {"shape": (elements,), "typestr": "<f4", "data": (address, False),
                                         "strides": None, "stream": None, "version": 3}


class CudaRunner(Runner):
    """The CUDA executor's forward and backward runs, each between two waits: the executor's stream waits
    for what torch's current stream has queued (the tensors copied in), and torch's current stream waits
    for the executor's (before the results are copied out). Every launch of the executor's program joins
    its main stream before the program ends, so waiting for that one stream is waiting for all of them.

    The inputs, parameters and results cross between torch's tensors and the executor's buffers as
    copies on the device; the executor computing in the tensors' own memory would save them."""

    def __init__(self, plan: Plan, device: torch.device):
        from ..gpu_runtime.cuda_backward import CudaBackward
        from ..gpu_runtime.cuda_executor import CudaExecutor

        super().__init__(plan.schedule)
        self.device = device
        self.executor = CudaExecutor(plan, _zeros(plan))
        try:
            self.backward_pass = CudaBackward(self.executor)
        except BaseException:
            self.executor.close()
            raise
        # Closed when the runner is dropped from the module's cache and no backward pass holds it any more.
        weakref.finalize(self, _close, self.executor, self.backward_pass).atexit = False
        elements = {name: plan.buffer_elements(name) for name in plan.buffers}
        elements.update({name: self.backward_pass.plan.buffer_elements(name)
                         for name in self.backward_pass.plan.buffers})
        views = {name: torch.as_tensor(_DeviceSpan(self.executor.addr[name], n), device=device)
                 for name, n in elements.items()}
        self.layout = TensorLayout(plan, self.backward_pass.plan, views)
        self.stream = torch.cuda.ExternalStream(self.executor.stream.handle, device=device)

    def _on_executor_stream(self, enqueue: Callable[[], None]) -> None:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        enqueue()
        current.wait_stream(self.stream)

    def _forward(self) -> None:
        executor = self.executor
        if executor.plan.cuda_graph and executor.graph_exec is None:
            executor.capture_graph()  # captured, not run: the replay below runs it

        def run() -> None:
            executor.weights_changed()  # the parameters were just copied into its weights' buffers
            executor.forward()
        self._on_executor_stream(run)

    def _backward(self) -> None:
        if self.executor.plan.cuda_graph and self.backward_pass.graph_exec is None:
            self.backward_pass.capture_graph()  # captured, not run: the replay below runs it
        self._on_executor_stream(self.backward_pass.enqueue)


def _close(executor, backward) -> None:
    backward.close()
    executor.close()


def _zeros(plan: Plan) -> dict[str, np.ndarray]:
    return {key: np.zeros(shape, np.float32) for key, shape in plan.params.items()}


def make_runner(cell: Cell, sizes: Sizes, schedule: str, dtype: torch.dtype, device: torch.device) -> Runner:
    """The runner of `schedule` (or of the rung `auto` stands for here) at these sizes, dtype and device."""
    if device.type == "cpu":
        if schedule == AUTO:
            schedule = choose_schedule(cell, sizes, "numpy").schedule
        return NumpyRunner(make_plan(cell, sizes, schedule, save_steps=True), dtype)
    from ..gpu_runtime.cuda_executor import device_target, gpu_modules

    drv = gpu_modules()[0]  # or GpuUnavailable, saying what is missing
    if drv.Context.get_device() != drv.Device(device.index):
        raise CellError(f"the tensors are on {device}, but CellFuse's CUDA executor runs on the device of "
                        f"PyCUDA's context, {drv.Context.get_device().name()}: set CUDA_DEVICE to the "
                        "tensors' device index before the process first uses the GPU through CellFuse")
    if schedule != AUTO:
        return CudaRunner(make_plan(cell, sizes, schedule, device_target(), save_steps=True), device)
    choice = choose_schedule(cell, sizes, "cuda")
    log.info("%s", choice.why)
    try:
        return CudaRunner(make_plan(cell, sizes, choice.schedule, device_target(), save_steps=True), device)
    except CellError as e:
        if choice.schedule == GRAPH:
            raise
        # The rung measured fastest forward may not fit on chip with its steps saved for the backward pass.
        log.info("auto: '%s' cannot run with its steps saved (%s); running '%s'", choice.schedule, e, GRAPH)
        return CudaRunner(make_plan(cell, sizes, GRAPH, device_target(), save_steps=True), device)
