"""Missing values (docs/missing-values.md): schema, loading, public default directions, and one routing in
training, prediction, the model file, the XGBoost export and the scikit-learn estimators."""
import csv
import dataclasses
import json
import subprocess
import sys
import tomllib

import numpy as np
import pandas as pd
import pytest
import xgboost as xgb

from fedsbdt.common import kernels
from fedsbdt.common.boosting import LocalData, split_edges
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.data import DataError, Dataset, load
from fedsbdt.common.engine import train
from fedsbdt.common.estimators import PublicBoundsError, SBDTClassifier
from fedsbdt.common.export_xgboost import export_xgboost
from fedsbdt.common.federation.toml_writer import dumps
from fedsbdt.common.model import Ensemble, ModelError, Tree
from fedsbdt.common.schema import Schema, SchemaError
from fedsbdt.common.splits import missing_directions, random_splits
from conftest import ADULT, ADULT_TEST, EXAMPLES, ROOT, insecure


def adult_dict(**fmt) -> dict:
    d = tomllib.loads((EXAMPLES / "adult" / "schema.toml").read_text())
    d["format"].update(fmt)
    return d


@pytest.fixture(scope="module")
def keep_schema() -> Schema:
    return Schema.from_dict(adult_dict(on_missing="keep"))


@pytest.fixture(scope="module")
def adult_keep(keep_schema) -> Dataset:
    return load(ADULT, keep_schema)


def question_marks(path, columns) -> tuple[int, dict[str, int]]:
    """Independent count of the raw file: data rows and ``?`` fields per column (csv module, no pandas)."""
    rows, counts = 0, dict.fromkeys(columns, 0)
    with open(path) as fh:
        for rec in csv.reader(fh, skipinitialspace=True):
            if len(rec) != len(columns):  # blank lines and the test file's "|1x3 ..." comment
                continue
            rows += 1
            for c, v in zip(columns, rec):
                counts[c] += v.strip() == "?"
    return rows, counts


# --------------------------------------------------------------------------- schema and loading


def test_keep_allows_missing_in_every_feature_and_round_trips(keep_schema):
    assert all(f.allow_missing for f in keep_schema.features) and keep_schema.allows_missing
    again = Schema.from_dict(keep_schema.to_dict())
    assert again == keep_schema and again.digest() == keep_schema.digest()
    drop = Schema.from_dict(adult_dict())
    assert not drop.allows_missing
    assert "allow_missing" not in json.dumps(drop.to_dict())  # schemas without missing values are unchanged


@pytest.mark.parametrize("path", [ADULT, ADULT_TEST])
def test_adult_keeps_every_row_and_marks_exactly_the_question_marks(keep_schema, path):
    ds = load(path, keep_schema)
    rows, counts = question_marks(path, keep_schema.columns)
    assert ds.n == rows and ds.dropped == 0 and rows in (32561, 16281)
    nan = np.isnan(ds.X).sum(axis=0)
    assert dict(zip(keep_schema.feature_names, nan.tolist())) == {f: counts[f] for f in keep_schema.feature_names}
    assert nan.sum() > 0


def test_per_feature_allow_missing_with_drop_for_the_others():
    d = adult_dict(on_missing="drop")
    for f in d["features"]:
        if f["name"] == "native-country":
            f["allow_missing"] = True
    schema = Schema.from_dict(d)
    ds = load(ADULT, schema)
    # expected: rows with '?' outside native-country are dropped, its own '?' are kept as NaN
    raw = pd.read_csv(ADULT, header=None, names=list(schema.columns), skipinitialspace=True, dtype=str)
    other = (raw.drop(columns="native-country") == "?").any(axis=1)
    assert ds.n == int((~other).sum()) and ds.dropped == int(other.sum())
    assert np.isnan(ds.X[:, 13]).sum() == int(((raw["native-country"] == "?") & ~other).sum()) > 0
    assert not np.isnan(np.delete(ds.X, 13, axis=1)).any()


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["features"][0].update(allow_missing="yes"), "allow_missing must be true or false"),
    (lambda d: d["format"].update(on_missing="impute"), "format.on_missing must be one of 'error', 'drop', 'keep'"),
])
def test_bad_missing_configuration_is_one_clear_line(change, needle):
    d = adult_dict()
    change(d)
    with pytest.raises(SchemaError) as e:
        Schema.from_dict(d)
    assert needle in str(e.value) and "\n" not in str(e.value)


def toy_schema(**fmt) -> Schema:
    return Schema.from_dict({
        "task": "binary", "target": "y", "format": {"header": True, "missing": "?", **fmt},
        "features": [{"name": "a", "type": "numeric", "range": [0, 10], "allow_missing": True},
                     {"name": "c", "type": "categorical", "levels": ["u", "v"], "allow_missing": True},
                     {"name": "b", "type": "numeric", "range": [0, 10]}]})


