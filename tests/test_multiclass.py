"""Multi-class task: joint K-tree sensitivity (docs/privacy.md "Multi-class"), accounting, schema, training, CLI."""
import json
import math

import numpy as np
import pytest

from fedsbdt.common import multiclass
from fedsbdt.common.accountant import event_pld, event_rdp, tree_rdp
from fedsbdt.common.boosting import Encoding, leaf_noise_scales
from fedsbdt.cli import main
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import DataError, load
from fedsbdt.common.engine import calibration_for, train
from fedsbdt.common.model import Ensemble
from fedsbdt.common.multiclass_boosting import MulticlassLocalData
from fedsbdt.common.schema import Schema, SchemaError

from conftest import EXAMPLES, insecure

WINE = EXAMPLES / "wine"
WINE_SCHEMA = WINE / "schema.toml"


def _records(rng, n, K, spread):
    """Margins from all over (scale ``spread``) plus the adversarial corners of the simplex."""
    margins = rng.normal(0.0, 1.0, (n, K)) * rng.choice(spread, size=(n, 1))
    return margins, rng.integers(0, K, n)


def _units(hp, K):
    enc = Encoding.for_task(hp, "multiclass", K)
    return enc, enc.scale, enc.grad.bound_units, enc.hess.bound_units


def _random_units(hp, K, seed, spread, n=200_000):
    """(S, g_u, h_u, gq, hq) of ``n`` random records."""
    _, S, g_u, h_u = _units(hp, K)
    margins, y = _records(np.random.default_rng(seed), n, K, spread)
    gq, hq = multiclass.grad_hess_units(margins, y, S, g_u, h_u)
    return S, g_u, h_u, y, gq, hq


# --------------------------------------------------------------------------- the bound is never exceeded


@pytest.mark.parametrize("K", [3, 4, 10])
@pytest.mark.parametrize("grad_clip,hess_clip", [(0.5, 0.25), (1.0, 0.25), (0.3, 0.1), (2.0, 0.05), (0.05, 1.0)])
def test_neighbouring_round_vectors_never_differ_by_more_than_the_joint_bound(K, grad_clip, hess_clip):
    """Random records and random trees: the K-tree round vectors of D and D − {x} differ, after dividing
    each coordinate by its noise std, by at most √2/σ in L2 (one Gaussian event of multiplier σ/√2)."""
    rng = np.random.default_rng(K * 100 + int(grad_clip * 10))
    hp = Hyperparameters(grad_clip=grad_clip, hess_clip=hess_clip, depth=3)
    enc, S, g_u, h_u = _units(hp, K)
    sigma = 3.7
    scales = leaf_noise_scales(hp, enc, sigma)
    G = multiclass.gradient_sensitivity(K, g_u, S)
    H = multiclass.hessian_sensitivity(K, h_u, S)
    worst = worst_g = worst_h = 0.0
    for trial in range(40):
        n = 60
        margins, y = _records(rng, n, K, [0.1, 1.0, 5.0, 40.0])
        leaf = rng.integers(0, hp.leaves, n)  # any tree: the record's leaf is arbitrary
        gq, hq = multiclass.grad_hess_units(margins, y, S, g_u, h_u)
        full = multiclass.leaf_sums(leaf, gq, hq, np.ones(n, bool), hp.leaves)
        for i in range(n):
            keep = np.ones(n, bool)
            keep[i] = False
            d = (full - multiclass.leaf_sums(leaf, gq, hq, keep, hp.leaves)).reshape(K, 2, hp.leaves)
            worst = max(worst, float(np.sum((d.reshape(-1) / scales) ** 2)))
            worst_h = max(worst_h, float(np.linalg.norm(d[:, 0])))
            worst_g = max(worst_g, float(np.linalg.norm(d[:, 1])))
    assert worst <= 2.0 / sigma**2
    assert worst_g <= G and worst_h <= H


