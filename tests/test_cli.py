"""The command line: every command that works, and every bad input ending in one message on stderr
that says what and where, a non-zero exit, no traceback and no output file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cellfuse.cli import main
from cellfuse.graph_model import (
    expected_params,
    load_cell,
    load_npz,
    load_template,
    run_reference,
    save_npz,
    template_names,
)
from cellfuse.graph_model.templates import template_text

ROOT = Path(__file__).resolve().parents[1]
T, B, INPUT, HIDDEN = 4, 3, 5, 6


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cellfuse-cache")


@pytest.fixture(autouse=True)
def own_cache(session_cache, monkeypatch):
    """cellfuse's caches (the kernels an export compiles, auto's choices) in a folder of the test run's,
    not the user's."""
    monkeypatch.setenv("CELLFUSE_CACHE_DIR", str(session_cache))


@pytest.fixture
def cli(capsys):
    """cli(*argv) -> (exit code, stdout, stderr)."""

    def run(*argv: object) -> tuple[int, str, str]:
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    return run


def write_cell(path: Path, change=None, name: str = "elman") -> Path:
    data = json.loads(template_text(name))
    if change is not None:
        change(data)
    path.write_text(json.dumps(data, indent=1))
    return path


@pytest.fixture
def lstm_files(tmp_path, cli):
    """Parameters for 2 layers and inputs for the LSTM template, written by the CLI itself."""
    params, inputs = tmp_path / "p.npz", tmp_path / "x.npz"
    assert cli("init-params", "lstm", "--layers", 2, "--input", INPUT, "--hidden", HIDDEN, "--seed", 3,
               "-o", params)[0] == 0
    assert cli("init-inputs", "lstm", "--seq", T, "--batch", B, "--input", INPUT, "--seed", 4,
               "-o", inputs)[0] == 0
    return params, inputs


# -- commands that work ---------------------------------------------------------------------------

def test_templates_lists_every_template(cli):
    code, out, err = cli("templates")
    assert code == 0 and err == ""
    lines = out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == template_names()
    assert any("LSTM" in ln for ln in lines)


def test_templates_prints_one(cli):
    code, out, _ = cli("templates", "gru")
    assert code == 0 and out == template_text("gru")


def test_templates_writes_one(cli, tmp_path):
    target = tmp_path / "g.cell.json"
    code, out, _ = cli("templates", "gru_cho", "-o", target)
    assert code == 0 and str(target) in out
    assert target.read_text() == template_text("gru_cho")
    assert load_cell(target).to_json() == load_template("gru_cho").to_json()


@pytest.mark.parametrize("name", template_names())
def test_validate_a_template_by_name(cli, name):
    code, out, err = cli("validate", name)
    assert code == 0 and "is valid" in out and err == ""


def test_validate_a_file(cli, tmp_path):
    path = write_cell(tmp_path / "e.cell.json")
    code, out, err = cli("validate", path)
    assert code == 0 and "is valid" in out and "0 warning(s)" in out


def test_a_file_named_like_a_template_wins(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_cell(tmp_path / "lstm", lambda d: d["nodes"].append({"id": "junk", "op": "nope"}))
    code, _, err = cli("validate", "lstm")
    assert code == 1 and "'junk'" in err


def test_validate_with_warnings_only(cli, tmp_path):
    path = write_cell(tmp_path / "w.cell.json",
                      lambda d: d["nodes"].append({"id": "spare", "op": "sigmoid", "args": ["a"]}))
    code, out, err = cli("validate", path)
    assert code == 0 and "is valid" in out and "1 warning(s)" in out
    assert "warning: node 'spare'" in err


def test_show_prints_the_equations(cli):
    code, out, err = cli("show", "lstm")
    assert code == 0 and err == ""
    assert out.splitlines() == ["i  = sigmoid(x @ W_i + h @ U_i + b_i)",
                                "f  = sigmoid(x @ W_f + h @ U_f + b_f)",
                                "o  = sigmoid(x @ W_o + h @ U_o + b_o)",
                                "g  = tanh(x @ W_g + h @ U_g + b_g)",
                                "c' = f * c + i * g",
                                "h' = o * tanh(c')",
                                "y  = h'"]


def test_show_latex(cli, tmp_path):
    code, out, err = cli("show", write_cell(tmp_path / "e.cell.json"), "--latex")
    assert code == 0 and err == ""
    assert out == ("\\begin{align*}\n"
                   "  h' &= \\tanh(x \\, W + h \\, U + b) \\\\\n"
                   "  y &= h'\n"
                   "\\end{align*}\n")


def test_show_a_cell_with_errors(cli, tmp_path):
    path = write_cell(tmp_path / "bad.cell.json", lambda d: _node(d, "a_b").update(args=["a"]))
    code, out, err = cli("show", path)
    assert code == 1 and out == "h' = tanh(x @ W + h @ U + ?)\ny  = h'\n"
    assert "1 error(s)" in err and "cellfuse validate" in err


def test_show_needs_a_cell(capsys):
    with pytest.raises(SystemExit) as e:
        main(["show"])
    assert e.value.code == 2 and "usage:" in capsys.readouterr().err


def test_init_params(cli, tmp_path):
    path = tmp_path / "p.npz"
    code, out, _ = cli("init-params", "lstm", "--layers", 2, "--input", 3, "--hidden", 4, "--seed", 1,
                       "-o", path)
    assert code == 0 and str(path) in out
    params = load_npz(path, "parameters")
    assert len(params) == 2 * 12
    assert params["l0.W_i"].shape == (3, 4) and params["l1.W_i"].shape == (4, 4)
    assert params["l1.U_o"].shape == (4, 4) and params["l0.b_g"].shape == (4,)
    assert all(v.dtype == np.float32 and np.all(np.abs(v) <= 0.5) for v in params.values())
    again = tmp_path / "q.npz"
    cli("init-params", "lstm", "--layers", 2, "--input", 3, "--hidden", 4, "--seed", 1, "-o", again)
    other = tmp_path / "r.npz"
    cli("init-params", "lstm", "--layers", 2, "--input", 3, "--hidden", 4, "--seed", 2, "-o", other)
    b, c = load_npz(again, "parameters"), load_npz(other, "parameters")
    assert all(np.array_equal(params[k], b[k]) for k in params)
    assert not np.array_equal(params["l0.W_i"], c["l0.W_i"])


def test_init_params_uses_the_cells_sizes(cli, tmp_path):
    path = write_cell(tmp_path / "e.cell.json", lambda d: d.update(sizes={"input": 2, "hidden": 7}))
    cli("init-params", path, "-o", tmp_path / "p.npz")
    params = load_npz(tmp_path / "p.npz", "parameters")
    assert {k: v.shape for k, v in params.items()} == {"l0.W": (2, 7), "l0.U": (7, 7), "l0.b": (7,)}


def test_init_inputs(cli, tmp_path):
    path = tmp_path / "x.npz"
    code, out, _ = cli("init-inputs", "gru", "--seq", 7, "--batch", 2, "--input", 3, "-o", path)
    assert code == 0 and "[7, 2, 3]" in out
    inputs = load_npz(path, "inputs")
    assert list(inputs) == ["x"] and inputs["x"].shape == (7, 2, 3) and inputs["x"].dtype == np.float32


def test_run(cli, tmp_path, lstm_files):
    params, inputs = lstm_files
    out_path = tmp_path / "y.npz"
    code, out, err = cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", out_path,
                         "--backend", "numpy")
    assert code == 0 and str(out_path) in out and err == ""
    result = load_npz(out_path, "outputs")
    assert set(result) == {"y", "final.h", "final.c"}
    assert result["y"].shape == (T, B, HIDDEN) and result["y"].dtype == np.float32
    assert result["final.h"].shape == result["final.c"].shape == (2, B, HIDDEN)
    want = run_reference(load_template("lstm"), load_npz(params, "p"), load_npz(inputs, "x"))
    np.testing.assert_array_equal(result["y"], want.y)
    np.testing.assert_array_equal(result["final.c"], want.final["c"])
    np.testing.assert_array_equal(result["y"][-1], result["final.h"][-1])


