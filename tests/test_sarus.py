"""Sarus DP-XGBoost mode (docs/sarus.md): sensitivities, releases, accounting, the two fixed flaws, CLI.

Oracles: brute force over neighbouring (n, G, g) for every sensitivity; the exact Rényi divergence of the
subsampled randomized-response pair in 60-digit arithmetic (mpmath); dp-accounting's PLD of that pair (the
tight ε(δ), which no valid bound may undercut and the paper's pure ε must dominate); the discrete Laplace
law (moments at p = 1e-6); binomial bounds at p = 1e-6 for the private min_child_weight decision.
"""
import json
import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from fedsbdt.common.modes.sarus import mechanism as sarus
from fedsbdt.common.accountant import (PoissonSampledEvent, alpha_grid, event_rdp,
                               pure_dp_rdp, pure_epsilon, rdp_to_dp, subsampled_pure_dp_rdp, subsampled_pure_epsilon)
from fedsbdt.common.boosting import LocalData
from fedsbdt.common.builders import leaf_regions
from fedsbdt.common.modes.sarus.builder import SarusTrees
from fedsbdt.cli import main
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import Dataset, load
from fedsbdt.common.engine import train
from fedsbdt.common.model import Ensemble
from fedsbdt.common.randomness import SecureRandomness
from fedsbdt.common.schema import Schema
from conftest import EXAMPLES

Z = stats.norm.isf(0.5e-6)  # two-sided p = 1e-6


# --------------------------------------------------------------------------- sensitivities (brute force)


def neighbours(N: int, g_star: float):
    """(n, G, g) of neighbouring nodes: n records with gradient sum G (extremes and interior), plus one of g."""
    for n in range(0, 3 * N + 40):
        for G in np.linspace(-n * g_star, n * g_star, 9):
            for g in (-g_star, -0.3 * g_star, g_star):
                yield n, G, g


@pytest.mark.parametrize("N,lam,h", [(0, 0.1, 1.0), (1, 0.0, 1.0), (5, 0.1, 1.0), (50, 0.1, 1.0), (50, 0.1, 0.25),
                                     (7, 2.0, 0.25)])
def test_leaf_sensitivity_is_the_brute_force_maximum(N, lam, h):
    g_star = 0.8
    worst = max(abs(sarus.leaf_value(G + g, n + 1, N, lam, h) - sarus.leaf_value(G, n, N, lam, h))
                for n, G, g in neighbours(N, g_star))
    delta = sarus.leaf_sensitivity(g_star, N, lam, h)
    assert worst <= delta * (1 + 1e-12)
    assert worst >= delta * (1 - 1e-9)  # attained: the bound is the sensitivity, not a loose bound
    if N + lam / h >= 1:
        assert delta <= 2 * g_star / h / (N + 1 + lam / h) + 1e-15  # never above the paper's eq. 7


@pytest.mark.parametrize("N,lam,h", [(0, 0.1, 1.0), (50, 0.1, 1.0), (20, 1.0, 0.25)])
def test_gain_term_sensitivity_against_brute_force(N, lam, h):
    g_star = 1.0
    worst = max(abs(sarus.clamped_score(G + g, n + 1, N, lam, h) - sarus.clamped_score(G, n, N, lam, h))
                for n, G, g in neighbours(N, g_star))
    assert worst <= sarus.score_sensitivity(g_star, h)
    assert worst > 0.6 * sarus.score_sensitivity(g_star, h)  # and not vacuous


def test_leaf_sensitivity_refuses_an_unbounded_leaf():
    with pytest.raises(Exception, match="min_child_weight"):
        sarus.leaf_sensitivity(1.0, 0, 0.0)


# --------------------------------------------------------------------------- the releases' noise


def discrete_laplace_moments(b: float) -> tuple[float, float]:
    """Variance and fourth moment of Lap_Z(b) (pmf ∝ e^{−|x|/b}), summed exactly over its support."""
    x = np.arange(-int(60 * b) - 60, int(60 * b) + 61, dtype=np.float64)
    p = np.exp(-np.abs(x) / b)
    p /= p.sum()
    return float((p * x**2).sum()), float((p * x**4).sum())