@pytest.mark.parametrize("K", [3, 5, 12])
@pytest.mark.parametrize("grad_clip", [0.5, 1.0, 3.0, 0.25, 0.3, 0.05])
def test_gradient_bound_holds_and_is_attained(K, grad_clip):
    """‖gq‖₂ ≤ G for 200 000 random records; records near the simplex's corners reach G (to 1e-5, or to the
    documented gap when 1/g* is not an integer and (K−1)g* > 1)."""
    S, g_u, h_u, y, gq, _ = _random_units(Hyperparameters(grad_clip=grad_clip), K, 7, [0.01, 1.0, 3.0, 10.0, 100.0])
    G = multiclass.gradient_sensitivity(K, g_u, S)
    assert np.linalg.norm(gq, axis=1).max() <= G
    assert (np.abs(gq).sum(axis=1) - np.abs(gq[np.arange(y.size), y]) <= S).all()  # Σ_{k≠y}|gq_k| ≤ S
    # the maximiser: p_y → 0 and the rest of the mass on m = ⌈1/c⌉ other classes, each at ≥ min(c, 1/m)
    c = min(grad_clip, 1.0)
    m = min(K - 1, math.ceil(1.0 / c - 1e-12))
    margin = np.full((1, K), -60.0)
    margin[0, 1:1 + m] = 0.0
    gq, _ = multiclass.grad_hess_units(margin, np.array([0]), S, g_u, h_u)
    reached = math.sqrt(c**2 + m * min(c, 1.0 / m) ** 2) * S  # what this record reaches (closed form)
    assert np.linalg.norm(gq) == pytest.approx(reached, rel=1e-5)
    assert np.linalg.norm(gq) <= G
    integral = abs(1.0 / c - round(1.0 / c)) < 1e-12 or (K - 1) * c <= 1.0
    assert np.linalg.norm(gq) / G >= (1 - 1e-5 if integral else 0.85)


def test_gradient_bound_is_root_two_without_effective_clipping():
    """g* ≥ 1: Σ_k|g_k| = 2(1 − p_y) ≤ 2 and |g_k| ≤ 1 give ‖g‖₂ ≤ √2 (the brief's bound), reached at p = e_j."""
    for K in (3, 7):
        assert multiclass.gradient_sensitivity(K, 2**20, 2.0**20) / 2**20 == pytest.approx(math.sqrt(2), rel=1e-8)
    assert multiclass.gradient_sensitivity(3, 2**19, 2.0**20) / 2**20 == pytest.approx(math.sqrt(3) / 2, rel=1e-8)


@pytest.mark.parametrize("K", [3, 4, 9])
@pytest.mark.parametrize("hess_clip", [0.25, 2.0 / 9.0, 0.2, 0.1, 0.05, 0.01])
def test_hessian_bound_holds_and_is_attained(K, hess_clip):
    S, g_u, h_u, _, _, hq = _random_units(Hyperparameters(hess_clip=hess_clip), K, 11, [0.01, 0.5, 1.0, 3.0, 10.0])
    H = multiclass.hessian_sensitivity(K, h_u, S)
    assert np.linalg.norm(hq, axis=1).max() <= H
    # maximiser: p = 1/m on m classes, m = 3 when the clip does not bind (p(1−p)² peaks at 1/3), else
    # ⌊1/p₀⌋ or ⌈1/p₀⌉ classes with p(1−p) ≥ c (p₀(1−p₀) = c), capped at K
    c = h_u / S
    best = 0.0
    for m in range(1, K + 1):
        margin = np.full((1, K), -60.0)
        margin[0, :m] = 0.0
        _, hq = multiclass.grad_hess_units(margin, np.array([0]), S, g_u, h_u)
        best = max(best, float(np.linalg.norm(hq)))
    assert best <= H
    p0 = (1 - math.sqrt(max(1 - 4 * c, 0.0))) / 2
    integral = c >= 2 / 9 or K * c * c <= multiclass.phi(c) or abs(1 / p0 - round(1 / p0)) < 1e-9
    assert best / H >= (1 - 1e-5 if integral else 0.8)


def test_whitened_joint_sensitivity_is_below_one_gaussian_event():
    """Over random records the whitened per-record vector stays ≤ √2/σ; each part reaches its own bound."""
    hp = Hyperparameters()
    K = 3
    enc, S, g_u, h_u = _units(hp, K)
    sigma = 1.0
    scales = leaf_noise_scales(hp, enc, sigma)
    L = hp.leaves
    sh, sg = scales[0], scales[L]
    rng = np.random.default_rng(3)
    margins, y = _records(rng, 100_000, K, [0.1, 1.0, 10.0, 50.0])
    gq, hq = multiclass.grad_hess_units(margins, y, S, g_u, h_u)
    whitened = (hq / sh) ** 2 + (gq / sg) ** 2
    assert whitened.sum(axis=1).max() <= 2.0 / sigma**2
    assert ((gq / sg) ** 2).sum(axis=1).max() >= 2 * hp.r2 / sigma**2 * 0.99  # gradient part (nearly) attained
    assert ((hq / sh) ** 2).sum(axis=1).max() >= 2 * hp.r1 / sigma**2 * 0.99  # Hessian part attained