def test_csv_and_parquet_markers_of_missing_values(tmp_path):
    schema = toy_schema()
    p = tmp_path / "d.csv"
    p.write_text("a,c,b,y\n?,u,1,0\n,?,2,1\nNaN,,3,0\n4.5,v,4,1\n")
    ds = load(p, schema)
    assert np.isnan(ds.X[:3, 0]).all() and ds.X[3, 0] == 4.5
    assert ds.X[0, 1] == 0 and np.isnan(ds.X[1:3, 1]).all() and ds.X[3, 1] == 1
    assert ds.X[:, 2].tolist() == [1, 2, 3, 4]
    q = tmp_path / "d.parquet"
    pd.DataFrame({"a": [np.nan, 2.0], "c": [None, "v"], "b": [1.0, 2.0], "y": ["0", "1"]}).to_parquet(q)
    dq = load(q, schema)
    assert np.isnan(dq.X[0, :2]).all() and dq.X[1].tolist() == [2.0, 1.0, 2.0]
    # dictionary-encoded strings and nullable integers (pandas Categorical / Int64 columns)
    pd.DataFrame({"a": pd.array([None, 3], dtype="Int64"), "c": pd.Categorical(["v", None]), "b": [1.0, 2.0],
                  "y": ["0", "1"]}).to_parquet(q)
    dq = load(q, schema)
    assert np.isnan(dq.X[0, 0]) and np.isnan(dq.X[1, 1]) and dq.X[0, 1] == 1 and dq.X[1, 0] == 3


@pytest.mark.parametrize("body,needle", [
    ("a,c,b,y\n1,u,?,0\n", "line 2: missing value '?'"),  # b does not allow missing values
    ("a,c,b,y\n1,u,,0\n", "line 2, column 'b': '' is not a number"),
    ("a,c,b,y\ninf,u,1,0\n", "line 2, column 'a': inf (NaN/inf) is not allowed"),  # inf is a value, not missing
    ("a,c,b,y\n1,w,1,0\n", "unknown category 'w'"),
    ("a,c,b,y\n1,u,1,?\n", "line 2: missing value '?'"),  # labels are never missing
])
def test_missing_where_not_allowed_keeps_the_clear_error(tmp_path, body, needle):
    p = tmp_path / "d.csv"
    p.write_text(body)
    with pytest.raises(DataError) as e:
        load(p, toy_schema())
    assert needle in str(e.value)


KEEP = "; to keep missing values, set allow_missing = true on feature 'b' (docs/missing-values.md), or on_missing"
DROP = "; to drop such rows, set on_missing = \"drop\" in the schema's [format]"
CLIP = "; to clip such values to the public range, set out_of_range = \"clip\" in the schema's [format]"


@pytest.mark.parametrize("body,message,hint", [
    # a missing value names the setting that keeps it (or drops its row); a wrong value names none
    ("a,c,b,y\n1,u,?,0\n", "line 2: missing value '?'", KEEP),
    ("a,c,b,y\n1,u,,0\n", "line 2, column 'b': '' is not a number", KEEP),
    ("a,c,b,y\n1,u,nan,0\n", "line 2, column 'b': nan (NaN/inf) is not allowed", KEEP),
    ("a,c,b,y\n1,u,1,?\n", "line 2: missing value '?'", DROP),  # a label: never kept
    ("a,c,b,y\n1,u,11,0\n", "line 2, column 'b': 11 is outside the public range [0, 10]", CLIP),
    ("a,c,b,y\n1,u,abc,0\n", "line 2, column 'b': 'abc' is not a number", ""),
    ("a,c,b,y\n1,u,inf,0\n", "line 2, column 'b': inf (NaN/inf) is not allowed", ""),
])
def test_a_refused_value_names_the_schema_setting_that_would_accept_it(tmp_path, body, message, hint):
    p = tmp_path / "d.csv"
    p.write_text(body)
    with pytest.raises(DataError) as e:
        load(p, toy_schema())
    text = str(e.value)
    assert text.startswith(f"{p}: {message}") and "\n" not in text
    if hint:
        assert text[len(f"{p}: {message}"):].startswith(hint), text
    else:
        assert text == f"{p}: {message}"


def test_nan_in_arrays_where_not_allowed_is_refused(adult):
    X = adult.X[:50].copy()
    X[3, 0] = np.nan
    with pytest.raises(DataError, match=r"row 4, column 'age': nan \(NaN/inf\) is not allowed"):
        Dataset.from_arrays(X, adult.y[:50], adult.schema)