def assert_discrete_laplace(noise: np.ndarray, b: float) -> None:
    """Mean 0 and variance of Lap_Z(b) within p = 1e-6 bounds, and a symmetric tail check."""
    var, m4 = discrete_laplace_moments(b)
    k = noise.size
    assert abs(noise.mean()) <= Z * math.sqrt(var / k)
    assert abs(noise.var() - var) <= Z * math.sqrt((m4 - var**2) / k) + 1e-12
    t = math.ceil(2 * b)
    tail = 2 * math.exp(-t / b) / (1 + math.exp(-1 / b))  # P(|X| ≥ t) of the discrete Laplace
    frac = float((np.abs(noise) >= t).mean())
    assert abs(frac - tail) <= Z * math.sqrt(tail * (1 - tail) / k)


def test_leaf_release_noise_is_discrete_laplace_of_the_leaf_sensitivity():
    rnd, k, scale = SecureRandomness(), 200_000, 2.0**20
    G, n = np.full(k, 3.25), np.full(k, 40.0)
    out = sarus.release_leaves(G, n, 1.0, 50, 0.1, 1.0, 0.7, scale, rnd)
    exact = np.rint(sarus.leaf_value(G, n, 50, 0.1) * scale)
    b = (sarus.leaf_sensitivity(1.0, 50, 0.1) * scale + 1) / 0.7
    assert math.isclose(b, sarus.leaf_noise_units(1.0, 50, 0.1, 0.7, scale))
    assert_discrete_laplace(np.rint(out * scale) - exact, b)


def test_histogram_and_count_releases_are_discrete_laplace():
    rnd, k = SecureRandomness(), 200_000
    counts = np.arange(k, dtype=np.int64) % 97
    assert_discrete_laplace(sarus.release_histograms(counts, 8, 0.9, rnd) - counts, 8 / 0.9)
    assert_discrete_laplace(sarus.release_counts(counts, 0.05, rnd) - counts, 1 / 0.05)


# --------------------------------------------------------------------------- accounting


def mp_renyi(p, q, alpha) -> float:
    return float(mpmath.log(sum(pi**alpha * qi**(1 - alpha) for pi, qi in zip(p, q))) / (alpha - 1))


@pytest.mark.parametrize("eps,gamma", [(0.05, 0.1), (0.4, 0.1), (2.0, 0.1), (2.0, 0.5), (6.0, 0.02)])
def test_subsampled_pure_dp_rdp_against_exact_divergences(eps, gamma):
    mpmath.mp.dps = 60
    e = mpmath.e**mpmath.mpf(eps)
    P, Q = [e / (1 + e), 1 / (1 + e)], [1 / (1 + e), e / (1 + e)]
    g = mpmath.mpf(gamma)
    M = [g * p + (1 - g) * q for p, q in zip(P, Q)]
    orders = np.array([2, 3, 7, 20, 64, 300])
    ours = subsampled_pure_dp_rdp(orders, eps, gamma)
    for a, v in zip(orders, ours):
        exact = max(mp_renyi(M, Q, int(a)), mp_renyi(Q, M, int(a)))
        assert math.isclose(v, exact, rel_tol=1e-9, abs_tol=1e-15)
    # limits: γ = 1 is randomized response; α → ∞ is the paper's amplified ε
    np.testing.assert_allclose(subsampled_pure_dp_rdp(orders, eps, 1.0), pure_dp_rdp(orders, eps), rtol=1e-12)
    assert subsampled_pure_dp_rdp(10**6, eps, gamma) <= subsampled_pure_epsilon(eps, gamma) + 1e-12
    assert subsampled_pure_dp_rdp(10**6, eps, gamma) >= 0.98 * subsampled_pure_epsilon(eps, gamma)


