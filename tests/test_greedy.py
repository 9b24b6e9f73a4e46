"""Greedy DP trees (DP-XGB of "Revisiting DP-XGBoost"): accountant, exponential mechanism, builder, CLI.

Oracles: the exact Rényi divergence of the exponential mechanism on small instances (Thm. 1 must bound
it), the generalised randomized response of Lemma 1 maximised on a grid, Cesar–Rogers/Dong et al.'s
ε²/8 zCDP bound (Thm. 1 must never exceed it) and OpenDP's own zCDP map of its noisy max, dp-accounting's
PLD, brute-force gains and sensitivity, exact selection probabilities (chi-square at p = 1e-6).
"""
import json
import math

import numpy as np
import pytest
from scipy import stats

from fedsbdt.common.accountant import (AccountingError, ComposedEvent, ExponentialEvent, GaussianEvent, LaplaceEvent,
                               PoissonSampledEvent, alpha_grid, bounded_range_rdp, calibrate_greedy, compose,
                               epsilon_pld, event_epsilon_rdp, event_pld, event_rdp, exponential_zcdp_rdp,
                               greedy_budget, greedy_training_event, pure_dp_rdp, rdp_to_dp, total_rdp)
from fedsbdt.common.builders import Candidates, gains, score_sensitivity
from fedsbdt.common.modes.greedy.builder import GreedyTrees
from fedsbdt.common.boosting import LocalData
from fedsbdt.cli import main
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.engine import train
from fedsbdt.common.model import Ensemble
from fedsbdt.common.randomness import SecureRandomness
from fedsbdt.common.schema import Schema
from conftest import EXAMPLES, insecure

ORDERS = np.arange(2, 41)


