"""A CellRNN's inference calls of a rung that launches at every step replay a CUDA graph of the pass (see
cuda_runner._Replay): the same results as the launches, on new inputs, new initial states and changed
parameters, for every module of the sizes, in memory that does not grow."""

from __future__ import annotations

import pytest
import torch

from cellfuse.nn import CellRNN, ops

pytestmark = pytest.mark.gpu

T, INPUT, H = 30, 32, 48  # each test its own batch size: runners, and their graphs, are the process's


def _lstm(cuda, seed=3, **options):
    return CellRNN("lstm", INPUT, H, 2, schedule="graph", seed=seed, **options).to(cuda)


def _trained_forward(rnn, x, states=None):
    """The training program's forward pass (launched, not replayed) of the same rung."""
    y, finals = rnn(x.clone().requires_grad_(), states)
    return y.detach(), {k: v.detach() for k, v in finals.items()}


def _graphs(rnn, x) -> int:
    """The graphs the runner of the module's calls on x captured."""
    runner = ops.runner(rnn._cell_text, x, H, 2, "graph", float32=rnn._float32)
    return len(runner._replays["forward"].graphs)


def test_inference_calls_replay_one_graph_and_match_the_launches(cuda):
    rnn = _lstm(cuda)
    xs = [torch.randn(T, 4, INPUT, device=cuda) for _ in range(3)]
    states = {s: torch.randn(2, 4, H, device=cuda) for s in rnn.state_ids}
    with torch.no_grad():
        first, first_finals = rnn(xs[0])  # launched: the program's first run
        got = [rnn(x, states if i == 1 else None) for i, x in enumerate(xs)]  # replayed
        kept = got[0][0].clone()
        rnn(xs[1])
    assert _graphs(rnn, xs[0]) == 1
    torch.testing.assert_close(got[0][0], first, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[0][0], kept, rtol=0, atol=0)  # later replays wrote tensors of their own
    for i, x in enumerate(xs):
        y, finals = _trained_forward(rnn, x, states if i == 1 else None)
        torch.testing.assert_close(got[i][0], y, rtol=1e-5, atol=1e-5)
        for s in rnn.state_ids:
            torch.testing.assert_close(got[i][1][s], finals[s], rtol=1e-5, atol=1e-5)
    assert (got[1][0] - got[0][0]).abs().max() > 1e-3


def test_changed_parameters_and_other_modules_are_seen(cuda):
    rnn, other = _lstm(cuda, seed=3), _lstm(cuda, seed=4)
    x = torch.randn(T, 5, INPUT, device=cuda)
    with torch.no_grad():
        rnn(x), rnn(x), other(x)
        before, theirs = rnn(x)[0], other(x)[0]
        rnn.param("l0.W_i").mul_(0.5)  # in place: the same packed weights, written again
        after = rnn(x)[0]
    assert _graphs(rnn, x) == 2  # one per module's packed weights
    torch.testing.assert_close(after, _trained_forward(rnn, x)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs, _trained_forward(other, x)[0], rtol=1e-5, atol=1e-5)
    assert (after - before).abs().max() > 1e-4


def test_replays_under_inference_mode_hold_no_more_memory(cuda):
    rnn = _lstm(cuda)
    x = torch.randn(T, 6, INPUT, device=cuda)
    with torch.inference_mode():
        want = rnn(x)[0]
        rnn(x)
    torch.cuda.synchronize(cuda)
    held = torch.cuda.memory_allocated(cuda)
    with torch.inference_mode():
        got = [rnn(x)[0] for _ in range(10)]
    del got
    torch.cuda.synchronize(cuda)
    assert torch.cuda.memory_allocated(cuda) <= held
    with torch.no_grad():  # the memory made under inference_mode is written outside it too
        torch.testing.assert_close(rnn(x)[0], want, rtol=1e-6, atol=1e-6)