def subsampled_rr_pld(eps: float, gamma: float, rounds: int):
    """dp-accounting's PLD of ``rounds`` subsampled ε-RR trees, both directions (the tight ε(δ))."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    P = np.array([math.exp(eps), 1.0]) / (1 + math.exp(eps))
    Q = P[::-1]
    M = gamma * P + (1 - gamma) * Q
    lm, lq = {0: math.log(M[0]), 1: math.log(M[1])}, {0: math.log(Q[0]), 1: math.log(Q[1])}
    remove = pld_lib.from_two_probability_mass_functions(lm, lq, value_discretization_interval=1e-4)
    add = pld_lib.from_two_probability_mass_functions(lq, lm, value_discretization_interval=1e-4)
    return remove.self_compose(rounds), add.self_compose(rounds)


@pytest.mark.parametrize("epsilon", [1.0, 4.0, 10.0])
def test_paper_and_rdp_epsilons_against_dp_accounting(epsilon):
    """The paper's pure ε must dominate the tight ε(δ) of the same trees; our RDP ε must not undercut it."""
    T, gamma, delta, depth = 20, 0.1, 5e-8, 6
    eps_tree = sarus.paper_tree_epsilon(epsilon, gamma, T)
    assert math.isclose(sarus.paper_epsilon(eps_tree, gamma, T), epsilon, rel_tol=1e-12)
    assert math.isclose(sarus.paper_epsilon(eps_tree, gamma, T), T * math.log1p(gamma * math.expm1(eps_tree)))
    ev = sarus.training_event(eps_tree, depth, gamma, T, 0.0, 0.0)
    assert math.isclose(pure_epsilon(ev), epsilon, rel_tol=1e-12)  # the ledger's pure view is the paper's
    tight = max(p.get_epsilon_for_delta(delta) for p in subsampled_rr_pld(eps_tree, gamma, T))
    alphas = alpha_grid(2048)
    ours = float(np.min(rdp_to_dp(alphas, event_rdp(ev, alphas), delta)))
    assert tight <= epsilon + 1e-9
    assert tight - 1e-3 <= ours < epsilon  # valid, and tighter than the paper's at these ε


def test_tree_event_charges_every_release_on_the_subsample():
    b = sarus.TreeBudget.split(0.9, 6)
    assert math.isclose(b.sketch + 6 * (b.select + b.count) + b.leaf, 0.9)
    assert math.isclose(b.sketch, 0.3) and math.isclose(b.leaf, 0.3) and math.isclose(b.select, b.count)
    ev = sarus.tree_event(0.9, 6, 0.1)
    assert isinstance(ev, PoissonSampledEvent) and ev.rate == 0.1
    assert math.isclose(pure_epsilon(ev.event), 0.9)
    alphas = np.arange(2, 50)
    np.testing.assert_allclose(event_rdp(ev, alphas), subsampled_pure_dp_rdp(alphas, 0.9, 0.1))
    # without subsampling the inner curve is used: Laplace and bounded-range RDP, below randomized response
    full = event_rdp(PoissonSampledEvent(1.0, ev.event), alphas)
    assert np.all(full <= pure_dp_rdp(alphas, 0.9) + 1e-12)
    assert np.all(full < subsampled_pure_dp_rdp(alphas, 0.9, 1.0))


@pytest.mark.parametrize("accountant", ["rdp", "pure"])
def test_calibration_meets_the_target_under_its_accountant(accountant):
    cal = sarus.calibrate_sarus(2.0, 5e-8, 20, 6, 0.1, 0.1, 0.005, accountant)
    eps_tree = cal.eps_sketch * 3
    assert math.isclose(cal.epsilon, 2.0, rel_tol=1e-6) and cal.epsilon <= 2.0 + 1e-12
    if accountant == "pure":
        assert cal.delta == 0.0 and math.isclose(cal.eps_paper, 2.0) and cal.eps_rdp < 2.0
    else:
        assert cal.delta == 5e-8 and cal.eps_paper > 2.0  # the paper would claim more for the same trees
        ev = sarus.training_event(eps_tree * 1.001, 6, 0.1, 20, 0.2, 0.005)
        alphas = alpha_grid(2048)
        assert float(np.min(rdp_to_dp(alphas, event_rdp(ev, alphas), 5e-8))) > 2.0  # ε_t is the largest


