"""Features that meet (central engine): missing values with multiclass, DPBoost, Sarus and greedy histogram
selection train a model whose file predicts exactly what training applied to every record — a NaN takes the
same way in the model as in the training state — and multiclass refuses the builders it does not support."""
import json
import tomllib

import numpy as np
import pandas as pd
import pytest

from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.engine import train
from fedsbdt.common.model import Ensemble
from fedsbdt.common.schema import Schema
from conftest import ADULT_TEST, EXAMPLES, insecure


def wine_with_holes(tmp_path, share=0.3):
    """The wine (3-class) training file with the first three features missing in ``share`` of the rows."""
    d = Schema.load(EXAMPLES / "wine" / "schema.toml").to_dict()
    raw = pd.read_csv(EXAMPLES / "wine" / "wine_train.csv")
    holes = [f["name"] for f in d["features"][:3]]
    for f in d["features"]:
        f["allow_missing"] = f["name"] in holes or f.get("allow_missing", False)
    rng = np.random.default_rng(1)
    for c in holes:
        raw[c] = raw[c].astype(object)
        raw.loc[rng.random(len(raw)) < share, c] = ""
    raw.to_csv(tmp_path / "wine.csv", index=False)
    return load(tmp_path / "wine.csv", Schema.from_dict(d))


def test_multiclass_model_routes_missing_values_by_each_class_trees_directions(tmp_path):
    ds = wine_with_holes(tmp_path)
    assert np.isnan(ds.X).sum() > 100
    res = train(ds, Hyperparameters(trees=5, depth=3, seed=4, epsilon=2.0), insecure(3, noise=False))
    assert all(t.default_left is not None for t in res.model.trees)
    assert any(t.default_left.any() for t in res.model.trees)
    model = Ensemble.from_dict(res.model.to_dict())  # through the model file
    np.testing.assert_allclose(model.predict_margin(ds.X), res.local.pred, rtol=0, atol=1e-12)