def test_run_fewer_layers_than_the_parameters(cli, tmp_path, lstm_files):
    params, inputs = lstm_files
    cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", tmp_path / "one.npz", "--layers", 1)
    cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", tmp_path / "two.npz")
    one, two = load_npz(tmp_path / "one.npz", "o"), load_npz(tmp_path / "two.npz", "o")
    assert one["final.h"].shape == (1, B, HIDDEN) and two["final.h"].shape == (2, B, HIDDEN)
    np.testing.assert_array_equal(one["final.h"][0], two["final.h"][0])  # layer 0 is the same
    assert not np.allclose(one["y"], two["y"])


def test_run_three_layers_of_a_cell_file(cli, tmp_path):
    cell = write_cell(tmp_path / "g.cell.json", name="gru")
    cli("init-params", cell, "--layers", 3, "--input", 2, "--hidden", 3, "-o", tmp_path / "p.npz")
    cli("init-inputs", cell, "--seq", 2, "--batch", 1, "--input", 2, "-o", tmp_path / "x.npz")
    code, _, _ = cli("run", cell, "--params", tmp_path / "p.npz", "--inputs", tmp_path / "x.npz",
                     "-o", tmp_path / "y.npz")
    assert code == 0
    result = load_npz(tmp_path / "y.npz", "o")
    assert result["y"].shape == (2, 1, 3) and result["final.h"].shape == (3, 1, 3)


def test_run_with_initial_states_from_the_inputs_file(cli, tmp_path, lstm_files):
    params, inputs = lstm_files
    x = load_npz(inputs, "x")["x"]
    rng = np.random.default_rng(9)
    h0 = rng.standard_normal((2, B, HIDDEN)).astype(np.float32)
    c0 = rng.standard_normal((2, B, HIDDEN)).astype(np.float32)
    save_npz(tmp_path / "xs.npz", {"x": x, "h": h0, "c": c0})
    cli("run", "lstm", "--params", params, "--inputs", tmp_path / "xs.npz", "-o", tmp_path / "ys.npz")
    cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", tmp_path / "y0.npz")
    with_states, from_zero = load_npz(tmp_path / "ys.npz", "o"), load_npz(tmp_path / "y0.npz", "o")
    assert not np.allclose(with_states["y"], from_zero["y"])
    want = run_reference(load_template("lstm"), load_npz(params, "p"), {"x": x, "h": h0, "c": c0})
    np.testing.assert_array_equal(with_states["y"], want.y)
    np.testing.assert_array_equal(with_states["final.h"], want.final["h"])


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "cellfuse" in capsys.readouterr().out


# -- bad input: one message on stderr, exit != 0, no traceback, no output -------------------------

def _node(d, nid):
    return next(n for n in d["nodes"] if n["id"] == nid)


# (change to the Elman file, words the message must hold)
BAD_CELLS = {
    "unknown op": (lambda d: _node(d, "a").update(op="addd"), ["node 'a'", "'addd'"]),
    "arity": (lambda d: _node(d, "h_new").update(args=["a_b", "a"]), ["node 'h_new'", "takes 1 arg"]),
    "dangling arg": (lambda d: _node(d, "a").update(args=["xw", "zz"]), ["node 'a'", "'zz'"]),
    "duplicate id": (lambda d: d["nodes"].append({"id": "a", "op": "tanh", "args": ["xw"]}),
                     ["node 'a'", "duplicate"]),
    "invalid id": (lambda d: d["nodes"].append({"id": "9z", "op": "tanh", "args": ["a"]}), ["'9z'"]),
    "shape mismatch": (lambda d: _node(d, "b").update(shape=["input"]),
                       ["node 'a_b'", "[batch, hidden]", "[input]"]),
    "matmul of a 1-D weight": (lambda d: _node(d, "hu").update(args=["h", "b"]), ["node 'hu'", "2-D weight"]),
    "cycle": (lambda d: _node(d, "a").update(args=["xw", "h_new"]), ["cycle", "a", "a_b", "h_new"]),
    "state without update": (lambda d: d["nodes"].append({"id": "c", "op": "state"}), ["node 'c'", "update"]),
    "update of a non-state": (lambda d: d["updates"].update(xw="a"), ["node 'xw'", "not a state"]),
    "output not hidden-sized": (lambda d: d.update(output="x"), ["node 'x'", "[batch, input]"]),
    "no output": (lambda d: d.pop("output"), ["no output"]),
    "two inputs": (lambda d: d["nodes"].insert(1, {"id": "x2", "op": "input"}), ["node 'x2'", "one input"]),
    "unused input": (lambda d: _node(d, "xw").update(args=["h", "U"]), ["node 'x'", "not used"]),
    "bad weight shape": (lambda d: _node(d, "b").update(shape=["hidden", "hidden", "hidden"]),
                         ["node 'b'", "weight shape"]),
    "const without value": (lambda d: d["nodes"].append({"id": "k", "op": "const"}), ["node 'k'", "value"]),
}


@pytest.mark.parametrize("what", sorted(BAD_CELLS))
def test_validate_reports_each_error(cli, tmp_path, what):
    change, words = BAD_CELLS[what]
    path = write_cell(tmp_path / "bad.cell.json", change)
    code, out, err = cli("validate", path)
    assert code == 1 and "error(s)" in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("what", sorted(BAD_CELLS))
