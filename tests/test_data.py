"""Schemas and data loading: the UCI files read unchanged; every kind of bad input is refused clearly."""
import numpy as np
import pandas as pd
import pytest

from fedsbdt.common.data import DataError, Dataset, load
from fedsbdt.common.schema import Schema, SchemaError

from conftest import ADULT_TEST, EXAMPLES

TOY = """
name = "toy"
task = "binary"
target = "label"
positive = ["yes"]
negative = ["no"]
id_column = "pid"
[format]
header = true
separator = ","
missing = "NA"
[[features]]
name = "age"
type = "numeric"
range = [0, 120]
[[features]]
name = "ward"
type = "categorical"
levels = ["A", "B"]
"""


@pytest.fixture
def toy_schema(tmp_path):
    p = tmp_path / "schema.toml"
    p.write_text(TOY)
    return Schema.load(p)


def write(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_uci_files_read_unchanged(abalone, adult):
    assert abalone.X.shape == (4177, 8) and abalone.schema.task == "regression"
    assert abalone.y.min() == 1 and abalone.y.max() == 29
    assert adult.n == 30162 and adult.dropped == 2399  # the reference protocol's rows
    assert adult.y.mean() == pytest.approx(7508 / 30162)
    test = load(ADULT_TEST, adult.schema)  # comment line, labels with a trailing period
    assert test.n == 15060 and set(np.unique(test.y)) == {0.0, 1.0}


def test_parquet_equals_csv(tmp_path, toy_schema):
    p = write(tmp_path, "pid,age,ward,label\n7,30,A,yes\n9,50.5,B,no\n")
    a = load(p, toy_schema)
    pd.read_csv(p).to_parquet(tmp_path / "d.parquet")
    b = load(tmp_path / "d.parquet", toy_schema)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.ids, b.ids)
    assert a.ids.tolist() == [7, 9]


@pytest.mark.parametrize("body,needle", [
    ("pid,age,ward,label\n1,30,A,yes\n2,abc,B,no\n", "line 3, column 'age': 'abc' is not a number"),
    ("pid,age,ward,label\n1,30,A,yes\n2,nan,B,no\n", "line 3, column 'age'"),
    ("pid,age,ward,label\n1,inf,A,yes\n", "line 2, column 'age'"),
    ("pid,age,ward,label\n1,130,A,yes\n", "outside the public range [0, 120]"),
    ("pid,age,ward,label\n1,30,C,yes\n", "unknown category 'C'"),
    ("pid,age,ward,label\n1,30,A,maybe\n", "'maybe' is not a class label"),
    ("pid,age,ward,label\n1,30,A,yes\n1,31,B,no\n", "duplicate record ids"),
    ("pid,age,ward,label\n1,NA,A,yes\n", "line 2: missing value 'NA'"),
    ("pid,age,label\n1,30,yes\n", "missing column(s) 'ward'"),
    ("pid,age,ward,label\n", "no data rows"),
    ("", "no data rows"),
    ("pid,age,ward,label\n1,30,A,yes,extra,fields\n", "line 2: expected 4 fields as in the header, found 6"),
])
def test_bad_csv_is_refused_with_file_line_and_column(tmp_path, toy_schema, body, needle):
    p = write(tmp_path, body)
    with pytest.raises(DataError) as e:
        load(p, toy_schema)
    assert needle in str(e.value)
    assert str(p) in str(e.value)


def test_binary_garbage_and_missing_files(tmp_path, toy_schema):
    p = tmp_path / "x.csv"
    p.write_bytes(b"\x89PNG\x00\x01\x02")
    with pytest.raises(DataError, match="not UTF-8|NUL"):
        load(p, toy_schema)
    with pytest.raises(DataError, match="not found"):
        load(tmp_path / "nope.csv", toy_schema)
    q = tmp_path / "bad.parquet"
    q.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="Parquet"):
        load(q, toy_schema)


def test_regression_labels_outside_public_range(tmp_path):
    s = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    p = write(tmp_path, "M,0.4,0.3,0.1,0.5,0.2,0.1,0.15,31\n")
    with pytest.raises(DataError, match="outside the public label range"):
        load(p, s)
    p = write(tmp_path, "M,0.4,0.3,0.1,0.5,0.2,0.1,0.15\n")
    with pytest.raises(DataError, match="expected 9 fields"):
        load(p, s)