# --------------------------------------------------------------------------- the two flaws, fixed


def test_min_child_weight_decision_reads_a_noisy_count_not_the_exact_one():
    """Neighbouring nodes with 2N and 2N − 1 records: the exact check splits one always and the other never.
    Ours splits both with nearly the same frequency: the ratio stays within e^ε_count (p = 1e-6 bounds)."""
    N, eps, k = 50, 0.3, 40_000
    rnd = SecureRandomness()
    assert sarus.may_split(2 * N, N) and not sarus.may_split(2 * N - 1, N)  # what the exact check would do
    freq = []
    for n in (2 * N, 2 * N - 1):
        noisy = sarus.release_counts(np.full(k, n), eps, rnd)
        freq.append(np.mean([sarus.may_split(v, N) for v in noisy]))
    lo = [f - Z * math.sqrt(f * (1 - f) / k) for f in freq]
    hi = [f + Z * math.sqrt(f * (1 - f) / k) for f in freq]
    assert 0.3 < freq[1] < freq[0] < 0.8
    assert lo[0] <= math.exp(eps) * hi[1] and lo[1] <= math.exp(eps) * hi[0]


class Recording:
    """SecureRandomness that records what the exponential mechanism and the count release were asked."""

    def __init__(self):
        self.inner, self.scores, self.laplace = SecureRandomness(), [], []

    def exponential_mechanism(self, scores, scale, sensitivity):
        self.scores.append(np.asarray(scores))
        return self.inner.exponential_mechanism(scores, scale, sensitivity)

    def discrete_laplace(self, scales):
        self.laplace.append(np.asarray(scales))
        return self.inner.discrete_laplace(scales)

    def subsample(self, p, ids, r):
        return self.inner.subsample(p, ids, r)


@pytest.fixture(scope="module")
def adult_small():
    ds = load(EXAMPLES / "adult" / "adult.data", Schema.load(EXAMPLES / "adult" / "schema.toml"))
    return ds.subset(np.arange(0, ds.n, 3))


def sarus_hp(**kw) -> Hyperparameters:
    return Hyperparameters.from_dict({"tree_builder": "sarus", "epsilon": 4.0, **kw})


def builder_and_local(ds: Dataset, hp: Hyperparameters):
    from fedsbdt.common.engine import calibration_for

    cal = calibration_for(hp)
    local = LocalData(ds.X, ds.y, ds.ids, ds.schema.task, hp, ds.schema.label_range,
                      is_categorical=np.array([f.is_categorical for f in ds.schema.features]))
    b = SarusTrees(ds.schema, hp, sarus.TreeBudget.split(cal.eps_sketch * 3, hp.depth))
    return b, local


def test_selection_runs_over_every_feature_candidate_pair(adult_small):
    """Flaw 1: one exponential mechanism per node over all (feature, candidate) pairs the sketch kept — not
    over a per-feature best gathered non-privately."""
    hp = sarus_hp(depth=2, min_child_weight=5, subsample=1.0)
    b, local = builder_and_local(adult_small, hp)
    rec = Recording()
    splits, leaf, values = b.release_tree(0, local, rec)
    n_features = adult_small.schema.n_features
    assert rec.scores, "no node was split"
    kept = {s.size for s in rec.scores}
    assert len(kept) == 1 and kept.pop() > 5 * n_features  # many candidates of many features, every node
    cat = sum(min(len(f.levels), 255) for f in adult_small.schema.features if f.is_categorical)
    numeric = sum(not f.is_categorical for f in adult_small.schema.features)
    assert rec.scores[0].size <= cat + numeric * hp.split_candidates
    # the count release (one per level) and the leaves are the Laplace draws besides the sketch
    assert values.shape == (hp.leaves,) and leaf.shape == (adult_small.n,)


