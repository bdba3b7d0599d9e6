"""The host side of the CUDA runner on CPU tensors (a runner made without a GPU, its memory's layout and
its conversions alone): where a forward run without saved steps finds y and the final states in its one
piece of memory, and which initial states it converts once. The GPU runs are tests/nn's gpu tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cellfuse.nn.cuda_runner import CudaRunner
from cellfuse.nn.zeros import Zeros

T, B, H, L = 5, 3, 4, 2


def runner(y_dtype: torch.dtype, states: int) -> CudaRunner:
    made = object.__new__(CudaRunner)
    made._sizes, made._y_dtype, made._state_dtypes = (T, B, H, L), y_dtype, [y_dtype] * states
    made.infer_memory = SimpleNamespace(reserve_bytes=1000)
    made._zeros = Zeros()
    made._inference_layout()
    return made


@pytest.mark.parametrize("stored, given", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16)])
def test_y_and_the_final_states_are_found_where_the_run_wrote_them(stored, given):
    """y after the initial states' row, each final state 256-byte aligned after it, then the scratch; in
    x's dtype, converted in one piece where the plan stores them in another."""
    r = runner(stored, states=2)
    block = torch.arange(r._block_elements, dtype=stored)
    y, finals = r._inference_outputs(block, given)
    assert y.dtype == given and all(f.dtype == given for f in finals)
    torch.testing.assert_close(y.reshape(-1), block[B * H:(T + 1) * B * H].to(given))
    for at, final in zip(r._finals_at, finals, strict=True):
        assert at * stored.itemsize % 256 == 0
        torch.testing.assert_close(final.reshape(-1), block[at:at + L * B * H].to(given))
    assert r._finals_at[0] >= (T + 1) * B * H and r._finals_at[1] >= r._finals_at[0] + L * B * H
    assert r._block_elements * stored.itemsize >= r._outputs_end * stored.itemsize + 1000


def test_only_a_modules_kept_zeros_are_converted_once(monkeypatch):
    """Any other initial state is converted at every call: a CUDA graph's replay writes its tensors
    without their versions telling, and inference tensors keep no version."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    r = runner(torch.float32, states=1)
    zeros = Zeros()((L, B, H), torch.bfloat16, torch.device("cpu"))
    assert r._state_in(zeros, torch.float32) is r._state_in(zeros, torch.float32)
    given = torch.zeros(L, B, H, dtype=torch.bfloat16)
    first = r._state_in(given, torch.float32)
    given.data.fill_(2.0)  # (a write no version counter sees)
    assert float(r._state_in(given, torch.float32).max()) == 2.0 and float(first.max()) == 0.0
    with torch.inference_mode():
        inference = torch.ones(L, B, H, dtype=torch.bfloat16)
        assert r._state_in(inference, torch.float32).dtype == torch.float32