def test_every_command_refuses_an_invalid_cell(cli, tmp_path, lstm_files, what):
    change, words = BAD_CELLS[what]
    out = tmp_path / "out"
    out.mkdir()
    cell = write_cell(out / "bad.cell.json", change)
    params, inputs = lstm_files
    for argv in (["init-params", cell, "-o", out / "p.npz"],
                 ["init-inputs", cell, "-o", out / "x.npz"],
                 ["run", cell, "--params", params, "--inputs", inputs, "-o", out / "y.npz"]):
        code, _, err = cli(*argv)
        assert code == 1 and err.startswith("cellfuse: error: ") and words[0] in err, (argv[0], err)
    assert [p.name for p in out.iterdir()] == ["bad.cell.json"]


# -- a cell that ties the input width to the hidden width ----------------------------------------------

def tie_refused(err: str, cell: str, node: str, input: int, hidden: int) -> bool:
    """The one-line refusal of sizes a cell that ties the widths cannot run at."""
    return (err.startswith("cellfuse: error: ") and err.count("\n") == 1 and f"cell '{cell}'" in err
            and f"input size {input} and hidden size {hidden}: node '{node}'" in err
            and err.endswith(", so the two must be equal\n"))


def test_validate_accepts_a_cell_that_ties_the_widths(cli, tmp_path):
    path = write_cell(tmp_path / "r.cell.json", lambda d: _node(d, "a").update(args=["xw", "x"]))
    code, out, _ = cli("validate", path)
    assert code == 0 and "is valid" in out


@pytest.mark.parametrize("command", [["plan"], ["plan", "--json"], ["plan", "--schedule", "persistent"],
                                     ["export", "-o", "out.cu"], ["init-params", "-o", "p.npz"],
                                     pytest.param(["bench", "--backend", "numpy", "--repeats", 1,
                                                   "--baselines", ""], marks=pytest.mark.slow)])
