"""benchmarks/cellrnn_vs_cudnn.py on the CPU at tiny sizes: every case checked against torch.nn.LSTM / GRU
before it is timed, its numbers in the JSON record, and a case that fails its check left untimed."""

from __future__ import annotations

import json
import math

import pytest
from script_loader import load_script

torch = pytest.importorskip("torch")

TINY = ["--device", "cpu", "--hidden", "16", "--input", "16", "--batches", "2", "--seqs", "5",
        "--layers", "1", "--repeats", "2"]


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/cellrnn_vs_cudnn.py")


def timed(part: dict, name: str) -> float:
    value = part[name]["device"]["median_ms"]
    assert isinstance(value, float) and math.isfinite(value) and value > 0
    assert part[name]["host"]["median_ms"] > 0 and len(part[name]["device"]["runs_ms"]) == 2
    # and the call right after the other library's, kept beside it
    after_other = part[name]["device_after_other"]
    assert len(after_other["runs_ms"]) == 2 and part[name]["host_after_other"]["min_ms"] > 0
    return value


def test_each_turn_times_a_call_after_the_others_then_one_after_its_own(script):
    calls = []

    class Clock:  # the order of the runs, and a time that says which run of its turn it was
        def sync(self):
            pass

        def once(self, run, before=None):
            if before is not None:
                before()
            run()
            previous = calls[-2] if len(calls) > 1 else None
            return (1.0, 1.0) if previous == calls[-1] else (2.0, 2.0)

    impls = {"a": (lambda: calls.append("a"), None), "b": (lambda: calls.append("b"), None)}
    out = script.time_in_turns(impls, Clock(), repeats=3, warmup=0)
    assert calls == ["a", "a", "b", "b"] * 3
    for name in impls:
        assert out[name]["device"]["runs_ms"] == out[name]["host"]["runs_ms"] == [1.0] * 3  # after its own
        assert out[name]["device_after_other"]["runs_ms"][1:] == [2.0] * 2  # after the other's
    assert out["b"]["device_after_other"]["runs_ms"] == [2.0] * 3


def check_row(script, row: dict) -> None:
    assert (row["seq"], row["batch"], row["layers"], row["hidden"]) == (5, 2, 1, 16)
    assert row["ok"] and row["error"] is None
    assert row["rung"] == row["train_rung"] == "graph"  # auto, without a GPU
    assert 0 <= row["max_abs_diff"] <= script.TOLERANCE
    timed(row["forward"], "CellRNN"), timed(row["forward"], "cuDNN")
    train = row["train"]
    assert train["ok"] and 0 <= train["grad_rel_error"] <= script.GRAD_TOLERANCE
    timed(train, "CellRNN"), timed(train, "cuDNN")
    for name in ("CellRNN", "cuDNN"):  # and queued back to back: a time per step of each run of them
        together = train["back_to_back"][name]
        assert len(together["runs_ms"]) == 2 and 0 < together["min_ms"] <= together["median_ms"]
    # the parts that need a GPU say so instead of running
    assert {mode: b["ms"] for mode, b in row["bench"].items()} == {"forward": None, "train": None}
    assert all("needs a GPU" in b["note"] for b in row["bench"].values())


