"""``fedsbdt schema draft``: a starting schema from a site's own data, every data-derived value marked."""
import json
import subprocess
import sys
import tomllib

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedsbdt.common.data import load
from fedsbdt.common.schema import Schema, SchemaError
from fedsbdt.common.schema_draft import round_outward


def fedsbdt(*args):
    return subprocess.run([sys.executable, "-m", "fedsbdt.cli", *args], capture_output=True, text=True)


@pytest.fixture
def table(tmp_path):
    rng = np.random.default_rng(0)
    n = 200
    frame = pd.DataFrame({
        "pid": np.arange(n) + 1000,
        "age": rng.uniform(18.3, 93.7, n).round(1),
        "ward": rng.choice(list("ABCDEFGHIJKL"), n),
        "flag": rng.integers(0, 2, n),
        "lab": np.where(rng.random(n) < 0.1, "", rng.normal(5, 1, n).round(2).astype(str)),
        "y": rng.choice(["yes", "no"], n, p=[0.3, 0.7]),
    })
    frame.to_csv(tmp_path / "d.csv", index=False)
    return frame


@pytest.mark.parametrize("lo,hi,want", [((18.3, 93.7), None, (10, 100)), ((0.012, 0.087), None, (0.01, 0.09)),
                                        ((-3.2, 4.1), None, (-4, 5)), ((5, 5), None, (5, 6)),
                                        ((1, 29), None, (0, 30)), ((0.0, 1.0), None, (0, 1))])
def test_round_outward(lo, hi, want):
    a, b = round_outward(*lo)
    assert (a, b) == want and a <= lo[0] and b >= lo[1]


def test_draft_marks_every_data_derived_value_and_loads_its_data(tmp_path, table):
    out = tmp_path / "s.toml"
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "d.csv"), "--target", "y", "--id-column", "pid",
                "--max-levels", "20", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"out": str(out), "task": "binary", "features": 4, "rows": 200,
                                    "id_column": "pid", "left_out": []}
    text = out.read_text()
    d = tomllib.loads(text)
    for line in text.splitlines():  # every value that came from the records says so
        if line.split("=")[0].strip() in ("task", "positive", "negative", "type", "range", "levels", "allow_missing"):
            assert "# data-derived" in line, line
    assert "18.3" not in text and "93.7" not in text  # no observed extreme written down
    f = {x["name"]: x for x in d["features"]}
    assert f["age"]["range"] == [10, 100] and f["ward"]["levels"] == list("ABCDEFGHIJKL")
    assert f["flag"]["type"] == "categorical" and f["lab"]["allow_missing"] is True
    assert d["positive"] == ["yes"] and d["id_column"] == "pid"
    ds = load(tmp_path / "d.csv", Schema.load(out, allow_data_derived=True))  # it describes the data it came from
    assert ds.n == 200 and ds.ids[0] == 1000
    # the loader sees the marks: each table lists its data-derived keys
    assert d["data_derived"] == ["positive", "negative"]
    assert f["age"]["data_derived"] == ["range"] and f["ward"]["data_derived"] == ["levels"]
    assert f["lab"]["data_derived"] == ["range", "allow_missing"]


def test_draft_over_sql_and_the_other_level(tmp_path, table):
    table.to_parquet(tmp_path / "d.parquet")
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "d.parquet"), "--query", "SELECT age, ward, y FROM data",
                "--target", "age", "--max-levels", "5")
    assert p.returncode == 0, p.stderr
    d = tomllib.loads(p.stdout)
    assert d["task"] == "regression" and d["label_range"] == [10, 100]
    assert len(d["features"][0]["levels"]) == 5 and d["features"][0]["levels"][-1] == "other"
    assert d["features"][1]["levels"] == ["no", "yes"]


def test_draft_refusals(tmp_path, table):
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "d.csv"), "--target", "outcome")
    assert p.returncode == 2 and "--target 'outcome' is not a column" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "d.csv"), "--target", "ward", "--max-levels", "5")
    assert p.returncode == 2 and "12 distinct values" in p.stderr
    (tmp_path / "ids.csv").write_text("pid,y\n1,a\n2,b\n3,a\n")
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "ids.csv"), "--target", "y")
    assert p.returncode == 2 and p.stderr.strip().endswith("no column is left for a feature: besides the target 'y' "
                                                           "the data holds only record ids ('pid': a distinct value "
                                                           "in every row)")


def drafted(tmp_path) -> Path:
    out = tmp_path / "s.toml"
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "d.csv"), "--target", "y", "--id-column", "pid",
                "--max-levels", "20", "--out", str(out))
    assert p.returncode == 0, p.stderr
    return out


def test_a_drafted_schema_is_refused_by_the_loader_naming_the_marked_keys(tmp_path, table):
    out = drafted(tmp_path)
    with pytest.raises(SchemaError) as e:
        Schema.load(out)
    msg = str(e.value)
    assert msg == (f"{out}: positive, negative, features age (range), ward (levels), flag (levels), lab (range, "
                   "allow_missing) are still marked data-derived by `fedsbdt schema draft`; replace them with public "
                   "knowledge (reference ranges, code lists) and delete the data_derived marks "
                   "(docs/data-sources.md#drafting-a-schema)")
    # the operator replaces the values and deletes the marks: an ordinary schema (the marks are no part of it)
    public = tmp_path / "public.toml"
    public.write_text("".join(ln for ln in out.read_text().splitlines(keepends=True)
                              if not ln.startswith("data_derived")))
    assert Schema.load(public).digest() == Schema.load(out, allow_data_derived=True).digest()
    # a misspelt mark is refused, never taken for no mark
    public.write_text(out.read_text().replace('data_derived = ["levels"]', 'data_derived = ["level"]', 1))
    with pytest.raises(SchemaError, match="data_derived in features\\[1\\] names 'level', which is not one of"):
        Schema.load(public, allow_data_derived=True)