def test_every_command_refuses_sizes_that_untie_the_widths(cli, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    sizes = ["--input", 3, "--hidden", 4]
    if command[0] in ("plan", "bench"):
        sizes += ["--seq", 2, "--batch", 1, "--layers", 2]
    code, out, err = cli(command[0], "sru", *command[1:], *sizes)
    assert code == 1 and tie_refused(err, "SRU", "highway", 3, 4), err
    assert list(tmp_path.iterdir()) == []
    code, _, _ = cli(command[0], "sru", *command[1:], "--input", 4, "--hidden", 4)
    assert code == 0


def test_bench_refuses_a_sweep_that_unties_the_widths(cli, tmp_path):
    code, out, err = cli("bench", "residual_lstm", "--backend", "numpy", "--seq", 2, "--batch", 1,
                         "--input", 4, "--hidden", 4, "--repeats", 1, "--baselines", "",
                         "--schedules", "hoisted", "--sweep", "hidden=3")
    assert code == 1 and tie_refused(err.splitlines(keepends=True)[-1], "Residual LSTM", "y", 4, 3), err


@pytest.mark.parametrize("schedule", [[], ["--schedule", "hoisted"]])
def test_run_refuses_inputs_that_untie_the_widths(cli, tmp_path, schedule):
    params, inputs, out = tmp_path / "p.npz", tmp_path / "x.npz", tmp_path / "y.npz"
    save_npz(params, {k: np.zeros(shape, np.float32)
                      for k, shape in expected_params(load_template("sru"), 2, 3, 4).items()})
    assert cli("init-inputs", "sru", "--seq", T, "--batch", B, "--input", 3, "-o", inputs)[0] == 0
    code, _, err = cli("run", "sru", "--params", params, "--inputs", inputs, "-o", out, *schedule)
    assert code == 1 and tie_refused(err, "SRU", "highway", 3, 4), err
    assert not out.exists()


def test_const_with_nan_value(cli, tmp_path):
    path = tmp_path / "k.cell.json"
    path.write_text(template_text("elman").replace('{"id": "b", "op": "weight", "shape": ["hidden"]}',
                                                   '{"id": "b", "op": "const", "value": NaN}'))
    code, _, err = cli("validate", path)
    assert code == 1 and "node 'b'" in err and "'value'" in err


def test_truncated_cell_file_names_the_line(cli, tmp_path):
    text = template_text("elman")
    path = tmp_path / "t.cell.json"
    path.write_text(text[: text.index('"op": "matmul"')])
    line = text[: text.index('"op": "matmul"')].count("\n") + 1
    code, _, err = cli("validate", path)
    assert code == 1 and f"line {line}" in err and str(path) in err


def test_unknown_format_version(cli, tmp_path):
    path = write_cell(tmp_path / "v.cell.json", lambda d: d.update(format="cellfuse.cell/9"))
    code, _, err = cli("validate", path)
    assert code == 1 and "cellfuse.cell/9" in err


def test_wrong_field_type(cli, tmp_path):
    path = write_cell(tmp_path / "f.cell.json", lambda d: _node(d, "W").update(shape="input"))
    code, _, err = cli("validate", path)
    assert code == 1 and "node 'W'" in err and "'shape'" in err


def test_no_such_cell(cli, tmp_path):
    code, _, err = cli("validate", tmp_path / "nope.cell.json")
    assert code == 1 and "nope.cell.json" in err and "no such file" in err


def test_unknown_template(cli, tmp_path):
    code, _, err = cli("templates", "lsmt", "-o", tmp_path / "t.json")
    assert code == 1 and "'lsmt'" in err and not (tmp_path / "t.json").exists()


def _drop(key):
    def change(params, inputs):
        del params[key]
    return change


def _reshape(where, key, shape):
    def change(params, inputs):
        (params if where == "p" else inputs)[key] = np.zeros(shape, np.float32)
    return change


BAD_RUNS = {
    "missing parameter": (_drop("l1.U_f"), ["'l1.U_f'", "missing", f"[{HIDDEN}, {HIDDEN}]"]),
    "mis-shaped parameter": (_reshape("p", "l1.W_g", (INPUT, HIDDEN)),
                             ["'l1.W_g'", f"[{INPUT}, {HIDDEN}]", f"[{HIDDEN}, {HIDDEN}]"]),
    "mis-shaped bias": (_reshape("p", "l0.b_o", (HIDDEN + 1,)), ["'l0.b_o'", f"[{HIDDEN + 1}]"]),
    "x missing": (lambda p, i: i.pop("x"), ["'x'", "missing"]),
    "x of the wrong size": (_reshape("i", "x", (T, B, INPUT + 1)), ["'x'", f"[{T}, {B}, {INPUT + 1}]"]),
    "x of the wrong rank": (_reshape("i", "x", (T, B)), ["'x'", f"[{T}, {B}]"]),
    "initial state of the wrong shape": (_reshape("i", "c", (1, B, HIDDEN)),
                                         ["'c'", f"[1, {B}, {HIDDEN}]", f"[2, {B}, {HIDDEN}]"]),
    "NaN in x": (lambda p, i: i.update(x=np.full((T, B, INPUT), np.nan, np.float32)), ["NaN or infinity"]),
    "a parameter the cell does not have": (lambda p, i: p.update({"l0.W_q": np.zeros(1, np.float32)}),
                                           ["parameters ", "bad_p.npz: holds 25 arrays, and 'l0.W_q' is "
                                            "not a parameter of cell 'LSTM'"]),
    "an input the cell does not have": (lambda p, i: i.update(y=np.zeros(1, np.float32)),
                                        ["inputs ", "bad_x.npz: holds 2 arrays, and 'y' is neither the input "
                                         "sequence 'x' nor a state of cell 'LSTM' (states: h, c)"]),
}


@pytest.mark.parametrize("what", sorted(BAD_RUNS))
def test_bad_run_data(cli, tmp_path, lstm_files, what):
    change, words = BAD_RUNS[what]
    params, inputs = load_npz(lstm_files[0], "p"), load_npz(lstm_files[1], "x")
    change(params, inputs)
    save_npz(tmp_path / "bad_p.npz", params)
    save_npz(tmp_path / "bad_x.npz", inputs)
    out_path = tmp_path / "y.npz"
    code, out, err = cli("run", "lstm", "--params", tmp_path / "bad_p.npz",
                         "--inputs", tmp_path / "bad_x.npz", "-o", out_path)
    assert code == 1 and err.startswith("cellfuse: error: ")
    for w in words:
        assert w in err, (w, err)
    assert not out_path.exists()


def test_more_layers_than_the_parameters(cli, tmp_path, lstm_files):
    code, _, err = cli("run", "lstm", "--params", lstm_files[0], "--inputs", lstm_files[1], "--layers", 3,
                       "-o", tmp_path / "y.npz")
    assert code == 1 and "'l2.W_i'" in err and not (tmp_path / "y.npz").exists()


def test_a_failed_run_leaves_an_old_output_alone(cli, tmp_path, lstm_files):
    out_path = tmp_path / "y.npz"
    out_path.write_bytes(b"old")
    code, _, _ = cli("run", "lstm", "--params", lstm_files[1], "--inputs", lstm_files[1], "-o", out_path)
    assert code == 1 and out_path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz", "x.npz", "y.npz"]


@pytest.mark.parametrize("content", [b"not an npz at all", b""])
def test_params_that_are_not_npz(cli, tmp_path, lstm_files, content):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(content)
    code, _, err = cli("run", "lstm", "--params", bad, "--inputs", lstm_files[1], "-o", tmp_path / "y.npz")
    assert code == 1 and "parameters" in err and str(bad) in err and not (tmp_path / "y.npz").exists()


def test_inputs_with_a_pickled_object_array(cli, tmp_path, lstm_files):
    evil = tmp_path / "evil.npz"
    np.savez(evil, x=np.array([object()], dtype=object))
    code, _, err = cli("run", "lstm", "--params", lstm_files[0], "--inputs", evil, "-o", tmp_path / "y.npz")
    assert code == 1 and "inputs" in err and str(evil) in err and not (tmp_path / "y.npz").exists()


def test_missing_inputs_file(cli, tmp_path, lstm_files):
    code, _, err = cli("run", "lstm", "--params", lstm_files[0], "--inputs", tmp_path / "none.npz",
                       "-o", tmp_path / "y.npz")
    assert code == 1 and "none.npz" in err and "no such file" in err


@pytest.mark.parametrize("command", ["init-params", "init-inputs", "templates"])
def test_output_into_a_missing_folder(cli, tmp_path, command):
    target = tmp_path / "no" / "such" / "out"
    argv = [command, "elman", "-o", target]
    code, _, err = cli(*argv)
    assert code == 1 and str(target) in err and not (tmp_path / "no").exists()


def test_run_output_into_a_missing_folder(cli, tmp_path, lstm_files):
    target = tmp_path / "no" / "y.npz"
    code, _, err = cli("run", "lstm", "--params", lstm_files[0], "--inputs", lstm_files[1], "-o", target)
    assert code == 1 and str(target) in err


# -- outputs through symbolic links: the link stays, the file it points to is written -------------------

def _entries(*folders: Path) -> dict[str, bytes | str]:
    """Every entry of the folders: a link as where it points, a file as its bytes, a folder as "/"."""
    return {str(p): os.readlink(p) if p.is_symlink() else "/" if p.is_dir() else p.read_bytes()
            for folder in folders for p in sorted(folder.iterdir())}


def test_an_output_through_a_symlink_updates_its_target(cli, tmp_path):
    (tmp_path / "build").mkdir()
    target = tmp_path / "build" / "elman.cu"
    target.write_text("old")
    link = tmp_path / "elman.cu"
    link.symlink_to(Path("build") / "elman.cu")
    code, _, err = cli("export", "elman", "-o", link, "--input", 4, "--hidden", 4)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(Path("build") / "elman.cu")
    assert "cellfuse_elman_rnn_forward" in target.read_text()
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == ["elman.cu"]


def test_a_failed_command_leaves_a_symlinked_output_and_its_target(cli, tmp_path, lstm_files):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "y.npz").write_bytes(b"old")
    (tmp_path / "y.npz").symlink_to(tmp_path / "out" / "y.npz")
    bad_cell = write_cell(tmp_path / "bad.cell.json", BAD_CELLS["cycle"][0])
    before = _entries(tmp_path, tmp_path / "out")
    for argv in (["run", "lstm", "--params", lstm_files[1], "--inputs", lstm_files[1]],  # x.npz as parameters
                 ["run", bad_cell, "--params", lstm_files[0], "--inputs", lstm_files[1]],
                 ["init-params", bad_cell]):
        code, _, err = cli(*argv, "-o", tmp_path / "y.npz")
        assert code == 1 and err.startswith("cellfuse: error: "), (argv, err)
        assert _entries(tmp_path, tmp_path / "out") == before, argv


def test_an_output_through_a_symlink_into_a_missing_folder_is_refused_before_any_work(cli, tmp_path):
    link, target = tmp_path / "lstm.cu", tmp_path / "gone" / "lstm.cu"
    link.symlink_to(target)
    code, out, err = cli("export", "lstm", "-o", link)
    assert code == 1 and out == ""
    assert err == f"cellfuse: error: -o {link}: is a symbolic link to {target}, whose folder does not exist\n"
    assert _entries(tmp_path) == {str(link): str(target)}


