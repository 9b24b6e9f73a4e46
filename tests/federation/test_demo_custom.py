"""``fedsbdt demo --data FILE --schema S [--sites N] [--split-by COLUMN]``: a federation of your own CSV file."""
from __future__ import annotations

import json

import pytest

from fedsbdt.cli import main

from .conftest import EXAMPLES


def _lines(path):
    return [ln for ln in path.read_text().splitlines() if ln.strip()]


def test_prepare_splits_a_custom_file_by_a_column_one_site_per_value(tmp_path, capsys):
    data, schema = EXAMPLES / "abalone" / "abalone.data", EXAMPLES / "abalone" / "schema.toml"
    out = tmp_path / "deploy"
    assert main(["demo", "--prepare", str(out), "--data", str(data), "--schema", str(schema),
                 "--split-by", "Sex", "--trees", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["sites"] == ["hospital-1", "hospital-2", "hospital-3"]  # Abalone's Sex: F, I, M
    total = len(_lines(data))
    test = _lines(out / "data" / "test.csv")
    assert len(test) == total // 5 and res["rows"] == total - len(test)
    for sid, sex in zip(res["sites"], "FIM"):
        mine = _lines(out / "data" / sid / "data.csv") + _lines(out / "data" / sid / "eval.csv")
        assert mine and {ln.split(",")[0] for ln in mine} == {sex}, sid
    # --sites 2 with three values: F and M to hospital-1, I to hospital-2 (sorted values in turn)
    out2 = tmp_path / "two"
    assert main(["demo", "--prepare", str(out2), "--data", str(data), "--schema", str(schema),
                 "--split-by", "Sex", "--sites", "2", "--json"]) == 0
    capsys.readouterr()
    assert {ln.split(",")[0] for ln in _lines(out2 / "data" / "hospital-1" / "data.csv")} == {"F", "M"}


@pytest.mark.parametrize("argv,needle", [
    (["--data", "x.csv"], "needs both --data FILE and --schema S"),
    (["--dataset", "adult", "--data", "{data}", "--schema", "{schema}"], "leave it out with --data"),
    (["--data", "{data}", "--schema", "{schema}", "--split-by", "Colour"], "no such column"),
    (["--data", "{data}", "--schema", "{schema}", "--split-by", "Sex", "--sites", "4"], "fewer than the 4 sites"),
])
def test_custom_demo_refusals_are_one_line(tmp_path, capsys, argv, needle):
    fill = {"data": str(EXAMPLES / "abalone" / "abalone.data"), "schema": str(EXAMPLES / "abalone" / "schema.toml")}
    argv = [a.format(**fill) for a in argv]
    assert main(["demo", "--prepare", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "d").exists()  # refused before anything is written


def test_a_query_deals_the_same_records_as_the_file(tmp_path, capsys):
    """``demo --data SOURCE --query Q``: the query's rows (here DuckDB over the bundled file) are dealt to the
    sites exactly as the file's lines are (equal values; a number may be spelt 0.0 for 0)."""
    from fedsbdt.common.data import load
    from fedsbdt.common.schema import Schema

    data, schema = EXAMPLES / "abalone" / "abalone.data", EXAMPLES / "abalone" / "schema.toml"
    common = ["--schema", str(schema), "--split-by", "Sex", "--json"]
    assert main(["demo", "--prepare", str(tmp_path / "q"), "--data", str(data), "--query", "SELECT * FROM data",
                 *common]) == 0
    assert main(["demo", "--prepare", str(tmp_path / "f"), "--data", str(data), *common]) == 0
    capsys.readouterr()
    s = Schema.load(schema)
    for sid in ("hospital-1", "hospital-2", "hospital-3"):
        for part in ("data.csv", "eval.csv"):
            q, f = (load(tmp_path / d / "data" / sid / part, s) for d in ("q", "f"))
            assert q.n == f.n > 0 and (q.X == f.X).all() and (q.y == f.y).all(), (sid, part)
    assert main(["demo", "--prepare", str(tmp_path / "x"), "--data", str(data), "--query", "SELECT 1"]) == 2
    assert "needs both --data and --schema" in capsys.readouterr().err