def test_noise_scales_are_the_binary_scales_times_the_joint_sensitivity_ratio():
    hp = Hyperparameters()  # g* = 0.5, h* = 0.25
    enc = Encoding.for_task(hp, "multiclass", 4)
    binary = leaf_noise_scales(hp, Encoding.for_task(hp, "binary"), 2.0)
    multi = leaf_noise_scales(hp, enc, 2.0).reshape(4, 2 * hp.leaves)
    L = hp.leaves
    assert np.allclose(multi[:, L:] / binary[L:], math.sqrt(3.0), rtol=1e-8)  # G = √3·g* for g* = 1/2
    assert np.allclose(multi[:, :L] / binary[:L], math.sqrt(4 / 27) / 0.25, rtol=1e-8)  # H = √(4/27) for h* ≥ 2/9


# --------------------------------------------------------------------------- accounting


def test_the_accountant_charges_one_gaussian_event_per_round():
    """A multiclass calibration is the binary one: each round is round_event(γ, σ), checked against
    dp-accounting's PLD of the same subsampled Gaussian composed T times."""
    hp = Hyperparameters(epsilon=1.0, trees=20, init_share=0.0)
    cal = calibration_for(hp)
    alphas = np.arange(2, 64)
    assert np.allclose(event_rdp(multiclass.round_event(hp.subsample, cal.sigma), alphas),
                       tree_rdp(hp.subsample, cal.sigma, alphas))
    pld = event_pld(multiclass.round_event(hp.subsample, cal.sigma)).self_compose(hp.trees)
    eps_pld = pld.get_epsilon_for_delta(hp.delta)
    assert eps_pld <= cal.epsilon * 1.001  # PLD is tighter than RDP
    assert eps_pld >= 0.6 * cal.epsilon



def test_the_receipt_epsilon_is_the_composition_of_the_round_events():
    """Initial score (two Laplace events) + T multiclass rounds, composed by the event ledger, is the
    calibrated ε of a multiclass model's receipt."""
    from fedsbdt.common.accountant import compose, event_epsilon_rdp, init_score_events

    schema = Schema.load(WINE_SCHEMA)
    tr = load(WINE / "wine_train.csv", schema)
    hp = Hyperparameters(epsilon=2.0, trees=8, seed=2)
    p = train(tr, hp, insecure(0)).model.privacy
    ev = compose(init_score_events(p["eps_init"], p["eps_ds"]),
                 compose(multiclass.round_event(hp.subsample, p["sigma"]), count=hp.trees))
    eps, alpha = event_epsilon_rdp(ev, hp.delta)
    assert eps == pytest.approx(p["epsilon"], rel=1e-9) and alpha == p["alpha"]


def test_initial_score_counts_have_l1_sensitivity_one():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 50).astype(float)
    present = np.ones(50, bool)
    full = multiclass.init_sums(y, present, 4)
    for i in range(50):
        keep = present.copy()
        keep[i] = False
        d = full - multiclass.init_sums(y, keep, 4)
        assert d[0] == 1 and np.abs(d[1:]).sum() == 1
    assert full[0] == 50 and full[1:].sum() == 50
    score = multiclass.init_score(full, 4)
    assert score.sum() == pytest.approx(0.0, abs=1e-12)
    assert np.allclose(multiclass.softmax(score[None])[0], full[1:] / 50)


# --------------------------------------------------------------------------- schema and data


def _schema_dict(**kw):
    d = {"task": "multiclass", "target": "y", "classes": ["a", "b", "c"],
         "features": [{"name": "x", "type": "numeric", "range": [0, 1]}]}
    d.update(kw)
    return d


def test_schema_declares_public_classes():
    s = Schema.from_dict(_schema_dict())
    assert s.n_classes == 3 and Schema.from_dict(s.to_dict()) == s
    with pytest.raises(SchemaError, match="at least 3 public classes"):
        Schema.from_dict(_schema_dict(classes=["a", "b"]))
    with pytest.raises(SchemaError, match="duplicate class"):
        Schema.from_dict(_schema_dict(classes=["a", "b", "a"]))
    with pytest.raises(SchemaError, match="classes"):
        Schema.from_dict({k: v for k, v in _schema_dict().items() if k != "classes"})
    with pytest.raises(SchemaError, match="'classes' is for task = 'multiclass'"):
        Schema.from_dict(_schema_dict(task="binary"))