# --------------------------------------------------------------------------- public default directions


def test_directions_are_public_fair_coins_and_leave_the_splits_unchanged(keep_schema):
    drop = Schema.from_dict(adult_dict())
    assert missing_directions(drop, 7, 0, 63) is None
    flips = []
    for r in range(200):
        a, b = random_splits(keep_schema, 6, 7, r, False, 32), random_splits(drop, 6, 7, r, False, 32)
        assert np.array_equal(a.features, b.features) and np.array_equal(a.thresholds, b.thresholds)
        assert b.default_left is None and a.default_left.shape == (63,)
        assert np.array_equal(a.default_left, missing_directions(keep_schema, 7, r, 63))  # recomputable
        flips.append(a.default_left)
    flips = np.concatenate(flips)
    n = flips.size
    assert abs(flips.sum() - n / 2) < 5 * np.sqrt(n / 4)  # a fair coin (5σ)
    assert not np.array_equal(missing_directions(keep_schema, 8, 0, 63), missing_directions(keep_schema, 7, 0, 63))


def reference_leaf(x, features, thresholds, default_left, is_cat, depth) -> int:
    """The routing rule in plain Python: numeric left iff x < t, categorical left iff x == level, NaN by
    its default direction."""
    k = 0
    for _ in range(depth):
        f, t = features[k], thresholds[k]
        v = x[f]
        left = bool(default_left[k]) if np.isnan(v) else (v == t if is_cat[f] else v < t)
        k = 2 * k + (1 if left else 2)
    return k - (2**depth - 1)


def test_kernels_and_local_codes_route_missing_values_like_the_reference(adult_keep):
    schema, depth = adult_keep.schema, 5
    is_cat = np.array([f.is_categorical for f in schema.features])
    X = adult_keep.X[:3000].copy()
    rng = np.random.default_rng(1)
    X[rng.random(X.shape) < 0.1] = np.nan  # missing values in numeric columns too
    hp = Hyperparameters(depth=depth, split_candidates=32)
    local = LocalData(X, adult_keep.y[:3000], np.arange(3000), "binary", hp, None, None, is_cat,
                      edges=split_edges(schema, 32))
    trees = []
    for r in range(6):
        sp = random_splits(schema, depth, 3, r, False, 32)
        want = np.array([reference_leaf(x, sp.features, sp.thresholds, sp.default_left, is_cat, depth) for x in X])
        np.testing.assert_array_equal(kernels.leaf_index(X, sp.features, sp.thresholds, is_cat, depth,
                                                         default_left=sp.default_left), want)
        np.testing.assert_array_equal(local.leaf_index(sp), want)
        trees.append(Tree(sp.features, sp.thresholds, rng.normal(size=2**depth), sp.default_left))
    model = Ensemble(schema, hp, 0.25, trees)
    want = 0.25 + hp.learning_rate * sum(
        t.leaves[kernels.leaf_index(X, t.features, t.thresholds, is_cat, depth, default_left=t.default_left)]
        for t in trees)
    np.testing.assert_allclose(model.predict_margin(X), want, rtol=0, atol=1e-12)
    # the directions matter: all-right routing differs on rows with missing values
    right = Ensemble(schema, hp, 0.25, [dataclasses.replace(t, default_left=None) for t in trees])
    assert (right.predict_margin(X) != model.predict_margin(X)).any()


def test_model_file_keeps_the_directions(adult_keep, tmp_path):
    model = train(adult_keep.subset(np.arange(2000)), Hyperparameters(trees=5, depth=3)).model
    assert all(t.default_left is not None for t in model.trees)
    model.save(tmp_path / "m.json")
    again = Ensemble.load(tmp_path / "m.json")
    for a, b in zip(model.trees, again.trees, strict=True):
        assert np.array_equal(a.default_left, b.default_left)
    X = adult_keep.X[:2000]
    assert np.array_equal(again.predict(X), model.predict(X))
    d = json.loads((tmp_path / "m.json").read_text())
    d["trees"][0]["default_left"] = [1, 0, 1]
    with pytest.raises(ModelError, match="default_left must be 7 booleans"):
        Ensemble.from_dict(d)


# --------------------------------------------------------------------------- greedy trees