def test_node_split_frequency_does_not_jump_at_the_exact_threshold(abalone):
    """Flaw 2 end to end: a root with exactly 2N records and its neighbour with 2N − 1 split about equally
    often (the exact check would split only the first)."""
    N = 60
    freq = []
    for n in (2 * N, 2 * N - 1):
        ds = abalone.subset(np.arange(n))
        hp = sarus_hp(depth=1, min_child_weight=N, subsample=1.0, epsilon=0.3, trees=20, init_share=0.0)
        b, local = builder_and_local(ds, hp)
        assert b.budget.count < 0.01  # count noise of scale > 100: both sides of 2N are likely
        rnd = SecureRandomness()
        splits = 0
        for _ in range(150):
            rec = Recording()
            rec.inner = rnd
            b.release_tree(0, local, rec)
            splits += bool(rec.scores)
        freq.append(splits / 150)
    for f in freq:
        assert 0.25 < f < 0.75
    assert abs(freq[0] - freq[1]) < 2 * Z * math.sqrt(0.25 / 150)


def test_leaf_regions_of_stopped_nodes():
    stopped = np.array([False, True, False, True, True, False, False])  # node 1 stopped (and so its children)
    np.testing.assert_array_equal(leaf_regions(stopped, 3), [1, 1, 1, 1, 11, 12, 13, 14])
    np.testing.assert_array_equal(leaf_regions(np.ones(3, bool), 2), [0, 0, 0, 0])


# --------------------------------------------------------------------------- configuration, CLI, downstream


def test_configuration_defaults_and_refusals():
    hp = Hyperparameters.from_dict({"tree_builder": "sarus"})
    assert (hp.trees, hp.l2, hp.learning_rate, hp.subsample, hp.min_child_weight, hp.grad_clip, hp.depth) == \
        (20, 0.1, 0.3, 0.1, 50, 1.0, 6)
    for bad, match in [({"accountant": "pld"}, "accountant"), ({"filter": True}, "filter"),
                       ({"sketch_share": 0.1}, "sketch_share"), ({"min_child_weight": -1}, "min_child_weight"),
                       ({"min_child_weight": 0, "l2": 0.0}, "min_child_weight")]:
        with pytest.raises(ConfigError, match=match):
            Hyperparameters.from_dict({"tree_builder": "sarus", **bad})
    with pytest.raises(ConfigError, match="pure"):
        Hyperparameters.from_dict({"accountant": "pure"})
    with pytest.raises(ConfigError, match="min_child_weight"):
        Hyperparameters.from_dict({"tree_builder": "greedy", "min_child_weight": 5})


