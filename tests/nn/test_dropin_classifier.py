"""benchmarks/dropin_classifier.py on the CPU in float64 at tiny sizes: the classifier with cellfuse.nn.LSTM
in torch.nn.LSTM's place (two layers, both directions, batch_first, PackedSequences) follows torch's loss
curve step for step, and the record says so."""

from __future__ import annotations

import json

import pytest
from script_loader import load_script

torch = pytest.importorskip("torch")


def test_the_drop_in_follows_torchs_loss_curve(tmp_path):
    script = load_script("benchmarks/dropin_classifier.py")
    out = tmp_path / "record.json"
    script.main(["--device", "cpu", "--dtype", "float64", "--steps", "12", "--warmup", "2", "--batch", "6",
                 "--seq", "9", "--min-length", "2", "--features", "5", "--hidden", "7", "--lr", "0.05",
                 "--out", str(out)])
    record = json.loads(out.read_text())
    want, got = record["losses"]["torch.nn.LSTM"], record["losses"]["cellfuse.nn.LSTM"]
    assert len(want) == len(got) == 12
    assert record["max_abs_loss_diff"] < 1e-10
    assert record["max_abs_loss_diff_of_the_control"] == 0  # no cuDNN on the CPU: the same kernels
    assert want[-1] < want[0]  # it learns: the curves compared are not flat
    assert set(record["step_ms"]) == {"torch.nn.LSTM", "torch.nn.LSTM without cuDNN", "cellfuse.nn.LSTM"}
    assert len(record["ms_of_each_step"]["cellfuse.nn.LSTM"]) == 10