# -- an output named as another kind of file is refused, unless --force -----------------------------------

_BENCH = ["bench", "elman", "--backend", "numpy", "--seq", 2, "--batch", 1, "--input", 3, "--hidden", 3,
          "--schedules", "graph", "--baselines", "", "--repeats", 1]
_PNG, _SVG, _PDF, _ZIP = b"\x89PNG\r\n\x1a\n", b"<?xml", b"%PDF", b"PK\x03\x04"

# command: (its arguments before the output's name, the output's option, what it writes, a name of the
# right kind with the start of what is written there, a name of another kind with what --force writes there)
OUTPUTS = {
    "templates": (["templates", "gru"], "-o", "a cell file (.cell.json or .json)",
                  ("g.cell.json", b"{"), ("g.npz", b"{")),
    "init-params": (["init-params", "elman", "--input", 3, "--hidden", 4], "-o", "NumPy arrays (.npz)",
                    ("p2.npz", _ZIP), ("p2.cu", _ZIP)),
    "init-inputs": (["init-inputs", "elman", "--seq", 2, "--batch", 2, "--input", 3], "-o",
                    "NumPy arrays (.npz)", ("x2.npz", _ZIP), ("x2.json", _ZIP)),
    "run": (["run", "lstm", "--params", "p.npz", "--inputs", "x.npz"], "-o", "NumPy arrays (.npz)",
            ("y.npz", _ZIP), ("y.png", _ZIP)),
    "export": (["export", "elman", "--input", 4, "--hidden", 4], "-o", "CUDA source (.cu or .cuh)",
               ("e.cu", b"// Elman"), ("params.npz", b"// Elman")),
    "bench --json": (_BENCH, "--json", "a JSON record (.json)", ("r.json", b"{"), ("r.cell.json", b"{")),
    "bench --plot": (_BENCH, "--plot", "a chart (.png or .svg or .pdf)", ("r.svg", _SVG), ("r.npz", _PNG)),
}


@pytest.mark.parametrize("command", sorted(OUTPUTS))
def test_an_output_named_as_another_kind_of_file_is_refused_unless_forced(cli, tmp_path, lstm_files,
                                                                           monkeypatch, command):
    monkeypatch.chdir(tmp_path)  # where lstm_files wrote p.npz and x.npz
    argv, option, writes, (right, right_start), (wrong, forced_start) = OUTPUTS[command]
    target = tmp_path / wrong
    target.write_bytes(b"keep")
    before = sorted(tmp_path.iterdir())
    code, out, err = cli(*argv, option, wrong)
    suffix = ".cell.json" if wrong.endswith(".cell.json") else Path(wrong).suffix
    assert code == 1 and out == ""
    assert err == (f"cellfuse: error: {option} {wrong}: names a {suffix} file, and this command writes "
                   f"{writes}; pass --force to write it anyway\n")
    assert target.read_bytes() == b"keep" and sorted(tmp_path.iterdir()) == before

    code, _, err = cli(*argv, option, wrong, "--force")
    assert code == 0, err
    assert target.read_bytes().startswith(forced_start)

    code, _, err = cli(*argv, option, right)
    assert code == 0, err
    assert (tmp_path / right).read_bytes().startswith(right_start)


@pytest.mark.parametrize("name", ["lstm", "lstm.txt", "lstm.cuh", "LSTM.CU"])
def test_an_output_named_as_no_other_kind_of_file_is_written(cli, tmp_path, name):
    code, _, err = cli("export", "elman", "--input", 4, "--hidden", 4, "-o", tmp_path / name)
    assert code == 0, err
    assert (tmp_path / name).read_text().startswith("// Elman")


@pytest.mark.parametrize("name, start", [("r.png", _PNG), ("r.pdf", _PDF), ("chart", _PNG)])
def test_bench_plot_writes_the_format_its_name_says(cli, tmp_path, name, start):
    code, _, err = cli(*_BENCH, "--plot", tmp_path / name)
    assert code == 0, err
    assert (tmp_path / name).read_bytes().startswith(start)


def test_sizes_too_large_for_memory(cli, tmp_path):
    code, _, err = cli("init-params", "elman", "--hidden", 10**12, "-o", tmp_path / "p.npz")
    assert code == 1 and "cannot make parameters" in err and not (tmp_path / "p.npz").exists()