def test_an_unknown_label_is_a_clear_error(tmp_path):
    schema = Schema.load(WINE_SCHEMA)
    text = (WINE / "wine_test.csv").read_text().splitlines()
    text[5] = text[5].rsplit(",", 1)[0] + ",class_7"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(DataError, match=r"line 6, label 'cultivar': 'class_7' is not one of the public classes"):
        load(bad, schema)
    ds = load(WINE / "wine_train.csv", schema)
    assert set(np.unique(ds.y)) == {0.0, 1.0, 2.0}


# --------------------------------------------------------------------------- training


def test_central_training_learns_wine_and_releases_k_trees_per_round():
    schema = Schema.load(WINE_SCHEMA)
    tr, te = load(WINE / "wine_train.csv", schema), load(WINE / "wine_test.csv", schema)
    hp = Hyperparameters(epsilon=10.0, trees=40, subsample=0.5, learning_rate=0.3, seed=5)
    res = train(tr, hp, insecure(1))
    m = res.model
    assert len(m.trees) == 3 * 40
    for r in range(40):  # the K class trees of a round share its public splits
        assert all(np.array_equal(m.trees[3 * r].features, m.trees[3 * r + k].features) for k in (1, 2))
    prob = m.predict(te.X)
    assert prob.shape == (te.n, 3) and np.allclose(prob.sum(axis=1), 1.0)
    metrics = multiclass.evaluate(te.y, prob)
    assert metrics["accuracy"] >= 0.85 and metrics["macro_auc"] >= 0.95, metrics
    assert m.privacy["classes"] == 3
    assert m.privacy["joint_sensitivity"]["gradient_l2"] == pytest.approx(math.sqrt(3) / 2, rel=1e-8)
    again = Ensemble.from_dict(json.loads(m.to_json()))
    assert np.array_equal(again.predict(te.X), prob)
    from fedsbdt.common.report import build_report

    html = build_report(m, plots=False)
    assert "public classes: class_0, class_1, class_2" in html and "joint sensitivity" in html
    assert "gradients 0.866, Hessians 0.3849 (L2)" in html


def test_local_data_margins_follow_the_released_trees():
    schema = Schema.load(WINE_SCHEMA)
    tr = load(WINE / "wine_train.csv", schema)
    hp = Hyperparameters(epsilon=5.0, trees=5, seed=1)
    res = train(tr, hp, insecure(2))
    assert isinstance(res.local, MulticlassLocalData)
    assert np.allclose(res.local.pred, res.model.predict_margin(tr.X))


def test_multiclass_refuses_the_filter_and_greedy_trees_before_any_release(tmp_path):
    schema = Schema.load(WINE_SCHEMA)
    tr = load(WINE / "wine_train.csv", schema)
    with pytest.raises(ConfigError, match="Rényi filter does not support"):
        train(tr, Hyperparameters(filter=True, seed=1), insecure(0))
    with pytest.raises(ConfigError, match="greedy"):
        train(tr, Hyperparameters(tree_builder="greedy", subsample=1.0, seed=1), insecure(0))
    out = tmp_path / "m.json"
    assert main(["train", "--data", str(WINE / "wine_train.csv"), "--schema", str(WINE_SCHEMA), "--out", str(out),
                 "--filter", "--quiet"]) == 2
    assert not out.exists()


