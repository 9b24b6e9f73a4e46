"""``fedsbdt explain`` (common/explain.py): SHAP contributions of a released model, checked against two
independent oracles — XGBoost's own TreeSHAP (``pred_contribs``) on the exported model, and Shapley values
computed by brute force over every coalition — and the command's output, files and errors."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import xgboost as xgb

from conftest import ABALONE, EXAMPLES
from fedsbdt.cli import main
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.engine import train
from fedsbdt.common.explain import contributions, importance, public_box_sample, tree_shap
from fedsbdt.common.export_xgboost import export_xgboost
from fedsbdt.common.model import Ensemble, Tree
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import random_splits


def xgb_contribs(model: Ensemble, X: np.ndarray, tmp_path) -> np.ndarray:
    path = tmp_path / "m.xgb.json"
    export_xgboost(model, path)
    return xgb.Booster(model_file=str(path)).predict(xgb.DMatrix(X), pred_contribs=True)


@pytest.fixture(scope="module")
def models(abalone, adult):
    return {"abalone": (train(abalone, Hyperparameters(epsilon=4.0, trees=40, depth=4, cyclical=False)).model,
                        abalone.X[:300]),
            "adult": (train(adult, Hyperparameters(epsilon=1.0, trees=40, depth=5, cyclical=False)).model,
                      adult.X[:300])}


@pytest.mark.parametrize("name", ["abalone", "adult"])
def test_contributions_equal_xgboost_pred_contribs_and_add_up_to_the_prediction(models, name, tmp_path):
    model, X = models[name]
    c = contributions(model, X)
    theirs = xgb_contribs(model, X, tmp_path)
    scale = np.abs(c.values).max()
    assert scale > 0.01  # the model is not flat: the comparison means something
    np.testing.assert_allclose(c.values, theirs[:, :-1], rtol=0, atol=1e-5 * max(scale, 1.0))
    np.testing.assert_allclose(c.bias[0], theirs[:, -1], rtol=0, atol=1e-5 * max(abs(c.bias[0]), 1.0))
    out = model.predict(X) if model.task == "regression" else model.predict_margin(X)  # label / log-odds
    np.testing.assert_allclose(c.bias[0] + c.values.sum(axis=1), out, rtol=0, atol=1e-9)


def brute_force_shapley(model: Ensemble, x: np.ndarray) -> np.ndarray:
    """Shapley values of ``v(S) = η·Σ_t E[v_t | x_S]`` by enumerating every coalition S, where a node on a
    feature outside S sends half of the weight to each child (the released model's equal covers)."""
    F = len(model.schema.features)
    is_cat = model.is_categorical()

    def value(tree: Tree, node: int, level: int, S: frozenset) -> float:
        if level == model.depth:
            return float(tree.leaves[node - (2**model.depth - 1)])
        f, t = int(tree.features[node]), float(tree.thresholds[node])
        left = value(tree, 2 * node + 1, level + 1, S)
        right = value(tree, 2 * node + 2, level + 1, S)
        if f not in S:
            return 0.5 * (left + right)
        goes_left = (x[f] == t) if is_cat[f] else (x[f] < t)
        return left if goes_left else right

    def v(S: frozenset) -> float:
        return model.hyperparameters.learning_rate * sum(value(t, 0, 0, S) for t in model.trees)

    phi = np.zeros(F)
    for i in range(F):
        others = [j for j in range(F) if j != i]
        for k in range(F):
            for S in itertools.combinations(others, k):
                w = math.factorial(k) * math.factorial(F - k - 1) / math.factorial(F)
                phi[i] += w * (v(frozenset(S) | {i}) - v(frozenset(S)))
    return phi


def test_contributions_equal_shapley_values_by_brute_force_on_trees_that_reuse_features():
    """Random public trees over 4 features at depth 4: features repeat along paths (the case the closed form
    must get right); numeric and categorical splits."""
    schema = Schema.from_dict({"task": "binary", "target": "y", "features": [
        {"name": "a", "type": "numeric", "range": [0, 1]}, {"name": "b", "type": "numeric", "range": [-5, 5]},
        {"name": "c", "type": "categorical", "levels": ["x", "y", "z"]},
        {"name": "d", "type": "numeric", "range": [0, 100]}]})
    rng = np.random.default_rng(7)
    trees = [Tree(s.features, s.thresholds, rng.uniform(-2, 2, 16))
             for s in (random_splits(schema, 4, 11, r) for r in range(6))]
    model = Ensemble(schema, Hyperparameters(depth=4, learning_rate=0.3), -0.2, trees)
    assert any(len(set(t.features[[0, 1, 3, 7]])) < 4 for t in trees)  # some path repeats a feature
    X = public_box_sample(model, 12, seed=3)
    c = contributions(model, X)
    for i in range(len(X)):
        np.testing.assert_allclose(c.values[i], brute_force_shapley(model, X[i]), rtol=0, atol=1e-12)


def test_missing_values_follow_each_node_s_default_direction(tmp_path):
    schema = Schema.from_dict({"task": "binary", "target": "y", "features": [
        {"name": "a", "type": "numeric", "range": [0, 1], "allow_missing": True},
        {"name": "b", "type": "numeric", "range": [0, 1], "allow_missing": True}]})
    rng = np.random.default_rng(1)
    trees = [Tree(s.features, s.thresholds, rng.uniform(-1, 1, 8), default_left=rng.random(7) < 0.5)
             for s in (random_splits(schema, 3, 5, r) for r in range(5))]
    model = Ensemble(schema, Hyperparameters(depth=3, learning_rate=0.5), 0.1, trees)
    X = public_box_sample(model, 40, seed=2)
    X[::3, 0] = np.nan
    X[1::4, 1] = np.nan
    c = contributions(model, X)
    np.testing.assert_allclose(c.values, xgb_contribs(model, X, tmp_path)[:, :-1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(c.bias[0] + c.values.sum(axis=1), model.predict_margin(X), rtol=0, atol=1e-12)


def test_multiclass_contributions_per_class_equal_xgboost_and_add_up_to_each_class_margin(tmp_path):
    from fedsbdt.common.data import load

    schema = Schema.load(EXAMPLES / "wine" / "schema.toml")
    ds = load(EXAMPLES / "wine" / "wine_train.csv", schema)
    model = train(ds, Hyperparameters(epsilon=8.0, trees=6, depth=3, cyclical=False)).model
    c = contributions(model, ds.X[:50])
    K, F = schema.n_classes, len(schema.features)
    assert c.values.shape == (50, K, F) and c.bias.shape == (K,)
    # the export folds class k's initial margin into its first tree (a constant per class: same contributions)
    np.testing.assert_allclose(c.values, xgb_contribs(model, ds.X[:50], tmp_path)[:, :, :-1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(c.bias + c.values.sum(axis=2), model.predict_margin(ds.X[:50]), rtol=0, atol=1e-9)


def test_a_feature_no_tree_splits_on_gets_no_contribution_and_no_importance():
    schema = Schema.from_dict({"task": "regression", "target": "y", "label_range": [0, 10], "features": [
        {"name": "used", "type": "numeric", "range": [0, 1]}, {"name": "unused", "type": "numeric", "range": [0, 1]}]})
    tree = Tree(np.zeros(3, np.int32), np.array([0.5, 0.25, 0.75]), np.array([-1.0, -0.5, 0.5, 1.0]))
    model = Ensemble(schema, Hyperparameters(depth=2, learning_rate=1.0), 0.0, [tree])
    imp = importance(model, public_box_sample(model, 200), "public box")
    assert imp.features == ("used", "unused") and imp.mean_abs[1] == 0.0 and imp.share[0] == 1.0
    # one tree, one feature: the contribution is the prediction minus the mean of the leaves, in label units
    X = np.array([[0.1, 0.9], [0.9, 0.1]])
    c = contributions(model, X)
    np.testing.assert_allclose(c.values[:, 0], (np.array([-1.0, 1.0]) - 0.0) * 5.0)
    assert tree_shap(X, np.zeros((0, 3), np.int32), np.zeros((0, 3)), np.zeros((0, 4)), np.zeros(2, bool),
                     2).sum() == 0.0


def test_cli_explain_prints_the_importance_and_writes_contributions_that_add_up(tmp_path, capsys):
    model_path, out = tmp_path / "m.json", tmp_path / "contrib.csv"
    assert main(["train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--out",
                 str(model_path), "--epsilon", "2", "--trees", "20", "--depth", "3"]) == 0
    capsys.readouterr()
    assert main(["explain", "--model", str(model_path), "--data", str(ABALONE), "--contributions", str(out),
                 "--top", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["over"] == "data" and result["points"] == 4177 and result["units"] == "label"
    assert len(result["importance"]) == 3
    shares = [r["share"] for r in result["importance"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    frame = pd.read_csv(out)
    model = Ensemble.load(model_path)
    names = [f.name for f in model.schema.features]
    assert list(frame.columns) == ["id", *names, "bias"] and len(frame) == 4177
    from fedsbdt.common.data import load

    pred = model.predict(load(ABALONE, model.schema).X)
    np.testing.assert_allclose(frame[names].sum(axis=1) + frame["bias"], pred, rtol=0, atol=1e-9)
    assert main(["explain", "--model", str(model_path)]) == 0
    text = capsys.readouterr().out
    assert "public feature box" in text and all(n in text for n in names)


def test_cli_explain_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    model_path = tmp_path / "m.json"
    assert main(["train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"), "--out",
                 str(model_path), "--epsilon", "2", "--trees", "3", "--depth", "2"]) == 0
    capsys.readouterr()
    for args, words in [(["--contributions", str(tmp_path / "c.csv")], "--contributions needs --data"),
                        (["--top", "0"], "--top 0: must be at least 1"),
                        (["--data", str(tmp_path / "missing.csv")], "missing.csv")]:
        assert main(["explain", "--model", str(model_path), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "c.csv").exists()


def test_the_report_shows_the_feature_importance(models, tmp_path):
    from fedsbdt.common.report import build_report

    model, _ = models["adult"]
    page = build_report(model)
    section = page[page.index('<section id="importance"'):]
    section = section[:section.index("</section>")]
    assert "Feature importance" in section and "<svg" in section
    top = importance(model, public_box_sample(model, 2000), "public box").features[0]
    assert f"<th>{top}</th>" in section