@pytest.mark.parametrize("missing_label", [1.0, 0.0])
def test_greedy_exponential_mechanism_picks_the_direction_from_the_data(missing_label):
    """x < 0.5 ⇔ y = 1; a third of x is missing, with label ``missing_label``: the best (split, direction)
    pair sends the missing records to the side holding their label (a fixed or random rule would not)."""
    schema = Schema.from_dict({"task": "binary", "target": "y", "format": {"header": True},
                               "features": [{"name": "x", "type": "numeric", "range": [0, 1],
                                             "allow_missing": True}]})
    rng = np.random.default_rng(5)
    x = rng.random(3000)
    y = (x < 0.5).astype(float)
    gone = rng.random(3000) < 1 / 3
    x[gone], y[gone] = np.nan, missing_label
    hp = Hyperparameters(tree_builder="greedy", trees=1, depth=1, subsample=1.0, split_candidates=15,
                         epsilon=1.0, init_share=0.0)
    labels = np.where(y > 0, "1", "0")
    model = train(Dataset.from_arrays(x[:, None], labels, schema), hp, randomness=insecure(noise=False)).model
    t = model.trees[0]
    assert t.thresholds[0] == 0.5 and t.default_left[0] == bool(missing_label)
    p = model.predict(np.array([[np.nan]]))[0]
    assert (p > 0.5) == bool(missing_label)  # the missing side's leaf agrees with its label


def test_greedy_histogram_selection_sends_missing_values_right(adult_holes, tmp_path):
    hp = Hyperparameters(tree_builder="greedy", selection="histogram", trees=3, depth=3, subsample=1.0)
    model = train(adult_holes, hp).model
    assert all(not t.default_left.any() for t in model.trees)  # as the noisy histograms scored them
    export_xgboost(model, tmp_path / "m.json")
    theirs = xgb.Booster(model_file=str(tmp_path / "m.json")).predict(xgb.DMatrix(adult_holes.X))
    assert np.abs(theirs - model.predict(adult_holes.X)).max() <= 1e-6


# --------------------------------------------------------------------------- XGBoost export


@pytest.fixture(scope="module")
def adult_holes(adult_keep):
    """Adult (3000 rows) with its own missing categories plus 15% missing ages and hours."""
    X = adult_keep.X[:3000].copy()
    rng = np.random.default_rng(2)
    for j in (0, 12):
        X[rng.random(3000) < 0.15, j] = np.nan
    return Dataset.from_arrays(X, np.where(adult_keep.y[:3000] > 0, ">50K", "<=50K"), adult_keep.schema)


