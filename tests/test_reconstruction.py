"""The reconstruction benchmark's pieces (benchmarks/timberstrike.py) and its report section.

Each piece against an independent oracle: the boxes of a released tree against the library's own predictions
(XGBoost's ``output_margin``, fedsbdt's ``predict_margin``), first-tree probing against the true label counts
per leaf, the optimal pairing of the score against every permutation; and ``fedsbdt report --reconstruction``.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsbdt.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ts():
    spec = importlib.util.spec_from_file_location("bench_timberstrike", ROOT / "benchmarks" / "timberstrike.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_timberstrike"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("bench_timberstrike", None)


def data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = np.round(rng.uniform(0, 10, (n, 3)), 1)
    y = ((X[:, 0] + X[:, 1] + rng.normal(0, 2, n)) > 10).astype(np.float64)
    return X, y


def xgb_release(ts, X, y, rounds, depth=3):
    import xgboost as xgb

    params = {"objective": "binary:logistic", "eta": 0.3, "max_depth": depth, "lambda": 1.0, "tree_method": "hist",
              "nthread": 1}
    booster = xgb.train(params, xgb.DMatrix(X, y), rounds)
    return booster, ts.release_of_xgboost(json.loads(booster.save_raw("json")), X.shape[1], 0.3, 1.0)


def test_xgboost_boxes_reproduce_xgboosts_own_margins(ts):
    import xgboost as xgb

    X, y = data()
    booster, rel = xgb_release(ts, X, y, 5)
    margin = rel.init_margin + sum(t.out[t.leaf_of(X)] for t in rel.trees)
    assert np.allclose(margin, booster.predict(xgb.DMatrix(X), output_margin=True), atol=1e-5)
    p = 1 / (1 + np.exp(-np.full(len(y), rel.init_margin)))
    leaf = rel.trees[0].leaf_of(X)
    assert np.allclose(np.bincount(leaf, p * (1 - p)), rel.trees[0].cover, rtol=1e-5)  # cover = Σ h


def test_first_tree_probing_recovers_the_other_sites_label_counts_per_leaf(ts):
    """With the cover released, the first tree gives exactly how many records of each label of the *other*
    sites fall in each leaf: the attacker subtracts its own (oracle: counting the other sites' records)."""
    X, y = data()
    _, rel = xgb_release(ts, X, y, 1)
    own = np.arange(len(y)) % 3 == 2
    lo, hi = np.zeros(3), np.full(3, 10.0)
    rec = ts.reconstruct(rel, X[own], y[own], int((~own).sum()), lo, hi)
    tree = rel.trees[0]
    got = {(j, lab): 0 for j in range(tree.out.size) for lab in (0.0, 1.0)}
    for lab, lo_, hi_ in zip(rec.y, rec.lo, rec.hi):
        j = int(np.flatnonzero(np.all(tree.lo == lo_, axis=1) & np.all(tree.hi == hi_, axis=1))[0])
        got[(j, lab)] += 1
    leaf = tree.leaf_of(X[~own])
    want = {(j, lab): int(np.sum((leaf == j) & (y[~own] == lab))) for j, lab in got}
    assert got == want
    assert np.all((rec.X >= np.maximum(rec.lo, lo)) & (rec.X <= np.minimum(rec.hi, hi)))  # estimates in their box


def test_fedsbdt_boxes_reproduce_the_models_margins_and_the_thresholds_are_public(ts):
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.data import Dataset
    from fedsbdt.common.engine import train
    from fedsbdt.common.randomness import InsecureTestRandomness
    from fedsbdt.common.schema import Schema
    from fedsbdt.common.splits import random_splits

    X, y = data(300)
    schema = Schema.from_dict({"name": "s", "task": "binary", "target": "y", "columns": ["a", "b", "c", "y"],
                               "features": [{"name": n, "type": "numeric", "range": [0, 10]} for n in "abc"]})
    hp = Hyperparameters(epsilon=1.0, trees=6, depth=3, seed=4)
    model = train(Dataset.from_arrays(X, y.astype(int).astype(str), schema), hp,
                  InsecureTestRandomness(seed=1, i_understand_this_is_insecure=True)).model
    rel = ts.release_of_fedsbdt(model)
    margin = rel.init_margin + sum(t.out[t.leaf_of(X)] for t in rel.trees)
    assert np.allclose(margin, model.predict_margin(X))
    for k, t in enumerate(model.trees):  # what the thresholds can say: nothing the public seed does not
        s = random_splits(schema, hp.depth, hp.seed, k, hp.cyclical, hp.split_candidates)
        assert np.array_equal(t.thresholds, s.thresholds) and np.array_equal(t.features, s.features)


def test_the_score_pairs_records_optimally(ts):
    """Against every permutation: the pairing minimises the features outside tolerance, and the victim's shares
    are read off that pairing."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        T = rng.integers(0, 4, (5, 3)).astype(float)
        R = rng.integers(0, 4, (5, 3)).astype(float)
        tol = np.full(3, 0.5)
        wrong = (np.abs(R[:, None] - T[None]) > tol).sum(axis=2)
        best = min(sum(wrong[p[k], k] for k in range(5)) for p in itertools.permutations(range(5)))
        victim = np.array([True, True, False, True, False])
        s = ts.score(R, T, victim, tol)
        from scipy.optimize import linear_sum_assignment

        r, c = linear_sum_assignment(wrong)
        assert wrong[r, c].sum() == best
        per = np.empty(5)
        per[c] = wrong[r, c]
        assert s.records == pytest.approx(np.mean(per[victim] == 0))
        assert s.features == pytest.approx(np.mean(1 - per[victim] / 3))
    assert ts.tolerances(np.array([[0.0], [2.0]]))[0] == pytest.approx(0.319)  # τ · population std


def test_exact_values_counts_only_values_the_attacker_does_not_hold(ts):
    victim = np.array([[1.5, 7.0], [2.0, 8.0]])
    own = np.array([[2.0, 0.0]])
    assert ts.exact_values([np.array([1.5, 2.0]), np.array([9.0])], victim, own) == pytest.approx(1 / 4)


RESULT = {"sites": 3, "data": "Pima", "tolerance": {"tau": 0.319},
          "summary": {"baseline": {"records": {"mean": 0.0}, "features": {"mean": 0.61}},
                      "fedsbdt_eps_1": {"records": {"mean": 0.0, "min": 0.0, "max": 0.0},
                                        "features": {"mean": 0.62}, "exact_values": {"mean": 0.0}},
                      "fedsbdt_eps_10": {"records": {"mean": 0.01}, "features": {"mean": 0.64}},
                      "xgboost": {"records": {"mean": 0.02, "min": 0.01, "max": 0.03}, "features": {"mean": 0.66},
                                  "exact_values": {"mean": 0.05}}}}


def test_the_report_shows_the_rates_beside_the_proof_and_the_audit(tmp_path, capsys):
    from fedsbdt.common.report import reconstruction_html

    html = reconstruction_html(RESULT, 8.0, {"epsilon_lower": 0.42, "confidence": 0.95})
    assert "0.42 (at 95% confidence)" in html and "fedsbdt, ε = 10 ← nearest this model" in html
    assert "2.0% (1.0–3.0)" in html and "non-private federated XGBoost" in html
    assert "not audited" in reconstruction_html(RESULT, 1.0) and "ε = 1 ← nearest" in reconstruction_html(RESULT, 1.0)

    X, y = data(200)
    (tmp_path / "d.csv").write_text("a,b,c,y\n" + "\n".join(f"{r[0]},{r[1]},{r[2]},{int(t)}" for r, t in zip(X, y)))
    (tmp_path / "s.toml").write_text('name = "s"\ntask = "binary"\ntarget = "y"\n' + "".join(
        f'[[features]]\nname = "{n}"\ntype = "numeric"\nrange = [0, 10]\n' for n in "abc"))
    assert main(["train", "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml"), "--out",
                 str(tmp_path / "m.json"), "--epsilon", "1", "--trees", "3", "--quiet"]) == 0
    (tmp_path / "r.json").write_text(json.dumps(RESULT))
    capsys.readouterr()
    assert main(["report", "--model", str(tmp_path / "m.json"), "--out", str(tmp_path / "r.html"),
                 "--reconstruction", str(tmp_path / "r.json"), "--json"]) == 0
    assert "reconstruction" in json.loads(capsys.readouterr().out)["sections"]
    assert "Reconstruction attack (benchmark)" in (tmp_path / "r.html").read_text()
    for bad in ({"summary": {"xgboost": {"records": {"mean": 1.5}, "features": {"mean": 0.5}}}}, [1], {}):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        rc = main(["report", "--model", str(tmp_path / "m.json"), "--out", str(tmp_path / "r2.html"),
                   "--reconstruction", str(tmp_path / "bad.json")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "bad.json" in err and len(err.splitlines()) == 1, err