def test_cli_train_evaluate_account_on_both_examples(tmp_path, capsys):
    for name, out in (("abalone", "rmse"), ("adult", "accuracy")):
        schema, data = EXAMPLES / name / "schema.toml", EXAMPLES / name / f"{name}.data"
        model = tmp_path / f"{name}.json"
        assert main(["train", "--data", str(data), "--schema", str(schema), "--out", str(model), "--json",
                     "--quiet", "--tree-builder", "sarus", "--epsilon", "4", "--trees", "8"]) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["trees"] == 8 and math.isclose(res["epsilon"], 4.0, rel_tol=1e-6)
        p = Ensemble.load(model).privacy
        assert p["tree_builder"] == "sarus" and p["eps_paper"] > 4.0 and p["min_child_weight"] == 50
        assert main(["evaluate", "--model", str(model), "--data", str(data), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[out] > 0
    assert main(["account", "--tree-builder", "sarus", "--epsilon", "1", "--accountant", "pure", "--json"]) == 0
    acc = json.loads(capsys.readouterr().out)
    assert acc["delta"] == 0.0 and math.isclose(acc["eps_paper"], 1.0) and acc["eps_rdp"] < 1.0
    assert main(["account", "--tree-builder", "sarus", "--epsilon", "1"]) == 0
    human = capsys.readouterr().out
    assert "paper claims" in human and "our ledger" in human
    assert main(["account", "--accountant", "pure"]) == 2
    assert "'pure'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def sarus_adult(adult_small):
    return train(adult_small, sarus_hp(trees=4, depth=3)).model  # secure randomness end to end


def test_model_file_and_cli_xgboost_export_predict_alike(sarus_adult, adult_small, tmp_path, capsys):
    """The saved model and its XGBoost export (through ``fedsbdt export``) predict what the model does."""
    import xgboost as xgb

    sarus_adult.save(tmp_path / "s.json")
    assert main(["export", "--model", str(tmp_path / "s.json"), "--format", "xgboost",
                 "--out", str(tmp_path / "s.xgb.json")]) == 0
    capsys.readouterr()
    X = adult_small.X[:2000]
    mine = Ensemble.load(tmp_path / "s.json").predict(X)
    np.testing.assert_array_equal(mine, sarus_adult.predict(X))
    booster = xgb.Booster(model_file=str(tmp_path / "s.xgb.json"))
    assert np.abs(booster.predict(xgb.DMatrix(X)) - mine).max() <= 1e-6


def test_report_renders_a_sarus_model_and_its_epsilon_curve(sarus_adult):
    from fedsbdt.common.report import build_report, epsilon_curve

    html = build_report(sarus_adult, plots=False)
    assert "sarus" in html
    rs, eps = epsilon_curve(sarus_adult.privacy, depth=sarus_adult.depth)
    assert rs[-1] == len(sarus_adult.trees) and math.isclose(eps[-1], sarus_adult.privacy["epsilon"], rel_tol=1e-9)
    assert np.all(np.diff(eps) > 0)
    pure = dict(sarus_adult.privacy, accountant="pure", delta=0.0, epsilon=sarus_adult.privacy["eps_paper"])
    rs, eps = epsilon_curve(pure, depth=sarus_adult.depth)
    assert math.isclose(eps[-1], sarus_adult.privacy["eps_paper"], rel_tol=1e-12)
    pure_model = Ensemble(sarus_adult.schema, sarus_adult.hyperparameters, 0.0, sarus_adult.trees, pure)
    assert "pure differential privacy" in build_report(pure_model, plots=True)  # δ = 0 reads as pure DP


def test_estimator_with_sarus_trees(adult_small):
    from fedsbdt.common.estimators import SBDTClassifier

    est = SBDTClassifier(schema=adult_small.schema, tree_builder="sarus", epsilon=4.0, trees=3)
    hp = est._hyperparameters()
    assert hp.subsample == 0.1 and hp.min_child_weight == 50 and hp.depth == 6 and hp.l2 == 0.1
    est.fit(adult_small.X[:4000], adult_small.y[:4000])
    assert est.privacy_["tree_builder"] == "sarus" and len(est.model_.trees) == 3


def test_federated_plans_run_sarus_with_gaussian_releases_not_pure_dp(adult_small):
    """A federation runs Sarus trees with Gaussian releases (tests/federation/test_sarus_federation.py): its plan
    is calibrated by the RDP ledger, and the paper's pure-DP accounting is refused there."""
    from fedsbdt.common.federation.plan import PlanError, SiteEntry, make_plan

    sites = [SiteEntry(f"s{i}", bytes([i]) * 32) for i in range(3)]
    plan = make_plan(adult_small.schema, Hyperparameters.from_dict({"tree_builder": "sarus"}), sites)
    cal = plan.calibration()
    assert cal.sigma > 0 and cal.sigma_select > 0 and cal.sigma_sketch > 0 and cal.epsilon <= 1.0 + 1e-9
    with pytest.raises(PlanError, match="accountant = \"rdp\""):
        make_plan(adult_small.schema, Hyperparameters.from_dict({"tree_builder": "sarus", "accountant": "pure"}), sites)
