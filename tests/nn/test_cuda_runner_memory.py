"""The host side of the CUDA runner on CPU tensors (a runner made without a GPU, its memory's layout and
its conversions alone): where a forward run without saved steps finds y and the final states in its one
piece of memory, and which initial states it converts once. The GPU runs are tests/nn's gpu tests."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from cellfuse.nn import cuda_runner
from cellfuse.nn.cuda_runner import CudaRunner
from cellfuse.nn.zeros import Zeros, made_here

T, B, H, L = 5, 3, 4, 2


def runner(y_dtype: torch.dtype, states: int) -> CudaRunner:
    made = object.__new__(CudaRunner)
    made._sizes, made._y_dtype, made._state_dtypes = (T, B, H, L), y_dtype, [y_dtype] * states
    made.infer_memory = SimpleNamespace(reserve_bytes=1000)
    made._zeros = Zeros()
    made.lock = threading.Lock()
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


class _Program:
    """A program's capture and replay as _Replay uses them, recorded."""

    def __init__(self):
        self.captured, self.released, self.replayed = [], [], []

    def capture(self, bases):
        self.captured.append(bases[1])
        return f"graph of {bases[1]}"

    def replay(self, graph, stream):
        self.replayed.append(graph)

    def release(self, graph):
        self.released.append(graph)


def _replay(monkeypatch, home: dict):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    r = runner(torch.float32, states=2)
    r.index = 0
    return cuda_runner._Replay(r, _Program(), torch.zeros(T, B, 3), (home, "forward"))


def test_a_replay_captures_per_packing_and_only_the_last_ones_keep_their_memory(monkeypatch):
    """One graph per address of packed weights (the last MAX_PACKINGS); the process's last MAX_REPLAYS
    replays to run keep their memory, an older one leaves its runner, its graphs released."""
    monkeypatch.setattr(cuda_runner, "_live", type(cuda_runner._live)())
    homes = [{} for _ in range(cuda_runner.MAX_REPLAYS + 1)]
    replays = [_replay(monkeypatch, home) for home in homes[:2]]
    x, states = torch.ones(T, B, 3), [torch.ones(L, B, H)] * 2
    first = replays[0]
    for packed in [100, 200, 100, *range(1000, 1000 + cuda_runner.MAX_PACKINGS)]:
        y, finals = first.run(x, states, packed, 7)
        assert y.shape == (T, B, H) and len(finals) == 2
        assert y.data_ptr() != first.y.data_ptr()  # a tensor of its own
    assert first.program.captured == [100, 200, *range(1000, 1000 + cuda_runner.MAX_PACKINGS)]
    assert first.program.released == ["graph of 200", "graph of 100"]  # 100 ran again after 200
    torch.testing.assert_close(first.x, x)
    replays += [_replay(monkeypatch, home) for home in homes[2:-1]]
    replays[1].run(x, states, 5, 7)  # run last of all: kept
    newest = _replay(monkeypatch, homes[-1])
    assert "forward" not in homes[0] and first.graphs == {}  # the least recently run, dropped
    kept = [*replays[1:], newest]
    assert all(home["forward"] is replay for home, replay in zip(homes[1:], kept, strict=True))
    replays[1].drop()
    assert "forward" not in homes[1] and id(replays[1]) not in cuda_runner._live


def test_a_replay_that_another_thread_runs_is_not_dropped(monkeypatch):
    """Past MAX_REPLAYS, the least recently run replay whose runner no thread holds goes: one whose runner
    another thread is running (its lock held) keeps its memory and its graphs."""
    monkeypatch.setattr(cuda_runner, "_live", type(cuda_runner._live)())
    homes = [{} for _ in range(cuda_runner.MAX_REPLAYS + 1)]
    replays = [_replay(monkeypatch, home) for home in homes[:-1]]
    x, states = torch.ones(T, B, 3), [torch.ones(L, B, H)] * 2
    replays[0].run(x, states, 100, 7)
    for replay in replays[1:]:
        replay.run(x, states, 100, 7)
    with replays[0]._lock:  # as another thread's call of its runner holds it
        _replay(monkeypatch, homes[-1])
    assert homes[0]["forward"] is replays[0] and replays[0].graphs  # busy: kept
    assert "forward" not in homes[1] and replays[1].graphs == {}  # the next least recently run went
    assert len(cuda_runner._live) == cuda_runner.MAX_REPLAYS