@pytest.mark.parametrize("builder", ["random", "greedy"])
@pytest.mark.parametrize("categorical", ["native", "numeric"])
def test_xgboost_predicts_what_we_predict_on_missing_values(adult_holes, builder, categorical, tmp_path):
    hp = Hyperparameters(tree_builder=builder, trees=25, depth=4, epsilon=1.0,
                         **({"subsample": 1.0} if builder == "greedy" else {}))
    model = train(adult_holes, hp).model
    assert all(t.default_left is not None for t in model.trees)
    export_xgboost(model, tmp_path / "m.json", categorical=categorical)
    booster = xgb.Booster(model_file=str(tmp_path / "m.json"))
    X = adult_holes.X
    rows = np.isnan(X).any(axis=1)
    assert rows.sum() > 500
    ours, theirs = model.predict(X), booster.predict(xgb.DMatrix(X)).astype(np.float64)
    assert np.abs(ours - theirs).max() <= 1e-6
    # and the exported directions carry weight: with every default flipped XGBoost disagrees on missing rows
    flipped = Ensemble(model.schema, model.hyperparameters, model.init_score,
                       [dataclasses.replace(t, default_left=~t.default_left) for t in model.trees])
    export_xgboost(flipped, tmp_path / "f.json", categorical=categorical)
    other = xgb.Booster(model_file=str(tmp_path / "f.json")).predict(xgb.DMatrix(X)).astype(np.float64)
    assert np.abs(other[rows] - ours[rows]).max() > 1e-3
    np.testing.assert_allclose(other[~rows], ours[~rows], rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- scikit-learn


def test_estimator_accepts_nan_and_predicts_like_the_model():
    rng = np.random.default_rng(0)
    n = 2000
    X = np.column_stack([rng.random(n), rng.integers(0, 3, n).astype(float), rng.random(n)])
    y = ((X[:, 0] > 0.5) ^ (X[:, 1] == 1)).astype(int)
    X[rng.random(n) < 0.2, 0] = np.nan
    X[rng.random(n) < 0.2, 1] = np.nan
    kw = dict(feature_ranges=[(0, 1), None, (0, 1)], categorical={1: 3}, trees=20, depth=3, epsilon=5.0)
    clf = SBDTClassifier(allow_missing=True, **kw).fit(X, y)
    assert clf.__sklearn_tags__().input_tags.allow_nan
    np.testing.assert_array_equal(clf.predict_proba(X)[:, 1], clf.model_.predict(X))
    assert all(t.default_left is not None for t in clf.model_.trees)
    with pytest.raises(ValueError, match="(?i)nan"):  # the existing errors, for either column
        SBDTClassifier(**kw).fit(X, y)
    X_num = X.copy()
    X_num[np.isnan(X_num[:, 1]), 1] = 0.0  # NaN in the numeric column only
    with pytest.raises(ValueError, match="Input contains NaN"):  # scikit-learn's own message
        SBDTClassifier(**kw).fit(X_num, y)
    with pytest.raises(PublicBoundsError, match="allow_missing must be True or False"):
        SBDTClassifier(allow_missing="yes", **kw).fit(X, y)


def test_estimator_with_a_schema_takes_none_and_nan_in_a_frame(keep_schema):
    raw = pd.read_csv(ADULT, header=None, names=list(keep_schema.columns), skipinitialspace=True,
                      na_values=["?"], keep_default_na=False, nrows=3000)
    X = raw[keep_schema.feature_names].astype(object).where(raw[keep_schema.feature_names].notna(), None)
    y = (raw["income"] == ">50K").astype(int)
    assert X.isna().any().any()
    clf = SBDTClassifier(schema=keep_schema, trees=10, depth=3).fit(X, y)
    p = clf.predict_proba(X)[:, 1]
    assert np.isfinite(p).all()
    ds = load(ADULT, keep_schema)
    np.testing.assert_array_equal(p, clf.model_.predict(ds.X[:3000]))


# --------------------------------------------------------------------------- command line


def test_cli_trains_and_evaluates_with_missing_rows_kept(tmp_path, keep_schema):
    schema = tmp_path / "schema.toml"
    schema.write_text(dumps(keep_schema.to_dict()))
    model = tmp_path / "m.json"

    def run(*args):
        return subprocess.run([sys.executable, "-m", "fedsbdt.cli", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)

    p = run("train", "--data", str(ADULT), "--schema", str(schema), "--out", str(model), "--trees", "10",
            "--depth", "3", "--quiet")
    assert p.returncode == 0, p.stderr
    assert all("default_left" in t for t in json.loads(model.read_text())["trees"])
    ev = run("evaluate", "--model", str(model), "--data", str(ADULT_TEST), "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["n"] == 16281
    strict = tmp_path / "strict.toml"
    strict.write_text(dumps(Schema.from_dict(adult_dict(on_missing="error")).to_dict()))
    p = run("train", "--data", str(ADULT), "--schema", str(strict), "--out", str(tmp_path / "d.json"), "--quiet")
    assert p.returncode == 2 and "missing value '?'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "d.json").exists()


def test_pair_gains_equal_brute_force_and_keep_the_sensitivity():
    """The (split, direction) scores of a node equal eq. 2 computed side by side from the records, and adding
    or removing any one record (missing or not) moves no score by more than 3g*² (Li et al. Lemma 2)."""
    from fedsbdt.common.builders import pair_gains, score_sensitivity
    gs, lam = 0.5, 1.0
    edges = np.array([0.2, 0.4, 0.6, 0.8])
    rng = np.random.default_rng(4)

    def brute(x, g):
        out = []
        for default_left in (False, True):
            for e in edges:
                left = np.where(np.isnan(x), default_left, x < e)
                out.append(sum(s**2 / (k + lam) for s, k in ((g[left].sum(), left.sum()),
                                                                (g[~left].sum(), (~left).sum()))))
        return np.array(out)

    def ours(x, g):
        m = np.isnan(x)
        GL = np.array([g[~m & (x < e)].sum() for e in edges])
        NL = np.array([(~m & (x < e)).sum() for e in edges], float)
        return pair_gains(GL, NL, g[m].sum(), float(m.sum()), g.sum(), float(x.size), lam)

    worst = 0.0
    for _ in range(30):
        n = int(rng.integers(5, 40))
        x = rng.random(n)
        x[rng.random(n) < 0.3] = np.nan
        g = rng.choice([-gs, gs], n) * rng.random(n) ** 0.2
        s = ours(x, g)
        np.testing.assert_allclose(s, brute(x, g), rtol=1e-12, atol=1e-12)
        for i in range(n):  # remove record i
            worst = max(worst, np.abs(ours(np.delete(x, i), np.delete(g, i)) - s).max())
        for xv in (np.nan, 0.1, 0.5, 0.9):  # add a record, missing or not, with an extreme gradient
            for gv in (-gs, gs):
                worst = max(worst, np.abs(ours(np.append(x, xv), np.append(g, gv)) - s).max())
    assert 0 < worst <= score_sensitivity(gs)