@pytest.mark.parametrize("argv, words", [
    (["init-params", "lstm", "--layers", "0", "-o", "p.npz"], ["--layers", "at least 1"]),
    (["init-params", "lstm", "--seed", "-1", "-o", "p.npz"], ["--seed", "0 or more"]),
    (["init-inputs", "lstm", "--seq", "ten", "-o", "x.npz"], ["--seq", "'ten'"]),
    (["init-params", "lstm"], ["-o"]),
    (["run", "lstm", "--params", "p.npz", "--inputs", "x.npz", "-o", "y.npz", "--backend", "tpu"],
     ["--backend", "tpu"]),
    (["frobnicate"], ["frobnicate"]),
])
def test_usage_errors(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage:" in err and "Traceback" not in err
    for w in words:
        assert w in err
    assert list(tmp_path.iterdir()) == []


# -- a real process ------------------------------------------------------------------------------

def cellfuse(*argv: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cellfuse", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_whole_session_in_a_real_process(tmp_path):
    steps = [
        ("templates", "mgu", "-o", "m.cell.json"),
        ("validate", "m.cell.json"),
        ("init-params", "m.cell.json", "--layers", "2", "--input", "3", "--hidden", "4", "-o", "p.npz"),
        ("init-inputs", "m.cell.json", "--seq", "5", "--batch", "2", "--input", "3", "-o", "x.npz"),
        ("run", "m.cell.json", "--params", "p.npz", "--inputs", "x.npz", "-o", "y.npz"),
    ]
    for argv in steps:
        r = cellfuse(*argv, cwd=tmp_path)
        assert r.returncode == 0, (argv, r.stderr)
        assert "Traceback" not in r.stderr
    result = load_npz(tmp_path / "y.npz", "outputs")
    assert result["y"].shape == (5, 2, 4) and result["final.h"].shape == (2, 2, 4)


def test_failures_in_a_real_process(tmp_path):
    (tmp_path / "bad.cell.json").write_text(template_text("elman").replace('"tanh"', '"tahn"'))
    r = cellfuse("validate", "bad.cell.json", cwd=tmp_path)
    assert r.returncode == 1 and "node 'h_new'" in r.stderr and "'tahn'" in r.stderr
    assert "Traceback" not in r.stderr
    r = cellfuse("run", "elman", "--params", "none.npz", "--inputs", "none.npz", "-o", "y.npz", cwd=tmp_path)
    assert r.returncode == 1 and "none.npz" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "y.npz").exists()


def test_bench_on_the_numpy_backend_writes_a_record_and_a_chart(cli, tmp_path):
    code, out, err = cli("bench", "gru", "--backend", "numpy", "--seq", T, "--batch", B, "--input", INPUT,
                         "--hidden", HIDDEN, "--layers", 2, "--repeats", 2, "--json", tmp_path / "r.json",
                         "--plot", tmp_path / "r.png")
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["sizes"] == {"seq": T, "batch": B, "input": INPUT, "hidden": HIDDEN, "layers": 2}
    assert [r["name"] for r in record["results"] if r["ok"]] == [
        "naive", "combined", "fused", "hoisted", "graph", "wavefront", "persistent", "tensor",
        "numpy reference"]
    assert "timing, round 2 of 2" in err and "graph" in out and "vs naive" in out
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # two numpy benchmarks
def test_bench_seed_draws_other_weights_and_inputs_and_is_recorded(cli, tmp_path):
    errors = []
    for seed in (0, 3):
        code, out, err = cli("bench", "elman", "--backend", "numpy", "--seq", 3, "--batch", 2, "--input", 4,
                             "--hidden", 4, "--schedules", "graph", "--baselines", "", "--repeats", 1,
                             "--seed", seed, "--json", tmp_path / f"{seed}.json")
        assert code == 0, err
        record = json.loads((tmp_path / f"{seed}.json").read_text())
        assert record["seed"] == seed
        errors.append(record["results"][0]["rel_error"])
    assert errors[0] != errors[1]


@pytest.mark.slow  # a numpy benchmark of each size
def test_bench_sweep(cli, tmp_path):
    code, out, err = cli("bench", "elman", "--backend", "numpy", "--seq", 3, "--input", 4, "--hidden", 4,
                         "--schedules", "naive,graph", "--baselines", "", "--repeats", 1,
                         "--sweep", "batch=1,2", "--json", tmp_path / "s.json", "--plot", tmp_path / "s.png")
    assert code == 0, err
    record = json.loads((tmp_path / "s.json").read_text())
    assert record["param"] == "batch" and [r["sizes"]["batch"] for r in record["results"]] == [1, 2]
    assert [r["name"] for r in record["results"][0]["results"]] == ["naive", "graph"]
    assert out.count("Elman RNN: T=3") == 2 and (tmp_path / "s.png").exists()


@pytest.mark.parametrize("argv, message", [
    (("--sweep", "batch=1,x"), "expected NAME=N,N,... like batch=1,8,64,256"),
    (("--sweep", "width=1,2"), "cannot sweep 'width'"),
    (("--schedules", "naive,fast"), "--schedules: unknown 'fast'; choose from naive"),
    (("--baselines", "cudnn,tensorflow"), "--baselines: unknown 'tensorflow'"),
    (("--baselines", "none"), "flashrnn (--baselines \"\" for none)"),
])
def test_bench_bad_options(cli, tmp_path, argv, message):
    code, out, err = cli("bench", "elman", "--backend", "numpy", "--seq", 2, "--batch", 1, "--input", 3,
                         "--hidden", 3, "--json", tmp_path / "r.json", *argv)
    assert code != 0 and message in err
    assert not (tmp_path / "r.json").exists()


def test_cuda_backend_without_a_gpu_says_what_is_missing(cli, tmp_path):
    from cellfuse.gpu_runtime.bench import available_backends

    if "cuda" in available_backends():
        pytest.skip("this machine can run the CUDA backend")
    code, out, err = cli("bench", "elman", "--backend", "cuda", "--seq", 2, "--batch", 1, "--input", 3,
                         "--hidden", 3)
    assert code == 1 and err.count("\n") == 1
    assert "PyCUDA" in err or "GPU" in err


def test_plan_with_auto_says_which_schedule_it_took(cli):
    code, out, err = cli("plan", "lstm", "--schedule", "auto", "--json")
    assert code == 0, err
    assert "auto: 'graph'" in err and json.loads(out)["schedule"] == "graph"


def test_bench_names_the_best_schedule(cli, tmp_path):
    code, out, err = cli("bench", "elman", "--backend", "numpy", "--seq", 4, "--batch", 2, "--input", 4,
                         "--hidden", 4, "--repeats", 1, "--baselines", "", "--json", tmp_path / "r.json")
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    times = {r["name"]: r["median_ms"] for r in record["results"]}
    assert record["best_schedule"] == min(times, key=times.get)
    assert f"best schedule at these sizes: {record['best_schedule']}" in out
    assert "not run:" not in out and record["left_out"] == {}


def test_bench_says_which_baselines_asked_for_cannot_run_and_why(cli, tmp_path):
    code, out, err = cli("bench", "elman", "--backend", "numpy", "--seq", 2, "--batch", 1, "--input", 3,
                         "--hidden", 3, "--repeats", 1, "--schedules", "graph",
                         "--baselines", "numpy reference,cudnn,pytorch eager", "--json", tmp_path / "r.json")
    assert code == 0, err
    assert "  not run: cudnn, pytorch eager (no GPU/PyTorch on the numpy backend)" in out
    record = json.loads((tmp_path / "r.json").read_text())
    assert set(record["left_out"]) == {"cudnn", "pytorch eager"}
    assert [r["name"] for r in record["results"]] == ["graph", "numpy reference"]


def test_validate_says_which_sizes_a_cell_needs_equal(cli):
    code, out, err = cli("validate", "sru")
    assert code == 0 and err == "", err
    assert "info: node 'highway'" in out and "input size must equal the hidden size" in out


def test_plan_and_export_of_a_wavefront(cli, tmp_path):
    code, out, err = cli("plan", "lstm", "--schedule", "wavefront", "--layers", 3, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["layer_streams"] and summary["hoisted_chunk_steps"] == 10
    code, out, err = cli("plan", "lstm", "--schedule", "wavefront", "--layers", 3)
    assert code == 0 and "each layer's steps run on a stream of their own" in out
    code, out, err = cli("plan", "lstm", "--schedule", "wavefront", "--layers", 1, "--json")
    assert code == 0 and not json.loads(out)["layer_streams"]  # one layer: the graph plan
    code, _, err = cli("export", "lstm", "--schedule", "wavefront", "--layers", 2, "-o", tmp_path / "w.cu")
    text = (tmp_path / "w.cu").read_text()
    assert code == 0, err
    assert "the\n// layers one after another" in text and "cudaLaunchCooperativeKernel(" not in text


def test_bench_train_writes_a_training_record(cli, tmp_path):
    code, out, err = cli("bench", "lstm", "--backend", "numpy", "--train", "--seq", T, "--batch", B,
                         "--input", INPUT, "--hidden", HIDDEN, "--layers", 2, "--repeats", 1,
                         "--schedules", "fused,graph,persistent", "--json", tmp_path / "r.json",
                         "--plot", tmp_path / "r.png")
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["train"] is True and record["measures"].startswith("forward + backward")
    rows = {r["name"]: r for r in record["results"]}
    assert list(rows) == ["fused", "graph", "persistent", "numpy reference"]
    assert all(r["ok"] and r["rel_error"] < 1e-4 for r in rows.values())
    assert "training: forward + backward" in out and "reference gradients" in err
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_train_refuses_a_forward_only_baseline(cli, tmp_path):
    code, out, err = cli("bench", "lstm", "--backend", "numpy", "--train", "--seq", 2, "--batch", 1,
                         "--input", 3, "--hidden", 3, "--baselines", "pytorch graph",
                         "--json", tmp_path / "r.json")
    assert code != 0 and "--baselines with --train: unknown 'pytorch graph'" in err
    assert "choose from numpy reference, pytorch eager, torch.compile" in err
    assert not (tmp_path / "r.json").exists()


def test_export_with_the_backward_pass(cli, tmp_path):
    code, _, err = cli("export", "gru", "--backward", "--layers", 2, "-o", tmp_path / "g.cu")
    assert code == 0, err
    text = (tmp_path / "g.cu").read_text()
    assert "int cellfuse_gru_backward(cublasHandle_t handle, cudaStream_t stream" in text
    assert "central difference" in text and "cellfuse_gru_workspace_bytes" in text
    code, _, err = cli("export", "gru", "--layers", 2, "-o", tmp_path / "f.cu")
    assert code == 0 and "cellfuse_gru_backward" not in (tmp_path / "f.cu").read_text()


def test_export_in_16_bits_writes_the_forward_launcher_of_the_precision(cli, tmp_path):
    code, out, err = cli("export", "lstm", "--precision", "bf16", "--schedule", "persistent",
                         "--input", INPUT, "--hidden", HIDDEN, "-o", tmp_path / "l.cu")
    assert code == 0, err
    text = (tmp_path / "l.cu").read_text()
    assert "the states are stored in 16 bits, but the states h, c in float32" in text
    assert "CUDA_R_16BF" in text and "const float* x" in text  # the launcher's arrays stay float32
    code, _, err = cli("export", "lstm", "--precision", "fp16", "--float32-states", "",
                       "-o", tmp_path / "m.cu")
    assert code == 0, err
    assert "but the states" not in (tmp_path / "m.cu").read_text()
    code, _, err = cli("export", "lstm", "--precision", "bf16", "--float32-states", "", "--lengths",
                       "-o", tmp_path / "k.cu")  # a row's count of steps left stays float32
    assert code == 0 and "but the states cf_len_left in float32" in (tmp_path / "k.cu").read_text(), err
    code, _, err = cli("export", "lstm", "--precision", "bf16", "--backward", "-o", tmp_path / "n.cu")
    assert code == 1 and "leave out --backward to export the forward pass in bf16" in err
    code, _, err = cli("export", "lstm", "--precision", "bf16", "--bidirectional", "-o", tmp_path / "n.cu")
    assert code == 1 and "--bidirectional exports float32 launchers only so far" in err
    code, _, err = cli("export", "lstm", "--float32-states", "c", "-o", tmp_path / "n.cu")
    assert code == 1 and "give --precision bf16 or fp16 with it" in err
    assert not (tmp_path / "n.cu").exists()


def test_bench_lengths_runs_each_row_to_its_own_and_records_them(cli, tmp_path):
    code, out, err = cli("bench", "lstm", "--backend", "numpy", "--seq", 8, "--batch", B, "--input", INPUT,
                         "--hidden", HIDDEN, "--schedules", "graph,persistent", "--baselines", "",
                         "--repeats", 1, "--lengths", "uniform:2-8", "--json", tmp_path / "r.json")
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert len(record["lengths"]) == B and all(2 <= n <= 8 for n in record["lengths"])
    assert [r["ok"] for r in record["results"]] == [True, True]
    assert "each batch row to its own length" in out
    code, out, err = cli("bench", "lstm", "--backend", "numpy", "--seq", 8, "--lengths", "uniform:0-9")
    assert code == 1 and "--lengths uniform:0-9: the lengths must go from at least 1" in err


def test_bench_bidirectional_runs_both_directions_checked_forward_and_in_training(cli, tmp_path):
    """Each schedule's two directions (rows of their own lengths too) against the reference's, forward
    and with --train; the record says so; a stack of layers is sent to cellfuse.nn."""
    for extra in ([], ["--train"]):
        code, out, err = cli("bench", "gru", "--backend", "numpy", "--seq", 6, "--batch", B, "--input", INPUT,
                             "--hidden", HIDDEN, "--schedules", "fused,persistent", "--baselines", "",
                             "--repeats", 1, "--bidirectional", "--lengths", "uniform:2-6", *extra,
                             "--json", tmp_path / "r.json", "--force")
        assert code == 0, err
        record = json.loads((tmp_path / "r.json").read_text())
        assert record["bidirectional"] is True and record["train"] is bool(extra)
        assert [r["ok"] for r in record["results"]] == [True, True]
        assert "both directions of the layer" in out
    code, out, err = cli("bench", "gru", "--backend", "numpy", "--seq", 6, "--layers", 2, "--bidirectional")
    assert code == 1 and "--bidirectional runs one layer, not 2" in err


def test_export_bidirectional_writes_a_launcher_of_both_directions(cli, tmp_path):
    code, out, err = cli("export", "lstm", "-o", tmp_path / "l.cu", "--bidirectional", "--input", INPUT,
                         "--hidden", HIDDEN, "--layers", 1)
    assert code == 0, err
    assert "int cellfuse_lstm_bidirectional_forward(" in (tmp_path / "l.cu").read_text()
    assert "cellfuse_lstm_bidirectional_forward takes the forward direction's parameters" in out
    code, out, err = cli("export", "lstm", "-o", tmp_path / "m.cu", "--bidirectional", "--layers", 2)
    assert code == 1 and "--bidirectional exports one layer, not 2" in err


def test_export_lengths_writes_the_cell_run_to_each_rows_length(cli, tmp_path):
    code, out, err = cli("export", "gru", "-o", tmp_path / "g.cu", "--lengths", "--input", INPUT, "--hidden",
                         HIDDEN)
    assert code == 0, err
    text = (tmp_path / "g.cu").read_text()
    assert "its last state, cf_len_left, starts at the row's length" in text.splitlines()[0]
    assert "cf_len_left" in out


def test_run_and_plan_in_a_16_bit_precision(cli, tmp_path, lstm_files):
    """--precision: run's schedule stores in bf16 (within the stated bound of the reference, and not
    float32's result); plan says what is stored in which type; the reference and persistent rungs say
    why they do not run it."""
    from cellfuse.codegen.precision import forward_tolerance

    params, inputs = lstm_files
    want = run_reference(load_template("lstm"), load_npz(params, "p"), load_npz(inputs, "x"))
    results = {}
    for precision in ("fp32", "bf16"):
        out_path = tmp_path / f"{precision}.npz"
        code, _, err = cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", out_path,
                           "--schedule", "graph", "--precision", precision)
        assert code == 0, err
        results[precision] = load_npz(out_path, "outputs")["y"]
        error = np.abs(results[precision] - want.y).max() / np.abs(want.y).max()
        assert error < forward_tolerance(precision)
    assert np.abs(results["bf16"] - results["fp32"]).max() > 1e-4
    code, _, err = cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", tmp_path / "r.npz",
                       "--precision", "fp16")
    assert code == 1 and "--precision fp16 runs a schedule: name one with --schedule" in err
    code, out, err = cli("plan", "lstm", "--schedule", "graph", "--precision", "fp16", "--json")
    assert code == 0 and json.loads(out)["precision"] == "fp16"
    code, out, err = cli("plan", "lstm", "--schedule", "graph", "--precision", "bf16")
    assert code == 0 and "precision bf16: GEMMs multiply bf16" in out and "kept float32: final.c" in out
    code, out, err = cli("plan", "lstm", "--schedule", "persistent", "--precision", "bf16", "--hidden", 2048)
    assert code == 1 and "the weights of gemm1 do not fit on chip at hidden size 2048" in err


