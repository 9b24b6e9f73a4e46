"""``fedsbdt schema draft``: a starting schema from a site's own data, every data-derived value marked."""
import json
import subprocess
import sys
import tomllib

import numpy as np
import pandas as pd
import pytest

from fedsbdt.common.data import load
from fedsbdt.common.schema import Schema
from fedsbdt.common.schema_draft import round_outward


def fedsbdt(*args):
    return subprocess.run([sys.executable, "-m", "fedsbdt.common.cli", *args], capture_output=True, text=True)


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
    assert json.loads(p.stdout) == {"out": str(out), "task": "binary", "features": 4, "rows": 200}
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
    ds = load(tmp_path / "d.csv", Schema.load(out))  # the draft describes the data it came from
    assert ds.n == 200 and ds.ids[0] == 1000


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