def renyi(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    """Exact D_α(P‖Q) of two discrete distributions (α > 1), in log space."""
    lp, lq = np.log(p), np.log(q)
    return float(np.logaddexp.reduce(alpha * lp + (1 - alpha) * lq) / (alpha - 1))


def em(u: np.ndarray, eps: float, sens: float) -> np.ndarray:
    w = eps * u / (2 * sens)
    w = np.exp(w - w.max())
    return w / w.sum()


# --------------------------------------------------------------------------- Thm. 1


@pytest.mark.parametrize("eps", [0.05, 0.3, 1.0, 2.5])
def test_bound_dominates_exact_renyi_divergence_of_the_exponential_mechanism(eps):
    """Random neighbouring utility vectors (|u − u'|∞ ≤ Δ, non-monotone): D_α(EM(u)‖EM(u')) ≤ f_ε(α),
    and the worst instance found comes within 25 % of the bound (the bound is not vacuous)."""
    rng = np.random.default_rng(7)
    bound = bounded_range_rdp(ORDERS, eps)
    worst = np.zeros(ORDERS.size)
    for _ in range(400):
        k = int(rng.integers(2, 7))
        u = rng.normal(0, 3, k)
        # neighbours: every score moves by at most Δ = 1, mostly to the extremes
        d = rng.choice([-1.0, 1.0, 0.0], size=k, p=[0.45, 0.45, 0.1]) * rng.uniform(0.8, 1.0, k)
        p, q = em(u, eps, 1.0), em(u + d, eps, 1.0)
        div = np.array([renyi(p, q, a) for a in ORDERS])
        assert np.all(div <= bound * (1 + 1e-9) + 1e-12), (eps, u, d)
        worst = np.maximum(worst, div)
    assert np.all(worst >= 0.75 * bound)


@pytest.mark.parametrize("eps", [0.01, 0.2, 1.0, 3.0])
def test_closed_form_supremum_equals_randomized_response_on_a_grid(eps):
    """Lemma 1: f_ε(α) = sup_t D_α(RR_{ε,t}(0)‖RR_{ε,t}(1)); the stationary point is checked against a
    dense grid over t of the divergence computed from the RR probabilities directly."""
    t = np.linspace(0, eps, 20001)[1:-1]
    p = (np.exp(-t) - np.exp(-eps)) / (1 - np.exp(-eps))
    q = np.exp(t) * p
    for a in (2, 3, 7, 20, 64):
        grid = np.max(np.logaddexp(a * np.log(q) + (1 - a) * np.log(p),
                                   a * np.log1p(-q) + (1 - a) * np.log1p(-p)) / (a - 1))
        f = bounded_range_rdp(a, eps)
        assert grid <= f * (1 + 1e-9) + 1e-15
        assert f <= grid * (1 + 1e-6) + 1e-12


def test_bound_never_exceeds_zcdp_nor_pure_dp_and_is_stable():
    for eps in np.geomspace(1e-4, 10, 41):
        alphas = alpha_grid(200_000)
        f = bounded_range_rdp(alphas, eps)
        assert np.all(np.isfinite(f)) and np.all(f >= 0)
        assert np.all(f <= exponential_zcdp_rdp(alphas, eps) * (1 + 1e-12))
        assert np.all(f <= pure_dp_rdp(alphas, eps) + 1e-12)
        assert np.all(np.diff(f) >= -1e-12)  # RDP is non-decreasing in α
    # α = 1: Dong et al.'s KL bound, below ε²/8
    assert bounded_range_rdp(1, 0.5) < 0.5**2 / 8
    with pytest.raises(AccountingError):
        bounded_range_rdp(2, -1.0)


def test_opendp_zcdp_map_of_its_noisy_max_is_eps_squared_over_8():
    """The sampler's own accountant (OpenDP) agrees with Cesar–Rogers for scale 2Δ/ε."""
    from opendp import domains, measurements, measures, metrics, mod

    mod.enable_features("contrib")
    for eps, sens in ((1.0, 0.75), (0.1, 3.0)):
        m = measurements.make_noisy_max(domains.vector_domain(domains.atom_domain(T=float, nan=False)),
                                        metrics.linf_distance(T=float), measures.zero_concentrated_divergence(),
                                        scale=2 * sens / eps)
        assert math.isclose(m.map(sens), eps**2 / 8, rel_tol=1e-9)
        assert math.isclose(exponential_zcdp_rdp(1, eps), eps**2 / 8)


# --------------------------------------------------------------------------- ledger and calibration


def test_event_ledger_reproduces_the_random_tree_accountant_and_pld():
    sigma, gamma, T = 3.0, 0.1, 50
    ev = compose(compose(PoissonSampledEvent(gamma, GaussianEvent(sigma / math.sqrt(2))), count=T),
                 LaplaceEvent(0.1), LaplaceEvent(0.005))
    alphas, rho = total_rdp(sigma, gamma, T, 0.1, 0.005)
    np.testing.assert_allclose(event_rdp(ev, alphas), rho, rtol=1e-12)
    pld = event_pld(ev).get_epsilon_for_delta(1e-6)
    assert math.isclose(pld, epsilon_pld(sigma, gamma, T, 1e-6, 0.1, 0.005), rel_tol=1e-9)


def test_greedy_calibration_meets_target_and_charges_every_release():
    T, d, delta = 20, 3, 1e-5
    cal = calibrate_greedy(1.0, delta, T, d, 0.7, 0.1, 0.005)
    assert 0.999 < cal.epsilon <= 1.0
    e_sel, sigma = cal.eps_select, cal.sigma
    # the split of the zCDP budget is 0.7 : 0.3
    assert math.isclose(T * d * e_sel**2 / 8 / (T / sigma**2), 0.7 / 0.3, rel_tol=1e-9)
    # ledger by hand: T·d·f(α) + T·α/σ² + two Laplace releases
    a = alpha_grid(512)
    rho = T * d * bounded_range_rdp(a, e_sel) + T * a / sigma**2 + pure_dp_rdp(a, 0.1) + pure_dp_rdp(a, 0.005)
    assert math.isclose(float(np.min(rdp_to_dp(a, rho, delta))), cal.epsilon, rel_tol=1e-9)
    # Thm. 1 buys budget over zCDP composition: the same releases cost more under ε²/8
    rho_z = T * d * exponential_zcdp_rdp(a, e_sel) + T * a / sigma**2 + pure_dp_rdp(a, 0.1) + pure_dp_rdp(a, 0.005)
    assert float(np.min(rdp_to_dp(a, rho_z, delta))) > cal.epsilon + 1e-3
    # a larger budget for the same releases would exceed the target
    bigger = greedy_training_event(*greedy_budget(1.01 * (T * d * e_sel**2 / 8 / 0.7), T, d, 0.7), d, T, 0.1,
                                   0.005)
    assert event_epsilon_rdp(bigger, delta)[0] > 1.0


def test_greedy_calibration_with_pld_is_valid_under_dp_accounting():
    cal = calibrate_greedy(1.0, 1e-5, 10, 2, 0.7, 0.1, 0.005, "pld")
    assert cal.epsilon <= 1.0 + 1e-9
    ev = greedy_training_event(cal.eps_select, cal.sigma, 2, 10, 0.1, 0.005)
    assert event_pld(ev).get_epsilon_for_delta(1e-5) <= 1.0 + 1e-6
    assert isinstance(ev, ComposedEvent)
    assert event_rdp(ExponentialEvent(0.3), np.array([5]))[0] == bounded_range_rdp(5, 0.3)


# --------------------------------------------------------------------------- mechanism


def test_score_sensitivity_against_brute_force():
    """max |score(D ∪ {x}) − score(D)| over counts, sums and gradients stays below 3g*² and approaches it."""
    gs = 0.5
    n = np.arange(0, 400)[:, None, None]
    G = np.linspace(-1, 1, 81)[None, :, None] * n * gs
    g = np.linspace(-1, 1, 21)[None, None, :] * gs
    for lam in (0.0, 0.3, 1.0, 5.0):
        with np.errstate(divide="ignore", invalid="ignore"):
            before = np.where(n + lam > 0, G**2 / (n + lam), 0.0)
        diff = np.abs((G + g) ** 2 / (n + 1 + lam) - before)
        assert diff.max() <= score_sensitivity(gs) + 1e-12
    assert diff.max() > 0.95 * score_sensitivity(gs) * (1 - 5 / 400)


def test_exponential_mechanism_selection_frequencies():
    """SecureRandomness selects i with probability ∝ exp(score_i/scale) (chi-square, p = 1e-6)."""
    scores = np.array([0.0, 1.5, 3.0, -2.0, 2.2])
    scale = 1.5
    probs = np.exp(scores / scale) / np.exp(scores / scale).sum()
    n = 6000
    r = SecureRandomness()
    counts = np.bincount([r.exponential_mechanism(scores, scale, 1.0) for _ in range(n)], minlength=5)
    chi2 = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    assert chi2 < stats.chi2.isf(1e-6, df=4), (counts, n * probs)
    with pytest.raises(ValueError):
        r.exponential_mechanism(np.array([1.0, np.nan]), 1.0, 1.0)
    with pytest.raises(ValueError):
        r.exponential_mechanism(np.array([1.0]), 0.0, 1.0)


# --------------------------------------------------------------------------- builder


@pytest.fixture(scope="module")
def adult_small():
    ds = load(EXAMPLES / "adult" / "adult.data", Schema.load(EXAMPLES / "adult" / "schema.toml"))
    return ds


def brute_force_splits(ds, hp, local, cand, round_id=0):
    """The noise-free greedy tree computed record by record (no histograms, no codes)."""
    from fedsbdt.common import kernels
    from fedsbdt.common.boosting import TASK_CODE

    enc = local.enc
    gq, _ = kernels.grad_hess_units(local.pred, local.y, TASK_CODE[local.task], enc.scale, enc.grad.bound_units,
                                    enc.hess.bound_units)
    g = gq / enc.scale
    is_cat = np.array([f.is_categorical for f in ds.schema.features])
    X = ds.X
    left_of = np.empty((cand.feature.size, X.shape[0]), bool)
    for c in range(cand.feature.size):
        x = X[:, cand.feature[c]]
        left_of[c] = (x == cand.threshold[c]) if is_cat[cand.feature[c]] else (x < cand.threshold[c])
    node = np.zeros(X.shape[0], np.int64)
    chosen = np.zeros(hp.leaves - 1, np.int64)
    for level in range(hp.depth):
        for q in range(2**level):
            inside = node == q
            GL = (left_of & inside) @ g
            NL = (left_of & inside).sum(axis=1).astype(float)
            score = gains(GL, NL, g[inside].sum(), float(inside.sum()), hp.l2)
            chosen[2**level - 1 + q] = int(np.argmax(score))
        c = chosen[2**level - 1 + node]
        node = 2 * node + ~left_of[c, np.arange(X.shape[0])]
    return cand.feature[chosen], cand.threshold[chosen]


def every_7th(ds, hp) -> LocalData:
    """A site holding every 7th Adult record, after an initial score of −1.1."""
    idx = np.arange(0, ds.n, 7)
    local = LocalData(ds.X[idx], ds.y[idx], ds.ids[idx], "binary", hp,
                      is_categorical=np.array([f.is_categorical for f in ds.schema.features]))
    local.set_init_score(-1.1)
    return local


def test_greedy_splits_equal_the_record_by_record_argmax(adult_small):
    ds = adult_small
    hp = Hyperparameters(tree_builder="greedy", depth=3, split_candidates=16, subsample=1.0, cyclical=False)
    local = every_7th(ds, hp)
    builder = GreedyTrees(ds.schema, hp, select=0.5)
    sp = builder.splits(0, local, insecure(noise=False))
    f, t = brute_force_splits(ds.subset(np.arange(0, ds.n, 7)), hp, local, builder.candidates)
    np.testing.assert_array_equal(sp.features, f)
    np.testing.assert_array_equal(sp.thresholds, t)
    # the tree routes records as the engine's walk does
    assert sp.features.size == 7 and len(set(sp.features.tolist())) > 1
    # cyclical: tree r tests only feature r mod m
    hpc = hp.replace(cyclical=True)
    spc = GreedyTrees(ds.schema, hpc, select=0.5).splits(5, local, insecure(noise=False))
    assert set(spc.features.tolist()) == {5 % ds.schema.n_features}


def test_candidates_are_the_public_grid(adult_small):
    cand, edges = Candidates.grid(adult_small.schema, 8)
    for f, feat in enumerate(adult_small.schema.features):
        sel = cand.feature == f
        if feat.is_categorical:
            np.testing.assert_array_equal(cand.threshold[sel], np.arange(len(feat.levels)))
        else:
            np.testing.assert_array_equal(cand.threshold[sel], edges[f])
            assert np.all((cand.threshold[sel] > feat.lo) & (cand.threshold[sel] < feat.hi))


def test_interaction_problem_greedy_beats_random_with_few_trees():
    """Paper §6.1 problem 1 (labels from interactions only), noise off: 5 greedy trees find the
    interactions that 5 random trees miss (the paper's Fig. 2 at the left end)."""
    from fedsbdt.common.metrics import auc
    from fedsbdt.common.simulate import interaction_problem

    ds = interaction_problem(np.random.default_rng(3), 6000, problem=1)
    tr, te = ds.subset(np.arange(4200)), ds.subset(np.arange(4200, 6000))
    result = {}
    for builder in ("random", "greedy"):
        aucs = []
        for seed in range(3):
            hp = Hyperparameters.from_dict({"tree_builder": builder, "trees": 5, "depth": 3, "learning_rate": 0.3,
                                            "seed": seed, "split_candidates": 32})
            model = train(tr, hp, randomness=insecure(seed, noise=False)).model
            aucs.append(auc(te.y, model.predict(te.X)))
        result[builder] = float(np.mean(aucs))
    assert result["greedy"] > 0.9 and result["greedy"] > result["random"] + 0.15, result


# --------------------------------------------------------------------------- configuration and CLI


def test_configuration_refusals_and_defaults():
    hp = Hyperparameters.from_dict({"tree_builder": "greedy"})
    assert hp.subsample == 1.0 and hp.split_candidates == 32 and not hp.cyclical
    assert Hyperparameters.from_dict({"tree_builder": "greedy", "split_candidates": 8}).split_candidates == 8
    with pytest.raises(ConfigError, match="filter does not apply"):
        Hyperparameters(tree_builder="greedy", subsample=1.0, split_candidates=8, filter=True)
    with pytest.raises(ConfigError, match="subsample = 1"):
        Hyperparameters(tree_builder="greedy", subsample=0.5, split_candidates=8)
    with pytest.raises(ConfigError, match="split_candidates"):
        Hyperparameters(tree_builder="greedy", subsample=1.0, split_candidates=0)
    with pytest.raises(ConfigError, match="tree_builder"):
        Hyperparameters(tree_builder="forest")
    with pytest.raises(ConfigError, match="selection_share"):
        Hyperparameters(tree_builder="greedy", subsample=1.0, split_candidates=8, selection_share=1.0)


def test_cli_greedy_train_evaluate_account(tmp_path, capsys):
    schema, data = EXAMPLES / "abalone" / "schema.toml", EXAMPLES / "abalone" / "abalone.data"
    out = tmp_path / "m.json"
    assert main(["train", "--schema", str(schema), "--data", str(data), "--tree-builder", "greedy", "--trees", "4",
                 "--depth", "2", "--out", str(out), "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["epsilon"] <= 1.0 and res["trees"] == 4
    model = Ensemble.load(out)
    assert model.hyperparameters.tree_builder == "greedy" and model.privacy["tree_builder"] == "greedy"
    assert model.privacy["eps_select"] > 0
    assert main(["account", "--tree-builder", "greedy", "--trees", "4", "--depth", "2", "--json"]) == 0
    acc = json.loads(capsys.readouterr().out)
    assert acc["eps_select"] == model.privacy["eps_select"] and acc["sigma"] == model.privacy["sigma"]
    for bad in (["--filter"], ["--subsample", "0.3"]):
        assert main(["train", "--schema", str(schema), "--data", str(data), "--tree-builder", "greedy",
                     "--out", str(tmp_path / "x.json"), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "greedy" in err[0]
        assert not (tmp_path / "x.json").exists()


# ------------------------------------------------------------------- downstream: export, estimators, report, plan


@pytest.fixture(scope="module")
def greedy_adult(adult_small):
    hp = Hyperparameters.from_dict({"tree_builder": "greedy", "trees": 6, "depth": 3, "learning_rate": 0.3})
    return train(adult_small, hp).model  # secure randomness: the real mechanism end to end


def test_greedy_model_round_trips_and_exports_to_xgboost(greedy_adult, adult_small, tmp_path):
    import xgboost as xgb

    from fedsbdt.common.export_xgboost import export_xgboost

    path = tmp_path / "g.json"
    greedy_adult.save(path)
    again = Ensemble.load(path)
    X = adult_small.X[:2000]
    np.testing.assert_array_equal(again.predict(X), greedy_adult.predict(X))
    export_xgboost(greedy_adult, tmp_path / "g.xgb.json")
    theirs = xgb.Booster(model_file=str(tmp_path / "g.xgb.json")).predict(xgb.DMatrix(X))
    assert np.abs(theirs - greedy_adult.predict(X)).max() <= 1e-6


def test_report_draws_the_greedy_trees(greedy_adult, tmp_path):
    from fedsbdt.common.report import build_report, draws_trees

    html = build_report(greedy_adult, plots=False)
    assert draws_trees(greedy_adult) and html.count("<svg") == len(greedy_adult.trees)
    t = greedy_adult.trees[0]
    root = greedy_adult.schema.features[int(t.features[0])]
    assert (f"{root.name} = " if root.is_categorical else f"{root.name} &lt; ") in html
    assert f"{float(t.leaves[0]):+.4f}" in html and "ε_select" in html
    random_model = Ensemble(greedy_adult.schema, Hyperparameters(depth=3), 0.0, greedy_adult.trees,
                            greedy_adult.privacy)
    assert not draws_trees(random_model) and "<svg" not in build_report(random_model, plots=False)


def test_report_epsilon_curve_of_a_greedy_model_ends_at_its_epsilon(greedy_adult):
    from fedsbdt.common.report import epsilon_curve

    rs, eps = epsilon_curve(greedy_adult.privacy, depth=greedy_adult.depth)
    assert rs[-1] == len(greedy_adult.trees) and math.isclose(eps[-1], greedy_adult.privacy["epsilon"], rel_tol=1e-9)
    assert np.all(np.diff(eps) > 0)


def test_estimator_with_greedy_trees(adult_small):
    from fedsbdt.common.estimators import SBDTClassifier

    est = SBDTClassifier(schema=adult_small.schema, tree_builder="greedy", trees=3, depth=2)
    hp = est._hyperparameters()
    assert hp.subsample == 1.0 and hp.split_candidates == 32 and not hp.cyclical
    est.fit(adult_small.X[:3000], adult_small.y[:3000])
    assert est.privacy_["tree_builder"] == "greedy" and len(est.model_.trees) == 3
    with pytest.raises(ConfigError, match="filter"):
        SBDTClassifier(schema=adult_small.schema, tree_builder="greedy", filter=True).fit(adult_small.X[:10],
                                                                                         adult_small.y[:10])


def test_federated_plan_needs_histogram_selection(adult_small):
    from fedsbdt.common.federation.plan import PlanError, SiteEntry, make_plan

    sites = [SiteEntry(f"s{i}", bytes([i]) * 32) for i in range(3)]
    with pytest.raises(PlanError, match="set selection = \"histogram\""):
        make_plan(adult_small.schema, Hyperparameters.from_dict({"tree_builder": "greedy"}), sites)
    hp = Hyperparameters.from_dict({"tree_builder": "greedy", "selection": "histogram", "seed": 1})
    assert make_plan(adult_small.schema, hp, sites).greedy_grid is not None  # tests/federation/test_greedy_*


# --------------------------------------------------------------------------- histogram selection (the federated rule)


def test_site_level_vectors_add_up_to_the_central_one(adult_small):
    """Three sites' level vectors sum exactly (int64) to the vector of all their records."""
    from fedsbdt.common import kernels
    from fedsbdt.common.modes.greedy.levels import level_layout, level_sums

    ds = adult_small
    cand, edges = Candidates.grid(ds.schema, 16)
    is_cat = np.array([f.is_categorical for f in ds.schema.features])
    codes = kernels.bin_codes(ds.X, edges, is_cat)
    rng = np.random.default_rng(0)
    node = rng.integers(0, 4, ds.n)
    gq = rng.integers(-2**19, 2**19, ds.n)
    present = rng.random(ds.n) < 0.9
    layout = level_layout(ds.schema, edges, 2, np.arange(ds.schema.n_features))
    whole = level_sums(codes, node, gq, present, layout)
    parts = np.array_split(np.arange(ds.n), 3)
    assert whole.size == layout.length
    np.testing.assert_array_equal(sum(level_sums(codes[p], node[p], gq[p], present[p], layout) for p in parts),
                                  whole)
    # the count half: every present record once per carried feature
    assert whole[layout.length // 2:].sum() == present.sum() * ds.schema.n_features


def test_histogram_selection_without_noise_is_the_argmax_of_the_gains(adult_small):
    ds = adult_small
    hp = Hyperparameters.from_dict({"tree_builder": "greedy", "selection": "histogram", "depth": 3,
                                    "split_candidates": 16})
    local = every_7th(ds, hp)
    builder = GreedyTrees(ds.schema, hp, select=3.0)
    sp = builder.splits(0, local, insecure(noise=False))
    f, t = brute_force_splits(ds.subset(np.arange(0, ds.n, 7)), hp, local, builder.candidates)
    # the same tree as the exponential path's arg max (up to float ties between equal-gain candidates)
    assert sp.features[0] == f[0] and sp.thresholds[0] == t[0]
    assert (sp.features == f).mean() >= 5 / 7


def test_level_noise_makes_a_gaussian_of_multiplier_sigma_over_sqrt2():
    """Worst-case record: F gradient entries of g* and F counts of 1; Σ (Δ_i/s_i)² = 2/σ_s²."""
    from fedsbdt.common.modes.greedy.levels import LevelLayout, level_noise_scales

    F, units, sigma_s = 5, 2**19, 7.0
    layout = LevelLayout(2, np.arange(F), np.full(F, 9), np.zeros(F, bool))
    s = level_noise_scales(layout, units, sigma_s)
    half = s.size // 2
    worst = F * (units / s[0]) ** 2 + F * (1.0 / s[half]) ** 2
    assert math.isclose(worst, 2.0 / sigma_s**2, rel_tol=1e-12)
    shares = level_noise_scales(layout, units, sigma_s, shares=4)
    np.testing.assert_allclose(4 * shares**2, s**2, rtol=1e-12)


def test_histogram_calibration_is_all_gaussian_and_matches_pld():
    cal = calibrate_greedy(1.0, 1e-5, 20, 3, 0.7, 0.1, 0.005, selection="histogram")
    assert cal.sigma_select > 0 and cal.eps_select == 0 and 0.999 < cal.epsilon <= 1.0
    assert math.isclose(20 * 3 / cal.sigma_select**2 / (20 / cal.sigma**2), 0.7 / 0.3, rel_tol=1e-9)
    ev = greedy_training_event(cal.sigma_select, cal.sigma, 3, 20, 0.1, 0.005, "histogram")
    pld = event_pld(ev).get_epsilon_for_delta(1e-5)
    assert pld <= cal.epsilon  # PLD is tighter than RDP for Gaussian ledgers
    with pytest.raises(ConfigError, match="selection"):
        Hyperparameters(selection="histogram")  # random trees have no selection


def test_cli_trains_with_histogram_selection(tmp_path, capsys):
    schema, data = EXAMPLES / "abalone" / "schema.toml", EXAMPLES / "abalone" / "abalone.data"
    out = tmp_path / "h.json"
    assert main(["train", "--schema", str(schema), "--data", str(data), "--tree-builder", "greedy", "--selection",
                 "histogram", "--trees", "4", "--depth", "2", "--out", str(out), "--json", "--quiet"]) == 0
    capsys.readouterr()
    p = Ensemble.load(out).privacy
    assert p["selection"] == "histogram" and p["sigma_select"] > 0 and p["epsilon"] <= 1.0


def test_report_curve_charges_histogram_levels(tmp_path):
    from fedsbdt.common.report import epsilon_curve

    schema, data = EXAMPLES / "abalone" / "schema.toml", EXAMPLES / "abalone" / "abalone.data"
    ds = load(data, Schema.load(schema))
    model = train(ds, Hyperparameters.from_dict({"tree_builder": "greedy", "selection": "histogram", "trees": 3,
                                                 "depth": 2})).model
    rs, eps = epsilon_curve(model.privacy, depth=model.depth)
    assert math.isclose(eps[-1], model.privacy["epsilon"], rel_tol=1e-9)


def test_select_splits_ignores_sides_that_only_noise_fills():
    """One node, one numeric feature with 4 bins: a split leaving one record alone has the largest noisy gain
    (its gradient noise squared over λ) but is skipped when its side is below min_count."""
    from fedsbdt.common.modes.greedy.levels import LevelLayout, select_splits

    layout = LevelLayout(1, np.array([0]), np.array([4]), np.array([False]))
    grad = np.array([40.0, -300.0, 310.0, 5.0])  # bin 0 holds one record with a noisy gradient sum
    count = np.array([1.0, 1000.0, 1000.0, 1000.0])
    noisy = np.concatenate([grad, count])
    k, j = select_splits(noisy, layout, 1.0, 0.1)
    assert (k[0], j[0]) == (0, 0)  # without the guard: the lone record wins
    k, j = select_splits(noisy, layout, 1.0, 0.1, min_count=50.0)
    assert (k[0], j[0]) == (0, 1)  # bins {0, 1} | {2, 3}: the real signal
    k, j = select_splits(noisy, layout, 1.0, 0.1, min_count=5000.0)  # nothing qualifies: most balanced
    assert (k[0], j[0]) == (0, 1)


def test_level_sums_are_exact_for_large_weights():
    from fedsbdt.common.modes.greedy.levels import LevelLayout, level_sums

    layout = LevelLayout(1, np.array([0]), np.array([2]), np.array([False]))
    codes = np.zeros((4, 1), np.uint8)
    g = np.array([2**52 + 1, 2**52 + 1, -1, 3], np.int64)
    v = level_sums(codes, np.zeros(4, np.int64), g, np.ones(4, bool), layout)
    assert v[0] == int(g.sum()) and v[2] == 4


# --------------------------------------------------------------------------- adaptive Hessian sketch (XGB_ada)


def test_sketch_candidates_follow_the_hessian_mass():
    from fedsbdt.common.modes.greedy.levels import sketch_candidates

    mass = np.zeros(129)
    mass[100:110] = 50.0  # all Hessian weight in bins 100..109
    (chosen,) = sketch_candidates(mass[None, :], 4)
    assert np.all((chosen >= 100) & (chosen <= 109)) and chosen.size == 4
    # equal mass 3 in 129 bins (total 387): the first edges whose left mass 3·(e+1) reaches 387·j/4
    (uniform,) = sketch_candidates(np.full((1, 129), 3.0), 3)
    np.testing.assert_array_equal(uniform, [32, 64, 96])
    (fallback,) = sketch_candidates(-np.ones((1, 129)), 4)  # no positive mass: uniform subset
    assert fallback.size == 4


def test_sketch_calibration_charges_a_gaussian_per_tree():
    T, d, delta = 20, 3, 1e-5
    cal = calibrate_greedy(1.0, delta, T, d, 0.6, 0.1, 0.005, sketch_share=0.1)
    assert cal.sigma_sketch > 0 and 0.999 < cal.epsilon <= 1.0
    zc_sel, zc_leaf, zc_sk = T * d * cal.eps_select**2 / 8, T / cal.sigma**2, T / cal.sigma_sketch**2
    assert math.isclose(zc_sel / zc_sk, 6.0, rel_tol=1e-9) and math.isclose(zc_leaf / zc_sk, 3.0, rel_tol=1e-9)
    a = alpha_grid(512)
    rho = (T * d * bounded_range_rdp(a, cal.eps_select) + T * a / cal.sigma**2 + T * a / cal.sigma_sketch**2
           + pure_dp_rdp(a, 0.1) + pure_dp_rdp(a, 0.005))
    assert math.isclose(float(np.min(rdp_to_dp(a, rho, delta))), cal.epsilon, rel_tol=1e-9)


def test_sketch_noise_makes_a_gaussian_of_multiplier_sigma_over_sqrt2():
    from fedsbdt.common.modes.greedy.levels import sketch_noise_scale

    F, units, sk = 6, 2**18, 11.0
    s = sketch_noise_scale(F, units, sk)
    assert math.isclose(F * (units / s) ** 2, 2 / sk**2, rel_tol=1e-12)


def test_greedy_with_sketch_chooses_among_the_sketched_candidates(adult_small):
    from fedsbdt.common.modes.greedy.levels import sketch_candidates, sketch_sums

    ds = adult_small
    hp = Hyperparameters.from_dict({"tree_builder": "greedy", "depth": 3, "split_candidates": 8,
                                    "sketch_share": 0.1, "selection_share": 0.6})
    local = every_7th(ds, hp)
    builder = GreedyTrees(ds.schema, hp, select=0.5, sigma_sketch=5.0)
    assert builder.candidates.feature.size > Candidates.grid(ds.schema, 8)[0].feature.size  # fine grid: 32
    sp = builder.splits(0, local, insecure(noise=False))
    # noise off: the kept candidates are the exact Hessian quantiles of every numeric feature
    from fedsbdt.common import kernels
    from fedsbdt.common.boosting import TASK_CODE

    enc = local.enc
    _, hq = kernels.grad_hess_units(local.pred, local.y, TASK_CODE["binary"], enc.scale, enc.grad.bound_units,
                                    enc.hess.bound_units)
    codes = builder._codes(local)
    for k, f in enumerate(sp.features):
        if ds.schema.features[f].is_categorical:
            continue
        sums = sketch_sums(codes, hq, np.ones(local.n, bool), np.array([f]), len(builder.edges[f]) + 1)
        kept = builder.edges[f][sketch_candidates(sums, 8)[0]]
        assert sp.thresholds[k] in kept
    with pytest.raises(ConfigError, match="sketch_share"):
        Hyperparameters.from_dict({"tree_builder": "greedy", "sketch_share": 0.4, "selection_share": 0.6})
    with pytest.raises(ConfigError, match="sketch_share"):
        Hyperparameters(sketch_share=0.1)
    with pytest.raises(ConfigError, match="sketch_share"):
        Hyperparameters.from_dict({"tree_builder": "greedy", "sketch_share": 0.1, "selection": "histogram",
                                   "selection_share": 0.6})


def test_cli_trains_with_the_sketch_and_the_report_curve_charges_it(tmp_path, capsys):
    from fedsbdt.common.report import epsilon_curve

    schema, data = EXAMPLES / "abalone" / "schema.toml", EXAMPLES / "abalone" / "abalone.data"
    out = tmp_path / "s.json"
    assert main(["train", "--schema", str(schema), "--data", str(data), "--tree-builder", "greedy", "--sketch-share",
                 "0.1", "--selection-share", "0.6", "--trees", "4", "--depth", "2", "--out", str(out), "--json",
                 "--quiet"]) == 0
    capsys.readouterr()
    model = Ensemble.load(out)
    assert model.privacy["sigma_sketch"] > 0
    rs, eps = epsilon_curve(model.privacy, depth=model.depth)
    assert math.isclose(eps[-1], model.privacy["epsilon"], rel_tol=1e-9)
