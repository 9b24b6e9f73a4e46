"""The command-line contract of design.md, exercised as a user would (separate processes)."""
import json
import subprocess
import sys

import pytest

from conftest import ABALONE, ADULT, ADULT_TEST, EXAMPLES, ROOT


def run(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "common.cli", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def test_train_evaluate_predict_account_json(tmp_path):
    model = tmp_path / "m.json"
    p = run("train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"),
            "--out", str(model), "--epsilon", "1", "--trees", "30", "--depth", "2", "--json")
    out = json.loads(p.stdout)  # exactly one JSON object on stdout
    assert {"epsilon", "delta", "sigma", "alpha", "trees", "seconds"} <= set(out)
    assert out["trees"] == 30 and out["epsilon"] <= 1.0
    ev = json.loads(run("evaluate", "--model", str(model), "--data", str(ABALONE),
                        "--json").stdout)
    assert ev["n"] == 4177 and 1.0 < ev["rmse"] < 4.0
    pred = tmp_path / "p.csv"
    run("predict", "--model", str(model), "--data", str(ABALONE), "--out", str(pred))
    lines = pred.read_text().splitlines()
    assert lines[0] == "id,prediction" and len(lines) == 4178
    acc = json.loads(run("account", "--epsilon", "0.105", "--trees", "150", "--subsample", "0.1",
                         "--json").stdout)
    assert set(acc) >= {"sigma", "alpha", "rho", "epsilon"}
    assert acc["epsilon"] <= 0.105


def test_binary_evaluate_keys(tmp_path):
    model = tmp_path / "m.json"
    run("train", "--data", str(ADULT), "--schema", str(EXAMPLES / "adult/schema.toml"),
        "--out", str(model), "--epsilon", "1", "--trees", "20", "--depth", "3", "--quiet")
    ev = json.loads(run("evaluate", "--model", str(model), "--data", str(ADULT_TEST),
                        "--json").stdout)
    assert set(ev) == {"n", "auc", "accuracy"} and ev["auc"] > 0.6


@pytest.mark.parametrize("args,needle", [
    (["account", "--epsilon", "-1"], "epsilon"),
    (["account", "--subsample", "1.5"], "γ must be in (0, 1]"),
    (["account", "--r1", "1"], "r1"),
    (["account", "--filter", "--accountant", "pld"], "RDP accountant"),
    (["evaluate", "--model", "/nonexistent.json", "--data", "x.csv"], "model file not found"),
])
def test_errors_are_one_clear_line_and_status_2(args, needle):
    p = run(*args, ok=False)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_bad_data_leaves_no_model(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("M,0.4,0.3,0.1,0.5,0.2,0.1,0.15,oops\n")
    model = tmp_path / "m.json"
    p = run("train", "--data", str(bad), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--out", str(model),
            ok=False)
    assert p.returncode == 2 and "line 1" in p.stderr and "Rings" in p.stderr
    assert not model.exists()


def test_corrupt_model_file(tmp_path):
    m = tmp_path / "m.json"
    m.write_text('{"format": "fedsbdt-model", "version": 99}')
    p = run("evaluate", "--model", str(m), "--data", str(ABALONE), ok=False)
    assert p.returncode == 2 and "version" in p.stderr
    m.write_text("{not json")
    assert "not valid JSON" in run("evaluate", "--model", str(m), "--data", "x", ok=False).stderr