def test_train_tune_plan_client_and_demo_refuse_a_draft_until_its_marks_are_deleted(tmp_path, table, capsys):
    from fedsbdt.cli import main

    out = drafted(tmp_path)
    data = str(tmp_path / "d.csv")
    sites = [a for i in range(3) for a in ("--site", f"s{i}={bytes([i + 1]).hex() * 32}")]
    assert main(["keygen", "--site", "s0", "--out", str(tmp_path / "st")]) == 0
    capsys.readouterr()
    written = [tmp_path / n for n in ("m.json", "t.json", "p.toml")]
    commands = {
        "train": ["train", "--data", data, "--schema", str(out), "--out", str(written[0]), "--trees", "2"],
        "tune": ["tune", "--data", data, "--schema", str(out), "--epsilon", "1", "--out", str(written[1])],
        "plan": ["plan", "--schema", str(out), *sites, "--rows", "500", "--out", str(written[2])],
        "client": ["client", "--coordinator", "127.0.0.1:9", "--site", "s0", "--data", data, "--plan-hash",
                   "ab" * 32, "--state", str(tmp_path / "st"), "--insecure", "--schema", str(out)],
        "demo": ["demo", "--data", data, "--schema", str(out), "--workdir", str(tmp_path / "demo")],
    }
    for name, argv in commands.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fedsbdt {name}: error: {out}: positive, negative, features age "
                                                   "(range)"), (name, err)
        assert "still marked data-derived by `fedsbdt schema draft`" in err[0]
    assert not any(p.exists() for p in written) and not (tmp_path / "demo").exists()
    out.write_text("".join(ln for ln in out.read_text().splitlines(keepends=True) if not ln.startswith("data_derived")))
    assert main(commands["plan"]) == 0 and written[2].exists()


@pytest.fixture
def with_ids(tmp_path):
    rng = np.random.default_rng(1)
    n = 60
    frame = pd.DataFrame({
        "hospital_id": rng.integers(1, 4, n),  # named like an id, but repeats: a feature
        "age": rng.uniform(20, 80, n).round(1),
        "PatientID": rng.permutation(n) + 5000,  # a distinct whole number in every row, named like an id
        "visit": [f"v{k:04d}" for k in rng.permutation(n)],  # a distinct text in every row
        "y": rng.choice(["0", "1"], n),
    })
    frame.to_csv(tmp_path / "ids.csv", index=False)
    return frame


def test_draft_detects_the_record_id_and_leaves_other_ids_out(tmp_path, with_ids):
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "ids.csv"), "--target", "y", "--json", "--out",
                str(tmp_path / "s.toml"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["id_column"] == "PatientID" and json.loads(p.stdout)["left_out"] == ["visit"]
    text = (tmp_path / "s.toml").read_text()
    d = tomllib.loads(text)
    assert d["id_column"] == "PatientID"
    assert [f["name"] for f in d["features"]] == ["hospital_id", "age"]
    assert "# detected: a distinct whole number in every row and is named like an id" in text
    assert '# left out: "visit" looks like a record id (a distinct text in every row)' in text
    ds = load(tmp_path / "ids.csv", Schema.load(tmp_path / "s.toml", allow_data_derived=True))
    assert sorted(ds.ids) == sorted(with_ids["PatientID"])  # the ledger's key is the patient
    # --id-column chooses: the detected one is then left out like any other id-like column
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "ids.csv"), "--target", "y", "--id-column", "visit")
    d = tomllib.loads(p.stdout)
    assert d["id_column"] == "visit" and [f["name"] for f in d["features"]] == ["hospital_id", "age"]
    assert '# left out: "PatientID" looks like a record id' in p.stdout


def test_a_person_id_that_repeats_is_left_out_and_few_rows_are_not_taken_for_ids(tmp_path):
    pd.DataFrame({"subject_id": [1, 1, 2, 3, 4, 5], "dose": [3, 5, 7, 9, 11, 13],
                  "y": ["a", "b", "a", "b", "a", "b"]}).to_csv(tmp_path / "r.csv", index=False)
    p = fedsbdt("schema", "draft", "--data", str(tmp_path / "r.csv"), "--target", "y", "--max-levels", "3")
    assert p.returncode == 0, p.stderr
    d = tomllib.loads(p.stdout)
    assert "id_column" not in d and [f["name"] for f in d["features"]] == ["dose"]  # 6 distinct doses: a feature
    assert '# left out: "subject_id" looks like a record id (named like a record id but repeating' in p.stdout


def test_out_dash_prints_the_schema_and_writes_no_file(tmp_path, table):
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "schema", "draft", "--data", "d.csv",
                        "--target", "y", "--out", "-"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert tomllib.loads(p.stdout)["target"] == "y" and p.stderr == ""
    assert not (tmp_path / "-").exists()
