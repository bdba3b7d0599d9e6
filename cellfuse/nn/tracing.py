"""Whether a call is traced into a graph rather than run: by torch.compile or torch.export (the compiler's
tracing), or by torch.jit.trace. A traced call goes through the custom ops, so that the graph holds
`cellfuse::rnn` (and a trace saved with torch.jit.save runs again wherever cellfuse is imported), with
views of the parameters and zeros of its own, and leaves nothing kept for the calls after it: a kept
call or a lane would go around the ops, and under torch.jit.trace the sizes are tensors. What cannot hold
the modules, ONNX's exporter, TorchScript's compiler and torch.func's transforms, is refused here by
name."""

from __future__ import annotations

import torch

from ..graph_model import CellError


def traced() -> bool:
    """Whether the call now running is traced (see the module's docstring)."""
    # (torch._C's test, a tenth of a microsecond less than torch.jit's, after the compiler's: torch.compile
    # cannot trace it, and never reaches it)
    return torch.compiler.is_compiling() or torch._C._is_tracing()


def traced_call(module: str) -> bool:
    """traced(), asked by a module's forward pass, which first refuses what cannot hold it (`module`
    names it in the message): a transform of torch.func, whose tensors are wrappers with no memory of
    their own (the kernels cannot read them, and its checks refuse the runner's writes into the buffers
    it keeps), and, of traced calls, torch.onnx.export's (ONNX has no operator for cellfuse::rnn; the
    cheap test first: torch.onnx's costs microseconds a call)."""
    if torch._C._are_functorch_transforms_active():
        raise CellError(f"a {module} cannot run under a transform of torch.func (grad, vmap, jacrev, ...): "
                        "take gradients with torch.autograd (torch.func.functional_call with other "
                        "parameters works)")
    if not traced():
        return False
    if torch.jit.is_tracing() and torch.onnx.is_in_onnx_export():
        raise CellError(f"a {module} cannot be exported to ONNX: its forward pass is the custom op "
                        "cellfuse::rnn, which ONNX has no operator for (torch.export.export keeps it)")
    return True


def refuse_script(module: str) -> None:
    """Raises for torch.jit.script (a module's `__prepare_scriptable__`): TorchScript cannot compile the
    module's Python (its kept calls, lanes and plans); `module` names the module in the message."""
    raise CellError(f"a {module} cannot be compiled by torch.jit.script, which cannot read the module's "
                    "Python: torch.jit.trace it (its trace records the op cellfuse::rnn), or use "
                    "torch.compile or torch.export.export")

