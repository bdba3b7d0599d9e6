"""Executes a Plan with numpy: the same buffers, stacked weights, launches and addresses as the CUDA
executor, so that a scheduling bug shows on a machine without a GPU too."""

from __future__ import annotations

import numpy as np

from ..codegen.plan import Access, GemmLaunch, Launch, Plan
from ..graph_model import Forward
from ..graph_model.ops import OPS


class NumpyExecutor:
    def __init__(self, plan: Plan, params: dict[str, np.ndarray], dtype=np.float32):
        self.plan, self.dtype = plan, np.dtype(dtype)
        self.batch = plan.sizes.batch
        # Every buffer starts as NaN, so that a launch that reads what nothing wrote shows in the output.
        self.buf = {name: np.full(plan.buffer_elements(name), np.nan, self.dtype) for name in plan.buffers}
        self.buf.update(plan.weight_arrays(params, self.dtype))
        self.nodes = plan.cell.by_id()

    def view(self, acc: Access, t: int, rows: int, width: int) -> np.ndarray:
        flat = self.buf[acc.buffer]
        start = acc.offset(t, self.batch)
        if acc.kind == "scalar":
            return flat[start:start + 1]
        if acc.kind == "vec":
            return flat[start:start + width]
        end = start + (rows - 1) * acc.ld + width
        if end > flat.size:
            raise IndexError(f"access {acc} at step {t} runs past buffer '{acc.buffer}'")
        size = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[start:end], (rows, width), (acc.ld * size, size))

    def launch(self, launch: Launch, t: int) -> None:
        if isinstance(launch, GemmLaunch):
            a = self.view(launch.a, t, launch.m, launch.k)
            w = self.buf[launch.w].reshape(launch.k, launch.n)
            c = self.view(launch.c, t, launch.m, launch.n)
            c[...] = a @ w
            if launch.bias:
                c += self.buf[launch.bias]
            return
        values: dict[str, np.ndarray] = {v: self.view(acc, t, launch.rows, launch.width)
                                         for v, acc in launch.inputs}
        with np.errstate(all="ignore"):  # a NaN or infinity is reported where the output is checked
            for nid in self.plan.island(launch.island).nodes:
                n = self.nodes[nid]
                args = [values[a] if a in values else self.dtype.type(self.nodes[a].value) for a in n.args]
                values[nid] = OPS[n.op].numpy(*args).astype(self.dtype, copy=False)
        for v, acc in launch.outputs:
            dst = self.view(acc, t, launch.rows, launch.width)
            dst[...] = np.broadcast_to(values[v], dst.shape) if values[v].ndim else values[v]

    def run(self, x: np.ndarray, initial: dict[str, np.ndarray]) -> Forward:
        plan, (T, B, H) = self.plan, (self.plan.sizes.seq, self.batch, self.plan.sizes.hidden)
        self.buf["x"][:] = x.astype(self.dtype).reshape(-1)
        final: dict[str, list[np.ndarray]] = {s: [] for s in plan.cell.updates}
        for lp in plan.layers:
            for s, acc in lp.state_read.items():
                self.view(acc, 0, B, H)[...] = initial[s][lp.layer]
            for launch in lp.prologue:
                self.launch(launch, 0)
            for t in range(T):
                for launch in lp.step:
                    self.launch(launch, t)
            for s, acc in lp.state_read.items():
                final[s].append(self.view(acc, T, B, H).copy())
        y = self.buf[plan.layers[-1].output_seq][B * H:].reshape(T, B, H)
        return Forward(y.astype(np.float32), {s: np.stack(v).astype(np.float32) for s, v in final.items()})
