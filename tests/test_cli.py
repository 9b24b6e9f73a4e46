"""The command-line contract of design.md, exercised as a user would (separate processes)."""
import json
import subprocess
import sys

import pytest

from conftest import ABALONE, ADULT, ADULT_TEST, EXAMPLES, ROOT


def run(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``fedsbdt train --json`` on Abalone (30 trees, ε = 1), run once for the module: (model file, stdout)."""
    model = tmp_path_factory.mktemp("abalone-model") / "m.json"
    p = run("train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"),
            "--out", str(model), "--epsilon", "1", "--trees", "30", "--depth", "2", "--json")
    return model, p.stdout


@pytest.fixture
def abalone_model(trained):
    """The module's Abalone model, for the tests that only need a model."""
    return trained[0]


def test_train_evaluate_predict_account_json(tmp_path, trained):
    model, stdout = trained
    out = json.loads(stdout)  # exactly one JSON object on stdout
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


def test_quiet_train_prints_the_result_in_one_line(tmp_path):
    """``--quiet`` (issue 36): the result and nothing else; it printed 11 lines (the auto settings' reasons)."""
    model = tmp_path / "m.json"
    p = run("train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--out", str(model),
            "--trees", "3", "--quiet")
    assert p.stdout.splitlines() == [f"trained 3 trees on 4177 rows: (ε=1, δ=5e-08)-DP; model written to {model}"]
    assert p.stderr == "" and model.exists()
    p = run("train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--out", str(model),
            "--trees", "3")
    assert len(p.stdout.splitlines()) > 3 and "because:" in p.stdout  # without it: the settings and their reasons


def test_binary_evaluate_keys(tmp_path):
    model = tmp_path / "m.json"
    run("train", "--data", str(ADULT), "--schema", str(EXAMPLES / "adult/schema.toml"),
        "--out", str(model), "--epsilon", "1", "--trees", "20", "--depth", "3", "--quiet")
    ev = json.loads(run("evaluate", "--model", str(model), "--data", str(ADULT_TEST),
                        "--json").stdout)
    assert set(ev) == {"n", "auc", "accuracy", "dropped", "baseline", "beats_baseline"} and ev["auc"] > 0.6
    # the majority-class baseline of the test file (adult.test: 76.4 % "<=50K."), beside the metric
    assert ev["baseline"] == {"predictor": "majority class", "value": "<=50K", "accuracy": pytest.approx(0.7543, abs=1e-3),
                              "auc": 0.5}
    assert ev["beats_baseline"] == (ev["accuracy"] > ev["baseline"]["accuracy"])
    assert ev["dropped"] > 0  # adult.test has rows with '?'
    p = tmp_path / "p.csv"
    res = json.loads(run("predict", "--model", str(model), "--data", str(ADULT_TEST), "--out", str(p),
                         "--threshold", "0.3", "--json").stdout)
    assert res["threshold"] == 0.3 and res["dropped"] == ev["dropped"] and res["n"] == ev["n"]
    import pandas as pd

    frame = pd.read_csv(p)
    assert set(frame["prediction"]) <= {">50K", "<=50K"}  # the schema's labels, not 0/1
    assert ((frame["probability"] >= 0.3) == (frame["prediction"] == ">50K")).all()
    text = run("evaluate", "--model", str(model), "--data", str(ADULT_TEST)).stdout
    assert "baseline: always predicting the majority class '<=50K' gives accuracy=" in text
    assert f"({ev['dropped']} rows with a missing value dropped)" in text


def test_evaluate_says_when_a_model_does_not_beat_the_mean_predictor(tmp_path):
    """A model trained with almost no budget on a few trees: its RMSE is worse than predicting the mean."""
    model = tmp_path / "m.json"
    run("train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--out", str(model),
        "--epsilon", "0.01", "--trees", "2", "--depth", "2", "--init-share", "0", "--quiet")
    ev = json.loads(run("evaluate", "--model", str(model), "--data", str(ABALONE), "--json").stdout)
    assert ev["baseline"]["predictor"] == "mean" and ev["baseline"]["rmse"] == pytest.approx(3.2238, abs=1e-3)
    assert ev["rmse"] > ev["baseline"]["rmse"] and ev["beats_baseline"] is False
    text = run("evaluate", "--model", str(model), "--data", str(ABALONE)).stdout
    assert "the model does not beat this baseline" in text


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


def test_predict_keep_copies_chosen_input_columns_into_the_predictions(tmp_path, abalone_model):
    """``predict --keep COL[,COL]`` (repeatable; issue 36): input columns as written, after the id, for the
    records predicted (a dropped row's values go with it); a missing column or a clash is one line, exit 2."""
    import pandas as pd

    rows = [r for r in ABALONE.read_text().splitlines() if r.strip()][:20]
    labelled = tmp_path / "labelled.csv"
    labelled.write_text("\n".join(rows) + "\n")
    out = tmp_path / "p.csv"
    res = json.loads(run("predict", "--model", str(abalone_model), "--data", str(labelled), "--out", str(out),
                         "--keep", "Sex,Length", "--keep", "Rings", "--json").stdout)
    assert res["kept"] == ["Sex", "Length", "Rings"] and res["n"] == 20
    got = pd.read_csv(out, dtype=str)
    assert list(got.columns) == ["id", "Sex", "Length", "Rings", "prediction"]
    assert got[["Sex", "Length", "Rings"]].values.tolist() == [r.split(",")[:2] + [r.split(",")[-1]] for r in rows]
    plain = tmp_path / "plain.csv"
    run("predict", "--model", str(abalone_model), "--data", str(labelled), "--out", str(plain))
    assert got["prediction"].tolist() == pd.read_csv(plain, dtype=str)["prediction"].tolist()
    # a dropped row (missing value, on_missing = "drop") takes its kept values with it
    schema = (EXAMPLES / "abalone/schema.toml").read_text().replace("[format]\n",
                                                                   '[format]\nmissing = "?"\non_missing = "drop"\n')
    (tmp_path / "s.toml").write_text(schema)
    model = tmp_path / "m.json"
    run("train", "--data", str(labelled), "--schema", str(tmp_path / "s.toml"), "--out", str(model), "--trees", "2",
        "--quiet")
    holes = list(rows)
    holes[3] = ",".join(["?"] + rows[3].split(",")[1:])
    (tmp_path / "holes.csv").write_text("\n".join(holes) + "\n")
    run("predict", "--model", str(model), "--data", str(tmp_path / "holes.csv"), "--out", str(out), "--keep", "Length")
    got = pd.read_csv(out, dtype=str)
    assert got["id"].tolist() == [str(i) for i in range(20) if i != 3]
    assert got["Length"].tolist() == [r.split(",")[1] for i, r in enumerate(rows) if i != 3]
    # a query (DuckDB over the file): the kept columns as the query returns them
    run("predict", "--model", str(abalone_model), "--data", str(labelled), "--query",
        "SELECT * FROM data WHERE Sex = 'M'", "--out", str(out), "--keep", "Sex,Rings")
    got = pd.read_csv(out, dtype=str)
    males = [r.split(",") for r in rows if r.startswith("M,")]
    assert list(got.columns) == ["id", "Sex", "Rings", "prediction"] and len(got) == len(males) > 0
    assert got["Sex"].tolist() == ["M"] * len(males) and got["Rings"].tolist() == [r[-1] for r in males]
    # refusals: one line, exit 2, nothing written
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(r.rsplit(",", 1)[0] for r in rows) + "\n")
    for keep, needle in (("Rings", "no column 'Rings' to keep"), ("prediction", "--keep 'prediction': the "
                         "predictions file has a column 'prediction' already"), ("Sex,,Length", "--keep takes column "
                         "names separated by commas")):
        target = tmp_path / "refused.csv"
        p = run("predict", "--model", str(abalone_model), "--data", str(bare), "--out", str(target), "--keep", keep,
                ok=False)
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert not target.exists()