@pytest.mark.slow  # every rung of a 16-bit plan checked and timed on the numpy executor: about 7 s on 2 cores
def test_bench_in_a_16_bit_precision(cli, tmp_path):
    """--precision bf16: every schedule checked within bf16's bound (not float32's result); a rung that
    does not run in it (here: weights too large for the chip) is left out with the reason, not failed;
    training is refused; fp32 as before."""
    from cellfuse.codegen.precision import forward_tolerance, gradient_tolerance

    def heading(out: str) -> str:
        return next(line for line in out.splitlines() if line.startswith("LSTM: "))

    def bench(*extra, hidden=HIDDEN):
        return cli("bench", "lstm", "--backend", "numpy", "--seq", T, "--batch", B, "--input", INPUT,
                   "--hidden", hidden, "--layers", 2, "--schedules", "graph,persistent", "--baselines", "",
                   "--repeats", 1, "--json", tmp_path / "r.json", "--force", *extra)

    code, out, err = bench("--precision", "bf16")
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["precision"] == "bf16" and [r["name"] for r in record["results"]] == ["graph", "persistent"]
    for row in record["results"]:
        assert row["ok"] and 1e-4 < row["rel_error"] < forward_tolerance("bf16")
    assert heading(out).endswith(", in bf16") and record["left_out"] == {}
    code, out, err = bench("--precision", "bf16", "--seq", 2, hidden=2048)
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert list(record["left_out"]) == ["persistent"]
    reason = record["left_out"]["persistent"]
    assert reason.startswith("the weights of gemm1 do not fit on chip") and "float32" in reason
    assert f"  not run: persistent ({reason})" in out
    code, out, err = bench("--precision", "bf16", "--train")
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["precision"] == "bf16" and record["train"]
    for row in record["results"]:  # its gradients rounded, and within the bound of 16-bit gradients
        assert row["ok"] and 1e-4 < row["rel_error"] < gradient_tolerance("bf16")
    code, out, err = bench()
    assert code == 0, err
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["precision"] == "fp32" and record["left_out"] == {}
    assert heading(out).endswith("on CPU (numpy backend, no GPU)")
    assert [(r["name"], r["ok"]) for r in record["results"]] == [("graph", True), ("persistent", True)]