def test_dropped_rows_are_counted_in_words(tmp_path):
    s = Schema.from_dict(Schema.load(EXAMPLES / "adult" / "schema.toml").to_dict())
    one = "39, State-gov, 77516, Bachelors, 13, Never-married, ?, Not-in-family, White, Male, 2174, 0, 40, " \
          "United-States, <=50K\n"
    with pytest.raises(DataError, match="no rows left after dropping 1 row with missing values$"):
        load(write(tmp_path, one), s)
    with pytest.raises(DataError, match="no rows left after dropping 2 rows with missing values$"):
        load(write(tmp_path, one * 2), s)


ABALONE_ROW = "M,0.455,0.365,0.095,0.514,0.2245,0.101,0.15,15"


@pytest.mark.parametrize("rows,labels,message", [
    ([ABALONE_ROW, ABALONE_ROW + ",7", ABALONE_ROW],  # an extra column
     True, "line 2: expected 9 fields (Sex, Length, Diameter, Height, Whole_weight, Shucked_weight, Viscera_weight, "
           "Shell_weight, Rings), found 10"),
    ([ABALONE_ROW, ABALONE_ROW.rsplit(",", 1)[0]], True, "line 2: expected 9 fields (Sex, Length, Diameter, Height, "
     "Whole_weight, Shucked_weight, Viscera_weight, Shell_weight, Rings), found 8"),
    ([ABALONE_ROW] * 3 + ["1,2"] * 4, True, "line 4: expected 9 fields (Sex, Length, Diameter, Height, "
     "Whole_weight, Shucked_weight, Viscera_weight, Shell_weight, Rings), found 2 (and 3 more such lines)"),
    ([ABALONE_ROW.rsplit(",", 1)[0], ABALONE_ROW], False, "line 2: expected 8 fields like line 1, found 9"),
    (["1,2,3"], False, "line 1: expected 9 fields (Sex, Length, Diameter, Height, Whole_weight, Shucked_weight, "
     "Viscera_weight, Shell_weight, Rings) or 8 without the label 'Rings', found 3"),
])
def test_wrong_field_counts_name_file_line_expected_and_found(tmp_path, rows, labels, message):
    s = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    p = write(tmp_path, "\n".join(rows) + "\n")
    with pytest.raises(DataError) as e:
        load(p, s, labels=labels)
    assert str(e.value) == f"{p}: {message}"


@pytest.mark.parametrize("separator", [",", ", ", ";", "\t"])
def test_field_counts_without_quotes_equal_the_csv_modules(separator):
    """Lines without a quote are counted by their separators; with a quote anywhere, the csv module reads them:
    both give csv.reader's counts (empty fields, spaces, a quoted separator included)."""
    import csv
    import random

    from fedsbdt.common.data import _field_counts
    from fedsbdt.common.schema import FileFormat

    rng = random.Random(4)
    sep = separator.strip() or separator
    lines = [separator.join(rng.choice(["", " ", "a", "1.5", " x y", "'q'"]) for _ in range(rng.randint(1, 9)))
             for _ in range(300)]
    lines = [ln for ln in lines if ln.strip()]
    quoted = lines + [separator.join(["a", f'"b{sep}c"', "d"])]
    fmt = FileFormat(separator=separator)
    for texts in (lines, quoted):
        want = [len(r) for r in csv.reader(texts, delimiter=sep, skipinitialspace=separator != sep)]
        assert _field_counts(iter(texts), fmt).tolist() == want
    assert _field_counts([quoted[-1]], fmt).tolist() == [3]


def test_another_data_set_is_refused_with_the_field_counts():
    """Adult's file given to the Abalone schema: not pandas' wording, but file, line, expected and found."""
    s = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    with pytest.raises(DataError) as e:
        load(EXAMPLES / "adult" / "adult.data", s)
    assert str(e.value).startswith(f"{EXAMPLES / 'adult' / 'adult.data'}: line 1: expected 9 fields (Sex, ")
    assert str(e.value).endswith("Rings), found 15 (and 32560 more such lines)")


