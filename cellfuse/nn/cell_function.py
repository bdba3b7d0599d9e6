"""The whole forward pass of a cell, every step of every layer, as one torch.autograd.Function: its forward
runs the forward Plan, its backward runs the backward Plan on what the forward run saved.

A runner's buffers hold the steps of its last forward run only. Where another forward run on the same
runner came between a forward run and its backward pass (two calls of the module before one backward, or
gradcheck's finite differences before its backward passes), the backward pass first runs its forward
again from the inputs it kept, then goes on: the gradients are the same, at the cost of one forward run.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .runners import Runner


class CellFunction(torch.autograd.Function):
    """apply(runner, x, *initial_states, *params) -> (y, *final_states); the states in the order of
    `runner.layout.state_ids`, the parameters in the order of `runner.layout.keys`."""

    @staticmethod
    def forward(ctx, runner: Runner, x: torch.Tensor, *tensors: torch.Tensor):
        states = len(runner.layout.state_ids)
        y, finals = runner.forward(x, tensors[:states], tensors[states:])
        ctx.runner, ctx.run = runner, runner.runs
        ctx.save_for_backward(x, *tensors)
        return (y, *finals)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor, *dfinals: torch.Tensor):
        runner: Runner = ctx.runner
        x, *tensors = ctx.saved_tensors
        states = len(runner.layout.state_ids)
        if runner.runs != ctx.run:  # the buffers hold another forward run's steps: this one's again
            runner.forward(x, tensors[:states], tensors[states:])
            ctx.run = runner.runs
        dx, dinitial, dparams = runner.backward(dy, dfinals)
        return (None, dx, *dinitial, *dparams)