def test_new_images_leave_the_packings_a_cuda_graph_captured_alive():
    """A program whose W's images are new (the first backward pass after inference calls, say) makes
    every packing anew, with room for them; the memory of a packing that a user's CUDA graph captured is
    kept, so that the graph's replays still pack and read it there."""
    from collections import OrderedDict

    from cellfuse.nn.packed_for import PackedFor

    r = runner(torch.float32, states=2)
    r.weight_bytes, r._images, r._image_at, r._replays = 512, {}, {}, {}
    captured, other = torch.empty(512, dtype=torch.uint8), torch.empty(512, dtype=torch.uint8)
    r._packings = OrderedDict([(1, (captured, PackedFor())), (2, (other, PackedFor()))])
    r._captured, r._graphs_memory = {captured.data_ptr()}, []
    r._uses = {captured.data_ptr(): cuda_runner._Uses({7}, 7), other.data_ptr(): cuda_runner._Uses({7}, 7)}
    r._add_images({"image:l0.U:N": 1000})
    assert not r._packings and len(r._graphs_memory) == 1 and r._graphs_memory[0] is captured
    assert not r._uses  # (the streams of packings made anew start again)
    assert r._image_at == {"image:l0.U:N": 512}


def test_a_packing_used_on_another_stream_waits_for_the_last_one():
    """Runs of a runner's programs (loaded modules of their own) on other streams read and write one
    packing: a run on another stream than the last one's follows it; on the same stream, nothing."""

    class Program:
        def __init__(self):
            self.followed = []

        def follow(self, last, stream):
            self.followed.append((last, stream))

    uses, forward, backward = cuda_runner._Uses(), Program(), Program()
    for program, stream in ((forward, 1), (forward, 1), (backward, 2), (forward, 2), (forward, 1)):
        CudaRunner._follow(uses, program, stream)
    assert backward.followed == [(1, 2)] and forward.followed == [(2, 1)] and uses.last == 1


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_under_a_capture_a_modules_kept_zeros_are_zeros_of_the_graphs_own(monkeypatch, stored):
    """A user's CUDA graph must not read a module's kept zeros (the module drops them when other shapes
    come, while the graph lives on): under a capture the runner takes zeros made there, which the
    graph's replays fill, and keeps none of them."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    r = runner(stored, states=1)
    kept = Zeros()((L, B, H), torch.float32, torch.device("cpu"))  # (kept before the capture)
    got = r._state_in(kept, stored)
    assert got is not kept and got.dtype == stored and not got.any() and not r._zeros._kept
    given = torch.ones(L, B, H)
    assert r._state_in(given, torch.float32) is given  # (the user's own: read where it is)


def test_zeros_asked_for_under_a_capture_are_made_there_and_not_kept(monkeypatch):
    """A module's first call of a shape inside a capture: its zeros are the graph's, filled only by its
    replays, so the module keeps none for its calls outside the graph."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    real, made = torch.zeros, []

    def zeros_on_the_cpu(*shape, dtype=None, device=None):
        made.append(device)
        return real(*shape, dtype=dtype)
    monkeypatch.setattr(torch, "zeros", zeros_on_the_cpu)
    zeros = Zeros()
    first, second = (zeros((L, B, H), torch.float32, torch.device("cuda")) for _ in range(2))
    assert first is not second and not made_here(first) and made == [torch.device("cuda")] * 2
    assert zeros((L, B, H), torch.float32, torch.device("cpu")) is zeros((L, B, H), torch.float32,
                                                                          torch.device("cpu"))


def test_new_weights_remake_each_image_once_where_programs_share_it():
    """After the weights change, each program that reads images of them remakes them, but an image that
    two programs read (one region of the packing) is made by one: the program with most images first,
    then only those that read an image no program before them made."""
    made = []

    class Program:
        def __init__(self, name, images):
            self.name, self.images = name, dict.fromkeys(images, 64)

        def resolve_some(self, addresses):
            return [addresses[name] for name in self.images]

        def weights_changed(self, at, stream):
            made.append((self.name, at, stream))

    programs = [Program("forward", ["W copies"]), Program("none", []),
                Program("train", ["W copies", "U image"]), Program("backward", ["W^T copies"]),
                Program("backward without dx", ["W^T copies"])]
    addresses = {"W copies": 100, "U image": 200, "W^T copies": 300}
    cuda_runner.remake_images(programs, addresses, stream=7)
    assert made == [("train", [100, 200], 7), ("backward", [300], 7)]