def test_the_states_kept_in_float32_are_chosen_on_the_command_line(cli, tmp_path, lstm_files):
    """--float32-states: none, or c and h, instead of the plan's own choice (c); refused without a 16-bit
    precision, and for a state the cell does not have."""
    code, out, _ = cli("plan", "lstm", "--schedule", "graph", "--precision", "bf16", "--float32-states", "")
    assert code == 0 and "kept float32" not in out and "l0.state.c" in out
    code, out, _ = cli("plan", "lstm", "--schedule", "graph", "--precision", "bf16",
                       "--float32-states", "c,h")
    assert code == 0 and "kept float32: final.c, final.h, init.c, init.h" in out
    params, inputs = lstm_files
    code, _, err = cli("run", "lstm", "--params", params, "--inputs", inputs, "-o", tmp_path / "y.npz",
                       "--schedule", "graph", "--precision", "fp16", "--float32-states", "q")
    assert code == 1 and "float32 states ['q'] are not states of cell 'LSTM'" in err
    code, _, err = cli("plan", "lstm", "--float32-states", "c")
    assert code == 1 and "give --precision bf16 or fp16 with it" in err


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_export_writes_a_kernel_that_spills_as_cellfuse_runs_it(cli, tmp_path):
    """The LSTM's forward kernel on tensor cores that saves its steps for a backward pass spills registers
    at B=256 as planned; the export writes it with its loops over K unrolled 8 at a time, as
    kernel_cache.fitted compiles it, and says so."""
    code, out, err = cli("export", "lstm", "-o", tmp_path / "l.cu", "--backward", "--schedule", "tensor",
                         "--batch", 256, "--input", 512, "--hidden", 512)
    assert code == 0, err
    assert "#pragma unroll 8" in (tmp_path / "l.cu").read_text()
    assert "cf_lstm_persistent spilled" in out and "unrolled 8 at a time" in out


def test_export_without_nvcc_writes_the_kernels_as_planned_and_says_so(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CELLFUSE_CACHE_DIR", str(tmp_path / "cache"))  # (no cubin of these kernels kept)
    code, out, err = cli("export", "lstm", "-o", tmp_path / "l.cu", "--schedule", "persistent", "--input", 7,
                         "--hidden", 9)
    assert code == 0, err
    assert "__global__" in (tmp_path / "l.cu").read_text()
    assert "kernels not checked for spilled registers are written as planned: nvcc could not be run" in err