def test_multiclass_xgboost_export_and_estimator_agree_on_missing_values(tmp_path):
    """XGBoost (an independent walker of the exported directions) predicts the model's class probabilities on
    rows with missing values; the scikit-learn estimator with allow_missing=True routes them the same way."""
    import xgboost as xgb

    from fedsbdt.common.estimators_multiclass import SBDTMulticlassClassifier
    from fedsbdt.common.export_xgboost import export_xgboost

    ds = wine_with_holes(tmp_path)
    X32 = ds.X.astype(np.float32).astype(np.float64)  # XGBoost compares float32 inputs (docs/xgboost-export.md)
    model = train(ds, Hyperparameters(trees=8, depth=3, seed=4, epsilon=2.0), insecure(3, noise=False)).model
    export_xgboost(model, tmp_path / "m.json")
    theirs = xgb.Booster(model_file=str(tmp_path / "m.json")).predict(xgb.DMatrix(X32)).astype(np.float64)
    rows = np.isnan(X32).any(axis=1)
    assert rows.sum() > 50
    np.testing.assert_allclose(model.predict(X32), theirs, rtol=0, atol=1e-6)
    est = SBDTMulticlassClassifier(schema=ds.schema, allow_missing=True, trees=8, depth=3, seed=4, epsilon=2.0)
    est.fit(ds.X, np.asarray(ds.schema.classes)[ds.y.astype(int)], randomness=insecure(3, noise=False))
    np.testing.assert_allclose(est.decision_function(ds.X), est.model_.predict_margin(ds.X), rtol=0, atol=0)
    fitted = est.model_
    export_xgboost(fitted, tmp_path / "e.json")
    theirs = xgb.Booster(model_file=str(tmp_path / "e.json")).predict(xgb.DMatrix(X32)).astype(np.float64)
    np.testing.assert_allclose(est.predict_proba(X32), theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("builder", ["greedy", "dpboost", "sarus"])
def test_multiclass_refuses_the_other_builders_in_one_line(tmp_path, builder):
    ds = wine_with_holes(tmp_path)
    with pytest.raises(ConfigError, match=f"tree_builder = '{builder}' does not support task = 'multiclass'"):
        train(ds, Hyperparameters(trees=2, depth=2, seed=4, epsilon=2.0, subsample=1.0, tree_builder=builder),
              insecure(3, noise=False))


@pytest.mark.parametrize("kw, directed", [(dict(tree_builder="dpboost"), True), (dict(tree_builder="sarus"), False),
                                          (dict(tree_builder="greedy", selection="histogram"), True)])
def test_binary_builders_with_missing_values_predict_what_training_applied(kw, directed):
    d = tomllib.loads((EXAMPLES / "adult" / "schema.toml").read_text())
    d["format"]["on_missing"] = "keep"
    ds = load(ADULT_TEST, Schema.from_dict(d))
    assert np.isnan(ds.X).sum() > 1000
    res = train(ds, Hyperparameters(trees=4, depth=3, seed=4, epsilon=2.0, subsample=1.0, **kw),
                insecure(3, noise=False))
    assert any(t.default_left is not None for t in res.model.trees) == directed  # Sarus: NaN goes right
    model = Ensemble.from_dict(res.model.to_dict())
    np.testing.assert_allclose(model.predict_margin(ds.X), res.local.pred, rtol=0, atol=1e-12)


@pytest.mark.parametrize("flags, shown, hidden", [
    (["--tree-builder", "sarus"], ["alpha ", "paper claims", "our ledger"], ["sigma ", "rho "]),
    (["--tree-builder", "sarus", "--accountant", "pure"], ["paper claims", "our ledger"], ["sigma ", "alpha ", "rho "]),
    (["--accountant", "pld"], ["sigma "], ["alpha ", "rho "]),
    ([], ["sigma ", "alpha ", "rho "], []),
    (["--tree-builder", "dpboost", "--trees", "6", "--ensemble-trees", "3"], ["eps_tree ", "our ledger "],
     ["sigma ", "rho "])])
def test_account_prints_only_the_lines_that_apply(capsys, flags, shown, hidden):
    """Sarus trees have no Gaussian leaf noise (σ = 0, ρ = 0 mean nothing there), the pure and PLD accountants
    no RDP order; the --json object keeps every key for scripts."""
    from fedsbdt.cli import main

    assert main(["account", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    for word in shown:
        assert any(line.startswith(word) for line in lines), (word, lines)
    for word in hidden:
        assert not any(line.startswith(word) for line in lines), (word, lines)
    assert main(["account", *flags, "--json"]) == 0
    assert {"sigma", "alpha", "rho", "epsilon"} <= set(json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("kw, sigma_row, rho_row", [(dict(tree_builder="sarus"), False, False),
                                                    (dict(tree_builder="dpboost", subsample=1.0), False, True),
                                                    (dict(), True, True)])
def test_the_report_shows_sigma_and_rho_only_where_they_apply(tmp_path, kw, sigma_row, rho_row):
    """σ_leaf is the Gaussian leaf noise (DPBoost and Sarus have Laplace leaves); ρ(α̂) the trees' RDP budget
    (DPBoost's exponential and Laplace releases have one, Sarus composes its pure-DP trees separately)."""
    from fedsbdt.common.report import write_report

    d = tomllib.loads((EXAMPLES / "adult" / "schema.toml").read_text())
    ds = load(ADULT_TEST, Schema.from_dict(d))
    model = train(ds, Hyperparameters(trees=2, depth=2, seed=4, epsilon=2.0, **kw), insecure(3)).model
    model.save(tmp_path / "m.json")
    write_report(tmp_path / "m.json", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert ("σ (sigma)" in page) == sigma_row and ("ρ(α̂) (rho)" in page) == rho_row
    assert "α̂ (alpha)" in page  # the RDP ledger's order applies to every builder