def test_cli_train_evaluate_predict(tmp_path, capsys):
    model, pred = tmp_path / "m.json", tmp_path / "p.csv"
    assert main(["train", "--data", str(WINE / "wine_train.csv"), "--schema", str(WINE_SCHEMA), "--out", str(model),
                 "--epsilon", "8", "--trees", "30", "--subsample", "0.5", "--learning-rate", "0.3", "--json"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(model), "--data", str(WINE / "wine_test.csv"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res) == {"n", "accuracy", "macro_auc", "log_loss", "dropped", "baseline", "beats_baseline"}
    assert res["n"] == 44 and res["baseline"]["predictor"] == "majority class" and res["beats_baseline"]
    # chance is 1/3; secure noise: the lowest of 60 runs was 0.727 on these 44 rows
    assert res["accuracy"] > 0.6 and res["log_loss"] < math.log(3)
    assert main(["predict", "--model", str(model), "--data", str(WINE / "wine_test.csv"), "--out", str(pred)]) == 0
    head, first = pred.read_text().splitlines()[:2]
    assert head == "id,probability_class_0,probability_class_1,probability_class_2,prediction"
    assert first.split(",")[-1] in ("class_0", "class_1", "class_2")


# --------------------------------------------------------------------------- sklearn and XGBoost export


def _wine_frame():
    schema = Schema.load(WINE_SCHEMA)
    import pandas as pd
    tr = pd.read_csv(WINE / "wine_train.csv")
    te = pd.read_csv(WINE / "wine_test.csv")
    return schema, tr.drop(columns="cultivar"), tr["cultivar"].to_numpy(), te.drop(columns="cultivar"), \
        te["cultivar"].to_numpy()


def test_sklearn_estimator_has_k_probability_columns_and_public_classes():
    from sklearn.base import clone

    from fedsbdt.common.estimators_multiclass import SBDTMulticlassClassifier

    schema, X, y, Xt, yt = _wine_frame()
    est = SBDTMulticlassClassifier(schema=str(WINE_SCHEMA), epsilon=10.0, trees=30, subsample=0.5,
                                   learning_rate=0.3, seed=3)
    est.fit(X, y, randomness=insecure(4))
    assert list(est.classes_) == ["class_0", "class_1", "class_2"]
    proba = est.predict_proba(Xt)
    assert proba.shape == (len(yt), 3) and np.allclose(proba.sum(axis=1), 1.0)
    assert np.array_equal(est.predict(Xt), est.classes_[proba.argmax(axis=1)])
    assert est.score(Xt, yt) >= 0.8
    # explicit public bounds and integer labels; classes given or read from y
    Xn, yn = X.to_numpy(), np.searchsorted(est.classes_, y)
    ranges = [(f.lo, f.hi) for f in schema.features]
    e2 = clone(SBDTMulticlassClassifier(feature_ranges=ranges, trees=5, seed=1)).fit(Xn, yn, randomness=insecure(1))
    assert list(e2.classes_) == [0, 1, 2] and e2.predict_proba(Xn).shape == (len(yn), 3)
    with pytest.raises(ValueError, match="outside the public classes"):
        SBDTMulticlassClassifier(feature_ranges=ranges, classes=[0, 1, 5], trees=2).fit(Xn, yn)
    with pytest.raises(ValueError, match="at least 3 distinct public classes"):
        SBDTMulticlassClassifier(feature_ranges=ranges, trees=2).fit(Xn, yn % 2)


def test_xgboost_loading_the_export_gives_our_probabilities(tmp_path):
    import xgboost as xgb
    from fedsbdt.common.export_xgboost import export_xgboost

    schema = Schema.load(WINE_SCHEMA)
    tr, te = load(WINE / "wine_train.csv", schema), load(WINE / "wine_test.csv", schema)
    model = train(tr, Hyperparameters(epsilon=5.0, trees=20, learning_rate=0.3, seed=9, cyclical=False),
                  insecure(5)).model
    summary = export_xgboost(model, tmp_path / "x.json")
    assert summary.objective == "multi:softprob" and summary.trees == 60
    booster = xgb.Booster(model_file=str(tmp_path / "x.json"))
    assert booster.num_boosted_rounds() == 20
    for X in (te.X, tr.X):
        ours = model.predict(X)
        theirs = booster.predict(xgb.DMatrix(X))
        assert theirs.shape == ours.shape
        assert np.abs(theirs - ours).max() < 2e-6


# --------------------------------------------------------------------------- the noise the engine adds


def test_the_k_tree_leaf_noise_has_the_variances_of_the_joint_sensitivity():
    """The engine's noise stream for a 4-class round: Hessian sums (√(4/27)·S)²σ²/(2r1), gradient sums
    (√3·g*·S)²σ²/(2r2) for g* = ½, h* = ¼ (closed forms), every class block, χ² at p = 1e−6."""
    from fedsbdt.common.randomness import SecureRandomness, prefetched_gaussian
    from test_mechanisms import chi2_variance_test

    hp = Hyperparameters(epsilon=1.0, trees=50, depth=2, init_share=0.0)
    K, L = 4, hp.leaves
    enc = Encoding.for_task(hp, "multiclass", K)
    sigma = calibration_for(hp).sigma
    scales = leaf_noise_scales(hp, enc, sigma)
    N = 1500
    stream = prefetched_gaussian(SecureRandomness(), scales, N)
    draws = np.stack([next(stream) for _ in range(N)]).reshape(N, K, 2, L)
    S = enc.scale
    want_h = (4 / 27) * S**2 * sigma**2 / (2 * hp.r1)
    want_g = 3 * (0.5 * S) ** 2 * sigma**2 / (2 * hp.r2)
    for k in range(K):
        assert chi2_variance_test(draws[:, k, 0], want_h)[0], k
        assert chi2_variance_test(draws[:, k, 1], want_g)[0], k
    # the binary scales (g*, h*) would be refused: the joint sensitivity is really in the noise
    assert not chi2_variance_test(draws[:, :, 1] / math.sqrt(3), want_g)[0]