def test_corrupt_model_file(tmp_path):
    m = tmp_path / "m.json"
    m.write_text('{"format": "fedsbdt-model", "version": 99}')
    p = run("evaluate", "--model", str(m), "--data", str(ABALONE), ok=False)
    assert p.returncode == 2 and "version" in p.stderr
    m.write_text("{not json")
    assert "not valid JSON" in run("evaluate", "--model", str(m), "--data", "x", ok=False).stderr


def test_predict_scores_records_without_labels(tmp_path, abalone_model):
    """New patients have no outcome: predict reads files with or without the label column (CSV, Parquet),
    keeps the schema's id column, and evaluate still insists on labels."""
    import pandas as pd

    schema = (EXAMPLES / "abalone/schema.toml").read_text()
    rows = ABALONE.read_text().splitlines()[:50]
    # with an id column (header file): the ids as written come back in the output
    head = "pid,Sex,Length,Diameter,Height,Whole_weight,Shucked_weight,Viscera_weight,Shell_weight,Rings"
    cols = head.split(",")
    (tmp_path / "ids.toml").write_text(schema.replace("columns = [", 'id_column = "pid"\ncolumns = ["pid", ')
                                       .replace("header = false", "header = true"))
    labelled = tmp_path / "labelled.csv"
    labelled.write_text(head + "\n" + "\n".join(f"p-{i:03d},{r}" for i, r in enumerate(rows)) + "\n")
    model = tmp_path / "m.json"
    run("train", "--data", str(labelled), "--schema", str(tmp_path / "ids.toml"), "--out", str(model),
        "--trees", "5", "--quiet")
    frame = pd.read_csv(labelled, dtype={"pid": str})
    frame.drop(columns=["Rings"]).to_csv(tmp_path / "new.csv", index=False)
    frame.drop(columns=["Rings"]).to_parquet(tmp_path / "new.parquet")
    outs = {}
    for name in ("labelled.csv", "new.csv", "new.parquet"):
        out = tmp_path / f"{name}.pred.csv"
        res = json.loads(run("predict", "--model", str(model), "--data", str(tmp_path / name), "--out", str(out),
                             "--json").stdout)
        assert res == {"n": 50, "dropped": 0, "out": str(out), "id": "pid"}
        outs[name] = pd.read_csv(out, dtype={"pid": str})
    assert list(outs["new.csv"].columns) == ["pid", "prediction"]
    assert outs["new.csv"]["pid"].tolist() == [f"p-{i:03d}" for i in range(50)]
    pd.testing.assert_frame_equal(outs["new.csv"], outs["labelled.csv"])
    pd.testing.assert_frame_equal(outs["new.parquet"], outs["labelled.csv"])
    p = run("evaluate", "--model", str(model), "--data", str(tmp_path / "new.csv"), ok=False)
    assert p.returncode == 2 and "missing column(s) 'Rings'" in p.stderr and "Traceback" not in p.stderr
    assert cols[-1] == "Rings"
    # no header, no id column: the row number as "id", one field fewer than the training file
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(r.rsplit(",", 1)[0] for r in rows) + "\n")
    run("predict", "--model", str(abalone_model), "--data", str(bare), "--out", str(tmp_path / "bare.pred.csv"))
    lines = (tmp_path / "bare.pred.csv").read_text().splitlines()
    assert lines[0] == "id,prediction" and lines[1].startswith("0,") and len(lines) == 51
    # a schema with an id column, a file without it: row numbers instead of a refusal (CSV with a header)
    frame.drop(columns=["Rings", "pid"]).to_csv(tmp_path / "no-id.csv", index=False)
    res = json.loads(run("predict", "--model", str(model), "--data", str(tmp_path / "no-id.csv"), "--out",
                         str(tmp_path / "no-id.pred.csv"), "--json").stdout)
    assert res["id"] == "row number" and res["n"] == 50
    no_id = pd.read_csv(tmp_path / "no-id.pred.csv")
    assert no_id["id"].tolist() == list(range(50))
    assert no_id["prediction"].tolist() == outs["new.csv"]["prediction"].tolist()
    p = run("predict", "--model", str(model), "--data", str(tmp_path / "no-id.csv"), "--out",
            str(tmp_path / "x.csv"), "--threshold", "0.5", ok=False)
    assert p.returncode == 2 and "--threshold is for binary models" in p.stderr


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_unusable_out_paths_are_one_line_and_leave_nothing(tmp_path, log_format, abalone_model):
    """--out '.', an existing folder, a missing folder: exit 2, one line naming the path given, no traceback,
    no stray DIR.tmp; train refuses before it trains (no privacy spent for a model it cannot write)."""
    model = abalone_model
    folder = tmp_path / "models"
    folder.mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    cases = {
        ".": "is a folder, not a file name for the {}",
        str(folder): "is a folder, not a file name for the {}",
        "/nonexistent/dir/x.json": "folder /nonexistent/dir does not exist",
    }
    commands = {
        "model": ["train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--trees", "3"],
        "predictions": ["predict", "--model", str(model), "--data", str(ABALONE)],
        "XGBoost model": ["export", "--model", str(model), "--format", "xgboost"],
    }
    for what, cmd in commands.items():
        for out, needle in cases.items():
            p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "--log-format", log_format, *cmd, "--out", out],
                               capture_output=True, text=True, cwd=tmp_path, timeout=300)
            assert p.returncode == 2, (cmd, out, p.stderr)
            err = p.stderr.strip().splitlines()
            assert len(err) == 1 and "Traceback" not in p.stderr and p.stdout == "", (cmd, out, p.stderr)
            line = json.loads(err[0])["msg"] if log_format == "json" else err[0]
            assert f"error: {out}" in line and needle.format(what) in line, line
            assert ".tmp" not in line and "progress" not in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing left behind


def test_a_failed_write_leaves_nothing_and_names_the_given_path(tmp_path, monkeypatch):
    """The disk fills up at the last step: the temporary file goes, the message names the user's path."""
    import errno
    import os

    from fedsbdt.common.files import OutputError, write_atomic

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    target = tmp_path / "m.json"
    with pytest.raises(OutputError) as e:
        write_atomic(target, "{}", "model")
    assert str(e.value) == f"{target}: cannot write the model: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_inside_a_numba_dispatcher_still_counts_as_an_interrupt():
    """SIGTERM landing while numba unpickles a compiled kernel surfaces as a SystemError caused by the
    KeyboardInterrupt (seen as exit 1 in a fresh-clone run); the CLI treats it as the interrupt (exit 130)."""
    from fedsbdt.common.cli import caused_by_interrupt

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise SystemError("CPUDispatcher(...) returned a result with an exception set") from k
    except SystemError as e:
        assert caused_by_interrupt(e)
    assert not caused_by_interrupt(SystemError("a real internal error"))
    assert caused_by_interrupt(KeyboardInterrupt())