@pytest.mark.slow  # every case of the script on the CPU: about 6 s on 2 cores
def test_on_the_cpu_every_case_is_checked_then_timed(script, tmp_path, capsys):
    out = tmp_path / "record.json"
    code = script.main([*TINY, "--no-compile", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    record = json.loads(out.read_text())
    assert record["device"].startswith("CPU") and record["gpu"] is None
    assert record["date"] and record["versions"]["torch"] == torch.__version__
    assert "--device cpu" in record["command"] and "--repeats 2" in record["command"]
    rows = record["rows"]
    assert sorted(r["cell"] for r in rows) == ["gru", "lstm"]
    for row in rows:
        check_row(script, row)
    assert record["compile"] == []
    for heading in ("| cell | T | B | layers | rung | bench ms | CellRNN ms | CellRNN host ms | cuDNN ms |",
                    "Training step", "| CellRNN back to back ms | cuDNN back to back ms |"):
        assert heading in stdout
    assert "| lstm | 5 | 2 | 1 | graph |" in stdout and "| gru | 5 | 2 | 1 | graph |" in stdout


def test_a_training_step_may_end_with_an_optimizers_step_that_changes_the_weights(script, tmp_path, capsys,
                                                                                  monkeypatch):
    stepped = []
    sgd_step = torch.optim.SGD.step
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, **k: stepped.append(1) or sgd_step(self))
    out = tmp_path / "record.json"
    code = script.main([*TINY, "--cells", "lstm", "--no-compile", "--optimizer", "sgd", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    check_row(script, row)  # (the gradients checked before any step changed the weights)
    assert row["train"]["optimizer"] == "sgd" and record["settings"]["optimizer"] == "sgd"
    assert len(stepped) > 2 * 2  # (every timed and back-to-back step of both, not the checks alone)
    assert "Training step (forward, loss = y.pow(2).mean(), backward, SGD's step):" in stdout


@pytest.mark.slow  # torch.compile of a model: about 8 s on 2 cores
@pytest.mark.filterwarnings("ignore:Dynamo detected:UserWarning")  # torch.compile tracing into cellfuse
def test_torch_compile_of_the_language_model_is_timed_or_its_failure_kept(script, tmp_path, capsys):
    out = tmp_path / "record.json"
    code = script.main([*TINY, "--cells", "lstm", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    check_row(script, row)
    (c,) = record["compile"]
    assert (c["cell"], c["seq"], c["batch"], c["layers"]) == ("lstm", 5, 2, 1)
    timed(c, "eager")
    if c["ok"]:
        assert 0 <= c["max_abs_diff"] <= script.TOLERANCE
        timed(c, "compiled")
    else:  # the failure is text in the record and the table, and the compiled model is not timed
        assert c["error"] and "compiled" not in c and "| failed: " in stdout
    assert "torch.compile(model, fullgraph=True)" in stdout


def test_a_case_that_fails_its_check_is_not_timed(script, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(script, "TOLERANCE", -1.0)  # no difference passes
    out = tmp_path / "record.json"
    code = script.main([*TINY, "--cells", "lstm", "--no-compile", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert not row["ok"] and row["max_abs_diff"] >= 0 and "not timed" in row["error"]
    assert row["forward"] is None and row["train"] is None
    assert "FAILED" in stdout and "Failures:" in stdout


def test_in_bf16_each_pass_is_checked_within_the_precisions_bound_then_timed(script, tmp_path, capsys):
    """--precision bf16: x and torch's module in bf16, CellRNN's parameters float32; each y within twice
    bf16's bound of y's largest magnitude (and not float32's result), each training step's gradients
    within twice the bound of bf16 gradients."""
    from cellfuse.codegen.precision import forward_tolerance, gradient_tolerance

    out = tmp_path / "record.json"
    code = script.main([*TINY, "--precision", "bf16", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    record = json.loads(out.read_text())
    assert record["settings"]["precision"] == "bf16" and record["compile"] == []
    for row in record["rows"]:
        assert row["ok"] and row["train"]["ok"] and list(row["bench"]) == ["forward", "train"]
        assert 1e-4 < row["train"]["grad_rel_error"] <= 2 * gradient_tolerance("bf16")
        timed(row["train"], "CellRNN"), timed(row["train"], "cuDNN")
        assert 1e-5 < row["max_abs_diff"] <= row["tolerance"]
        assert row["tolerance"] <= 2 * forward_tolerance("bf16") * 1.0  # y of an LSTM/GRU is within [-1, 1]
        timed(row["forward"], "CellRNN"), timed(row["forward"], "cuDNN")
    assert "torch.bfloat16; medians of 2 runs" in stdout and "Training step" in stdout


def test_cuDNN_may_run_another_precision_than_cellrnn(script, tmp_path, capsys):
    """--precision bf16 --cudnn-precision fp16 (cuDNN at its best beside CellRNN's bf16): x converted for
    torch's module, the check within twice the coarser bound, the table saying which dtype torch ran."""
    from cellfuse.codegen.precision import forward_tolerance

    out = tmp_path / "record.json"
    code = script.main([*TINY, "--precision", "bf16", "--cudnn-precision", "fp16", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    record = json.loads(out.read_text())
    assert record["settings"]["cudnn_precision"] == "fp16"
    for row in record["rows"]:
        assert row["ok"] and 1e-5 < row["max_abs_diff"] <= row["tolerance"] <= 2 * forward_tolerance("bf16")
        timed(row["forward"], "cuDNN")
    assert "torch.bfloat16 (torch's module in torch.float16); medians of 2 runs" in stdout