def test_features_only_files_load_for_prediction(tmp_path, toy_schema):
    """labels=False: the target column may be absent (CSV with header, Parquet) or present (ignored)."""
    full = write(tmp_path, "pid,age,ward,label\n7,30,A,yes\n9,50.5,B,maybe\n")
    bare = write(tmp_path, "pid,age,ward\n7,30,A\n9,50.5,B\n", "bare.csv")
    pd.read_csv(bare).to_parquet(tmp_path / "bare.parquet")
    a, b, c = (load(p, toy_schema, labels=False) for p in (full, bare, tmp_path / "bare.parquet"))
    for d in (a, b, c):
        assert d.y is None and d.n == 2
        np.testing.assert_array_equal(d.X, [[30, 0], [50.5, 1]])
        assert d.ids.tolist() == [7, 9] and [str(v) for v in d.id_values] == ["7", "9"]
    with pytest.raises(DataError, match="missing column\\(s\\) 'label'"):
        load(bare, toy_schema)  # training and evaluation still need the labels
    s = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    p = write(tmp_path, ABALONE_ROW.rsplit(",", 1)[0] + "\n", "abalone.csv")  # no header: one field fewer
    assert load(p, s, labels=False).X.shape == (1, 8)
    with pytest.raises(DataError, match="expected 9 fields"):
        load(p, s)


@pytest.mark.parametrize("patch,needle", [
    ("task = \"binary\"", None),
    ("task = \"clustering\"", "task must be one of"),
])
def test_schema_task_validation(tmp_path, patch, needle):
    p = tmp_path / "s.toml"
    p.write_text(TOY.replace('task = "binary"', patch))
    if needle is None:
        Schema.load(p)
    else:
        with pytest.raises(SchemaError, match=needle):
            Schema.load(p)


@pytest.mark.parametrize("text,needle", [
    ("this is = not toml [", "not valid TOML"),
    (TOY.replace("range = [0, 120]", "range = [5, 1]"), "lo < hi"),
    (TOY.replace('levels = ["A", "B"]', 'levels = ["A", "A"]'), "duplicate levels"),
    (TOY.replace('target = "label"', 'target = "age"'), "also listed as a feature"),
    (TOY.replace("header = true", "header = false"), "needs 'columns'"),
    (TOY.replace('type = "numeric"', 'type = "float"'), "type must be"),
])
def test_malformed_schema(tmp_path, text, needle):
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(SchemaError, match=needle):
        Schema.load(p)


def test_from_arrays_validates(toy_schema):
    ok = Dataset.from_arrays(np.array([[30.0, 0], [40.0, 1]]), np.array(["yes", "no"]), toy_schema)
    assert ok.y.tolist() == [1.0, 0.0]
    with pytest.raises(DataError, match="level code"):
        Dataset.from_arrays(np.array([[30.0, 2]]), np.array(["yes"]), toy_schema)
    with pytest.raises(DataError, match="feature columns"):
        Dataset.from_arrays(np.array([[30.0]]), np.array(["yes"]), toy_schema)


def test_schema_digest_is_stable(abalone):
    assert abalone.schema.digest() == Schema.from_dict(abalone.schema.to_dict()).digest()


def test_arrival_column_for_non_iid_streams(tmp_path):
    text = TOY.replace('id_column = "pid"', 'id_column = "pid"\narrival_column = "when"')
    (tmp_path / "s.toml").write_text(text)
    s = Schema.load(tmp_path / "s.toml")
    ds = load(write(tmp_path, "pid,age,ward,label,when\n1,30,A,yes,0\n2,40,B,no,25\n"), s)
    assert ds.arrival.tolist() == [0, 25]
    assert ds.subset(np.array([1])).arrival.tolist() == [25]
    with pytest.raises(DataError, match="'when': '-1' is not a round number"):
        load(write(tmp_path, "pid,age,ward,label,when\n1,30,A,yes,-1\n"), s)
    (tmp_path / "s2.toml").write_text(TOY.replace('id_column = "pid"', 'id_column = "pid"\narrival_column = "age"'))
    with pytest.raises(SchemaError, match="must not be a feature"):
        Schema.load(tmp_path / "s2.toml")