def test_a_16_bit_pass_with_states_of_two_types_replays(cuda):
    """bf16 y and h, float32 c: x's type out, c converted on its way in and out."""
    rnn = _lstm(cuda)
    x = torch.randn(T, 7, INPUT, device=cuda).bfloat16()
    states = {s: torch.randn(2, 7, H, device=cuda).bfloat16() for s in rnn.state_ids}
    with torch.no_grad():
        want, want_finals = rnn(x, states)
        got, finals = rnn(x, states)
    assert got.dtype == torch.bfloat16 and finals["c"].dtype == torch.bfloat16
    assert _graphs(rnn, x) == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for s in rnn.state_ids:
        torch.testing.assert_close(finals[s], want_finals[s], rtol=0, atol=0)


def test_a_capture_that_fails_leaves_the_launches(cuda, monkeypatch, caplog):
    from cellfuse.gpu_runtime.driver import DriverError
    from cellfuse.gpu_runtime.stream_program import StreamProgram

    def refuse(self, bases):
        raise DriverError("CUDA driver error CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while capturing")

    rnn = _lstm(cuda)
    x = torch.randn(T, 8, INPUT, device=cuda)
    monkeypatch.setattr(StreamProgram, "capture", refuse)
    with torch.no_grad(), caplog.at_level("WARNING"):
        got = [rnn(x)[0] for _ in range(3)]
    runner = ops.runner(rnn._cell_text, x, H, 2, "graph")
    assert not runner._programs["forward"].capture_pays and "forward" not in runner._replays
    assert "could not be captured" in caplog.text
    for y in got:
        torch.testing.assert_close(y, _trained_forward(rnn, x)[0], rtol=1e-5, atol=1e-5)


def test_only_the_last_replays_keep_their_memory_and_a_dropped_one_is_made_again(cuda):
    from cellfuse.nn import cuda_runner

    rnn = _lstm(cuda)
    xs = [torch.randn(T, batch, INPUT, device=cuda) for batch in range(9, 10 + cuda_runner.MAX_REPLAYS)]
    with torch.no_grad():
        want = [rnn(x)[0] for x in xs]  # launched, each size's first run
        first = [rnn(x)[0] for x in xs]  # replayed: the first size's replay dropped by the last one's
        runners = [ops.runner(rnn._cell_text, x, H, 2, "graph") for x in xs]
        assert "forward" not in runners[0]._replays and all("forward" in r._replays for r in runners[1:])
        again = rnn(xs[0])[0]
    assert "forward" in runners[0]._replays and "forward" not in runners[1]._replays
    for y, w in zip([*first, again], [*want, want[0]], strict=True):
        torch.testing.assert_close(y, w, rtol=1e-6, atol=1e-6)


def test_calls_from_several_threads_get_their_own_results(cuda):
    """Threads that call one module (one runner: one replay's memory) and modules of other sizes (whose
    replays evict each other's, past MAX_REPLAYS) at once, each on a stream of its own, get the results
    of the same calls made one at a time."""
    import threading

    from cellfuse.nn import cuda_runner

    rnn = _lstm(cuda)
    batches = [2, 3, 2, 3, *range(20, 20 + cuda_runner.MAX_REPLAYS)]
    xs = [torch.randn(T, b, INPUT, device=cuda) for b in batches]
    with torch.no_grad():
        want = [rnn(x)[0] for x in xs]
        for x in xs:  # the second calls capture: from here on, replays
            rnn(x)
    torch.cuda.synchronize()
    wrong: list[int] = []
    failed: list[BaseException] = []

    def work(i: int) -> None:
        try:
            stream = torch.cuda.Stream(cuda)
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(20):
                    y = rnn(xs[i])[0]
                    if not torch.allclose(y, want[i], rtol=1e-6, atol=1e-6):  # (launched, not replayed)
                        wrong.append(i)
            stream.synchronize()
        except BaseException as e:  # (reported by the test's thread)
            failed.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    assert not wrong, f"{len(wrong)} calls of {20 * len(xs)} got another call's result"
