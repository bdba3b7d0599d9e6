"""benchmarks/train_lm.py: a language model trained with CellRNN and with torch.nn.LSTM from the same
initial weights gives the same loss curve (on the CPU here, tiny sizes; on the GPU with `-m gpu`), and
trained under torch.autocast to 16 bits ends within its margin of the float32 run's loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
from script_loader import load_script

torch = pytest.importorskip("torch")

TINY = ["--seq", "5", "--batch", "3", "--vocab", "40", "--embed", "10", "--hidden", "12", "--steps", "6",
        "--every", "2", "--batches", "1", "--lr", "1e-2"]
SMALL = "--seq 20 --batch 8 --vocab 100 --embed 64 --hidden 64 --steps 20 --batches 2".split()


@pytest.fixture(scope="module")
def train_lm():
    return load_script("benchmarks/train_lm.py")


def test_the_two_models_start_from_the_same_function(train_lm):
    args = train_lm.parse_args(["--device", "cpu", *TINY])
    cellfuse, reference = train_lm.make_models(args, torch.device("cpu"))
    shared = {id(p) for p in cellfuse.parameters()} & {id(p) for p in reference.parameters()}
    assert not shared  # each trains its own weights
    tokens = torch.randint(args.vocab, (args.seq, args.batch), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = cellfuse(tokens), reference(tokens)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    # torch.nn.LSTM's second bias is the cell's nothing: zero, and never stepped by the optimizer
    frozen = [getattr(reference.rnn, f"bias_hh_l{layer}") for layer in range(args.layers)]
    assert all(not p.requires_grad and not p.any() for p in frozen)


@pytest.mark.slow  # trains the small language model twice
def test_on_the_cpu_the_loss_curves_agree(train_lm, tmp_path, capsys):
    code = train_lm.main(["--device", "cpu", *TINY, "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    record = json.loads((tmp_path / "r.json").read_text())
    ours, theirs = (np.array(record["losses"][name]) for name in train_lm.NAMES)
    assert len(ours) == len(theirs) == 6
    assert (np.diff(ours) < 0).all()  # the one batch is being learnt: the curves are of training
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert record["final_rel_diff"] < train_lm.GOAL
    assert record["device"].startswith("CPU") and "--device cpu" in record["command"]
    assert record["date"] and set(record["ms_per_step"]) == set(train_lm.NAMES)
    assert "relative difference of the losses of CellRNN and torch.nn.LSTM after 6 steps" in out
    assert "ms per step" in out
    assert f"loss {ours[0]:.4f} at the first step, {ours[-1]:.4f} at the last" in out
    assert record["schedule"] == "auto" and record["schedules_run"] == ["graph"]  # auto, without a GPU
    assert "CellRNN ran the graph schedule (asked for auto)" in out


@pytest.mark.slow  # trains the small language model three times
def test_in_bf16_on_the_cpu_the_loss_stays_within_its_margin_of_float32s(train_lm, tmp_path, capsys):
    path = tmp_path / "r.json"
    code = train_lm.main(["--device", "cpu", *TINY, "--precision", "bf16", "--json", str(path)])
    out = capsys.readouterr().out
    record = json.loads(path.read_text())
    names = train_lm.names("bf16")
    assert code == 0 and names == ("CellRNN", "CellRNN bf16", "torch.nn.LSTM bf16"), out
    float32, ours, torchs = (np.array(record["losses"][name]) for name in names)
    assert (np.diff(ours) < 0).all() and not np.array_equal(ours, float32)  # trained, and in other types
    assert record["final_rel_diff"] == abs(ours[-1] - float32[-1]) / float32[-1] < train_lm.MARGIN_16
    assert record["final_rel_change"] == (ours[-1] - float32[-1]) / float32[-1] and record["goal_met"]
    assert record["reference_rel_diff"] == abs(torchs[-1] - float32[-1]) / float32[-1]
    assert record["precision"] == "bf16" and record["goal"] == train_lm.MARGIN_16
    assert "for scale, torch.nn.LSTM bf16 against CellRNN (float32)" in out


def test_fp16_on_the_cpu_is_refused_by_name(train_lm, capsys):
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--device", "cpu", "--precision", "fp16"])
    assert "torch.nn.LSTM runs no float16 on the CPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_the_gpu_the_loss_curves_agree(gpu, train_lm, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    sizes = SMALL
    code = train_lm.main(["--device", "cuda", *sizes, "--json", str(tmp_path / "r.json")])
    record = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and record["final_rel_diff"] < train_lm.GOAL
    ours, theirs = (np.array(record["losses"][name]) for name in train_lm.NAMES)
    np.testing.assert_allclose(ours, theirs, rtol=1e-3)
    assert ours[-2:].max() < ours[:2].min()  # two batches, each learnt: the loss falls


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_on_the_gpu_a_16_bit_run_stays_within_its_margin(gpu, train_lm, tmp_path, precision):
    """Under torch.autocast (fp16 with a GradScaler) the loss reaches float32's: at most MARGIN_16 above."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    code = train_lm.main(["--device", "cuda", *SMALL, "--precision", precision,
                          "--json", str(tmp_path / "r.json")])
    record = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and record["goal_met"] and record["final_rel_change"] < train_lm.MARGIN_16
    ours = np.array(record["losses"][f"CellRNN {precision}"])
    assert ours[-2:].max() < ours[:2].min()
