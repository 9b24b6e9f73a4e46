"""DPBoost mode (common/modes/dpboost/mechanism.py, common/modes/dpboost/builder.py; docs/dpboost.md).

Each formula against an independent computation: the paper's closed forms (Lemma 2, Cor. 2, Thm. 7/8,
Alg. 2 line 8) by brute force, the bounded-range bound by a grid supremum, randomized response's RDP in
closed form, dp-accounting's Laplace RDP and PLD; the leaf noise by a χ² test at p = 1e-6; GDF, GLC and
the partition on real records.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from fedsbdt.common.modes.dpboost import mechanism as dpboost
from fedsbdt.common.accountant import (ComposedEvent, default_alpha_max, ExponentialEvent, LaplaceEvent, ParallelEvent, event_epsilon_rdp,
                               event_pld, event_rdp)
from fedsbdt.common.boosting import LocalData, split_edges
from fedsbdt.common.builders import score_sensitivity
from fedsbdt.cli import main
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.modes.dpboost.builder import DPBoostTrees, negative_gradient
from fedsbdt.common.engine import calibration_for, train, tree_builder_for
from fedsbdt.common.model import Ensemble
from fedsbdt.common.splits import random_splits
from conftest import EXAMPLES, insecure
from test_exact_noise import bins_for, counts, fits, laplace_cdf

P = 1e-6
ALPHAS = np.arange(2, 65)


def rr_rdp(alpha, eps):
    """Randomized response's Rényi divergence (closed form, direct): the worst ε-DP mechanism."""
    a = np.asarray(alpha, np.float64)
    return np.log((np.exp(a * eps) + np.exp(-(a - 1) * eps)) / (1 + np.exp(eps))) / (a - 1)


def br_rdp_grid(alpha, eps, n=20001):
    """Thm. 1 of "Revisiting" by a grid supremum over t ∈ [0, ε] (independent of the closed-form stationary point)."""
    t = np.linspace(0, eps, n)[None, :]
    a = np.asarray(alpha, np.float64)[:, None]
    p = (np.exp(-t) - np.exp(-eps)) / (1 - np.exp(-eps))
    return np.max((a * (t - eps) + np.log((np.exp(a * eps) - 1) * p + 1)) / (a - 1), axis=1)


# --------------------------------------------------------------------------- accounting


def test_paper_composition_is_sequential_over_ensembles_and_parallel_inside():
    assert dpboost.ensembles(1000, 50) == 20 and dpboost.ensembles(1001, 50) == 21
    assert dpboost.ensembles(50, 0) == 1
    assert dpboost.paper_epsilon(0.25, 1000, 50) == pytest.approx(5.0)
    assert dpboost.paper_epsilon(1.0, 50, 50, 0.1, 0.005) == pytest.approx(1.105)
    level, leaf = dpboost.tree_budget(1.0, 6)  # Alg. 1: half to the leaves, the rest split over the levels
    assert leaf == 0.5 and level == pytest.approx(0.5 / 6) and 6 * level + leaf == pytest.approx(1.0)


def test_parallel_event_costs_the_worst_part():
    a, b = LaplaceEvent(0.3), ComposedEvent((ExponentialEvent(0.2),), 3)
    curve = event_rdp(ParallelEvent((a, b, a)), ALPHAS)
    assert np.allclose(curve, np.maximum(rr_rdp(ALPHAS, 0.3), 3 * br_rdp_grid(ALPHAS, 0.2)), rtol=1e-6)
    # identical parts are one part, for dp-accounting too
    pld_one = event_pld(LaplaceEvent(0.3), 1e-3).get_epsilon_for_delta(1e-6)
    assert event_pld(ParallelEvent((a, a)), 1e-3).get_epsilon_for_delta(1e-6) == pytest.approx(pld_one)


def test_training_ledger_is_the_sum_of_closed_forms():
    """N_e · (depth · BR(ε_level) + RR(ε_leaf)) for the whole run, computed independently."""
    eps_tree, depth, T, Te = 0.8, 4, 120, 50
    level, leaf = 0.5 * eps_tree / depth, 0.5 * eps_tree
    want = 3 * (depth * br_rdp_grid(ALPHAS, level) + rr_rdp(ALPHAS, leaf))
    got = event_rdp(dpboost.training_event(eps_tree, depth, T, Te), ALPHAS)
    assert np.allclose(got, want, rtol=1e-6)
    # the initial score adds two more pure releases
    got_init = event_rdp(dpboost.training_event(eps_tree, depth, T, Te, 0.5, 0.1, 0.005), ALPHAS)
    assert np.allclose(got_init - got, rr_rdp(ALPHAS, 0.1) + rr_rdp(ALPHAS, 0.005), rtol=1e-6)


def test_laplace_charge_bounds_dp_accountings_laplace_rdp():
    """Our pure-DP charge of a Laplace release dominates dp-accounting's own Laplace RDP curve (and so does
    the ε it yields), and stays below the pure ε."""
    import dp_accounting
    from dp_accounting import rdp

    for eps in (0.05, 0.5, 2.0):
        acc = rdp.RdpAccountant(list(ALPHAS.astype(float)))
        acc.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / eps), 20)
        ours = event_rdp(ComposedEvent((LaplaceEvent(eps),), 20), ALPHAS)
        assert np.all(ours >= np.asarray(acc._rdp) - 1e-12) and np.all(ours <= 20 * eps + 1e-12)
        assert event_epsilon_rdp(ComposedEvent((LaplaceEvent(eps),), 20), 1e-6, 64)[0] >= \
            acc.get_epsilon(1e-6) - 1e-9


def test_pld_ledger_matches_dp_accounting_composed_by_hand():
    from dp_accounting.pld import common, privacy_loss_distribution as pld_lib

    eps_tree, depth = 0.6, 3
    level, leaf = dpboost.tree_budget(eps_tree, depth)

    def pure(e):
        return pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(e, 0.0),
                                               value_discretization_interval=1e-3)

    tree = pure(level).self_compose(depth).compose(pure(leaf))
    want = tree.self_compose(4).get_epsilon_for_delta(1e-6)
    got = event_pld(dpboost.training_event(eps_tree, depth, 200, 50), 1e-3).get_epsilon_for_delta(1e-6)
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("T,Te,eps", [(50, 0, 1.0), (50, 50, 8.0), (1000, 50, 5.0), (120, 40, 2.0)])
def test_calibration_meets_the_target_and_is_tight(T, Te, eps):
    cal = dpboost.calibrate_dpboost(eps, 1e-6, T, Te, 6)
    ev = dpboost.training_event(cal.eps_tree, 6, T, Te)
    ledger = event_epsilon_rdp(ev, 1e-6, default_alpha_max(eps, 1e-6))[0]
    assert cal.eps_ledger == pytest.approx(ledger, rel=1e-12)
    assert cal.epsilon == min(cal.eps_paper, cal.eps_ledger) <= eps * (1 + 1e-9)
    assert cal.eps_paper == pytest.approx(dpboost.ensembles(T, Te) * cal.eps_tree)
    assert cal.eps_tree_paper == pytest.approx(eps / dpboost.ensembles(T, Te))
    assert cal.eps_tree >= cal.eps_tree_paper  # never less per tree than the paper gives
    if cal.eps_tree > cal.eps_tree_paper:  # the ledger was binding: a slightly larger ε_t breaks the target
        bigger = dpboost.training_event(cal.eps_tree * 1.0001, 6, T, Te)
        assert event_epsilon_rdp(bigger, 1e-6, default_alpha_max(eps, 1e-6))[0] > eps
    if Te and T // Te >= 20:  # many ensembles: the RDP ledger beats the paper's sequential composition
        assert cal.eps_tree > 1.5 * cal.eps_tree_paper and cal.eps_ledger_paper_tree < 0.6 * eps


def test_pure_guarantee_when_the_papers_composition_is_tighter():
    cal = dpboost.calibrate_dpboost(0.5, 1e-12, 1, 0, 1)  # one tree, one level: nothing for RDP to gain
    assert cal.pure and cal.eps_tree == pytest.approx(0.5) and cal.epsilon == pytest.approx(0.5)
    assert "pure, δ = 0" in dpboost.receipt(cal)["guarantee"]


# --------------------------------------------------------------------------- mechanisms


def test_leaf_sensitivity_lemma2_and_glc_by_brute_force():
    """max |V(I ∪ {s}) − V(I)| over gradients in [−g*, g*] is g*/(1+λ) (Lemma 2), and with GLC's clip at θ
    it is min(g*/(1+λ), 2θ) (Cor. 2)."""
    rng = np.random.default_rng(1)
    g = 1.0
    for lam in (0.1, 1.0, 3.0):
        worst = 0.0
        for n in range(0, 12):
            for _ in range(200):
                G = rng.choice([-g, g], size=n) * rng.uniform(0.5, 1, size=n)
                for s in (-g, g):
                    worst = max(worst, abs((G.sum() + s) / (n + 1 + lam) - dpboost.leaf_values(G.sum(), n, lam)))
        assert worst <= g / (1 + lam) + 1e-12 and worst == pytest.approx(g / (1 + lam))  # attained at n = 0
        for t in (1, 5, 30):
            theta = dpboost.glc_threshold(t, g, 0.1)
            assert theta == pytest.approx(0.9 ** (t - 1))
            V = rng.uniform(-3, 3, size=(5000, 2))
            d = np.abs(dpboost.clip_leaves(V[:, 0], theta) - dpboost.clip_leaves(V[:, 1], theta))
            want = dpboost.leaf_sensitivity(t, g, lam, 0.1)
            assert want == pytest.approx(min(g / (1 + lam), 2 * theta))
            close = np.abs(V[:, 0] - V[:, 1]) <= g / (1 + lam)
            assert d[close].max() <= want + 1e-12


def test_fixed_point_sensitivity_and_laplace_scale():
    """floor encoding moves by at most ⌈Δ·2^k⌉ units; the discrete-Laplace scale is that over ε_leaf."""
    rng = np.random.default_rng(2)
    scale, delta = 2.0**20, 1 / 1.1
    a = rng.uniform(-1, 1, 100_000)
    b = a + rng.uniform(-delta, delta, a.size)
    assert np.abs(dpboost.leaf_units(a, scale) - dpboost.leaf_units(b, scale)).max() <= math.ceil(delta * scale)
    assert dpboost.laplace_scale_units(delta, 0.5, scale) == math.ceil(delta * scale) / 0.5


def test_gain_sensitivity_and_selection_scale():
    hp = Hyperparameters.from_dict({"tree_builder": "dpboost", "depth": 4, "epsilon": 2.0})
    b = tree_builder_for(hp, _schema(), calibration_for(hp))
    assert isinstance(b, DPBoostTrees) and hp.grad_clip == 1.0 and hp.l2 == 0.1
    cal = calibration_for(hp)
    # Alg. 1 line 8: P ∝ exp(ε_nleaf·G/(2ΔG)), ΔG = 3·g*_l² (Lemma 1)
    assert b.scale(1.0) == pytest.approx(2 * 3.0 / cal.eps_select) and score_sensitivity(1.0) == 3.0


def test_partition_shares_follow_alg2_line8():
    shares = dpboost.tree_shares(10, 0.3)
    want = 0.3 * 0.7 ** np.arange(10) / (1 - 0.7**10)
    assert np.allclose(shares, want) and shares.sum() == pytest.approx(1.0)
    from fedsbdt.common.randomness import csprng_uint64

    n = 200_000
    parts = dpboost.draw_partition(shares, csprng_uint64(n))
    obs = np.bincount(parts, minlength=10)
    chi2 = float(((obs - n * shares) ** 2 / (n * shares)).sum())
    assert chi2 < stats.chi2.isf(P, 9)
    skewed = dpboost.draw_partition(dpboost.tree_shares(10, 0.33), csprng_uint64(n))  # a 10% different η fails
    obs = np.bincount(skewed, minlength=10)
    assert float(((obs - n * shares) ** 2 / (n * shares)).sum()) > stats.chi2.isf(P, 9)


def _schema():
    from fedsbdt.common.schema import Schema

    return Schema.load(EXAMPLES / "abalone" / "schema.toml")


def _local(ds, hp, rows=None):
    rows = slice(None) if rows is None else rows
    return LocalData(ds.X[rows], ds.y[rows], ds.ids[rows], ds.schema.task, hp, ds.schema.label_range,
                     is_categorical=np.array([f.is_categorical for f in ds.schema.features]),
                     edges=split_edges(ds.schema, hp.split_candidates))


def test_ensembles_partition_the_records_and_gdf_filters(abalone):
    hp = Hyperparameters.from_dict({"tree_builder": "dpboost", "trees": 12, "ensemble_trees": 4, "depth": 2,
                                    "learning_rate": 0.2})
    b = tree_builder_for(hp, abalone.schema, calibration_for(hp))
    local = _local(abalone, hp)
    local.pred = np.zeros(local.n)
    local.pred[::5] = 3.0  # every 5th record's gradient y − 3 < −1: GDF must leave it out
    g = negative_gradient(local.pred, local.y, "regression")
    big = np.abs(g) > 1.0
    assert big.sum() >= local.n // 5 - 1
    masks = [b.records(r, local).copy() for r in range(4)]
    parts = b.partition(0, local).copy()
    for r, m in enumerate(masks):
        assert np.array_equal(m, (parts == r) & ~big)  # its own part, through the filter
    assert np.array_equal(np.sum(masks, axis=0), (~big).astype(int))  # disjoint, and every kept record once
    assert [int(m.sum()) for m in masks] == sorted((int(m.sum()) for m in masks), reverse=True)
    later = b.partition(4, local)  # the next ensemble draws a fresh partition over all records
    assert not np.array_equal(later, parts) and set(np.unique(later)) <= set(range(4))


def test_leaf_release_is_glc_clipped_mean_gradient_without_noise(abalone):
    hp = Hyperparameters.from_dict({"tree_builder": "dpboost", "trees": 8, "ensemble_trees": 8, "depth": 3,
                                    "learning_rate": 0.3})
    b = tree_builder_for(hp, abalone.schema, calibration_for(hp))
    local = _local(abalone, hp)
    local.pred = np.full(local.n, -0.6)  # gradients y + 0.6 up to 1.6: GDF matters
    splits = random_splits(abalone.schema, hp.depth, 3, 0, False, 32)
    for r in (0, 5):
        leaf, values = b.release_leaves(r, local, splits, insecure(noise=False))
        use = b.records(r, local)
        g = local.y + 0.6
        assert np.all(np.abs(g[use]) <= 1.0) and np.any(np.abs(g) > 1.0)
        theta = 0.7**r  # position r + 1
        G = np.bincount(leaf[use], weights=g[use], minlength=8)
        n = np.bincount(leaf[use], minlength=8)
        want = np.floor(np.clip(G / (n + 0.1), -theta, theta) * 2.0**20) / 2.0**20
        assert np.array_equal(values, want)
        assert np.abs(values).max() <= theta
        if r == 5:
            assert np.any(np.abs(G / (n + 0.1)) > theta)  # GLC was binding on some leaf


def test_laplace_leaf_noise_has_the_calibrated_scale(abalone):
    """The released leaf values minus their noiseless grid values are Lap_Z(⌈ΔV_t·2^k⌉/ε_leaf) (χ², p = 1e-6);
    a 5% wider distribution fails the same test."""
    hp = Hyperparameters.from_dict({"tree_builder": "dpboost", "trees": 10, "depth": 12, "epsilon": 36.0,
                                    "scale_bits": 12, "leaf_clip": 1e9, "learning_rate": 0.1})
    cal = calibration_for(hp)
    b = tree_builder_for(hp, abalone.schema, cal)
    local = _local(abalone, hp, slice(0, 400))
    splits = random_splits(abalone.schema, hp.depth, 5, 0, False, 32)
    r, t = 3, 4
    _, clean = b.release_leaves(r, local, splits, insecure(noise=False))
    from fedsbdt.common.randomness import SecureRandomness

    rnd = SecureRandomness()
    noise = np.concatenate([np.rint((b.release_leaves(r, local, splits, rnd)[1] - clean) * 2**12)
                            for _ in range(50)]).astype(np.int64)
    want = math.ceil(min(1 / 1.1, 2 * 0.9 ** (t - 1)) * 2**12) / (0.5 * cal.eps_tree)
    assert want == pytest.approx(dpboost.laplace_scale_units(dpboost.leaf_sensitivity(t, 1.0, 0.1, 0.1),
                                                              cal.eps_leaf, 2**12))
    assert 100 < want < 400  # a scale at which a 5% wider distribution is detectable
    cdf = laplace_cdf(want)
    edges, p = bins_for(cdf, want, noise.size)
    assert fits(noise, edges, p)
    obs = counts(noise, edges)
    assert obs[0] > 0 and obs[-1] > 0
    assert not fits(np.rint(noise * 1.05).astype(np.int64), edges, p)


# --------------------------------------------------------------------------- end to end


def test_configuration_defaults_and_refusals():
    hp = Hyperparameters.from_dict({"tree_builder": "dpboost"})
    assert (hp.subsample, hp.grad_clip, hp.l2, hp.selection_share, hp.init_share, hp.cyclical) == \
        (1.0, 1.0, 0.1, 0.5, 0.0, False)
    assert Hyperparameters.from_dict({"tree_builder": "dpboost", "l2": 1.0}).l2 == 1.0
    with pytest.raises(ConfigError, match="ensemble_trees"):
        Hyperparameters(ensemble_trees=5)
    with pytest.raises(ConfigError, match="exponential"):
        Hyperparameters.from_dict({"tree_builder": "dpboost", "selection": "histogram"})
    with pytest.raises(ConfigError, match="filter"):
        Hyperparameters.from_dict({"tree_builder": "dpboost", "filter": True})
    with pytest.raises(ConfigError, match="ensemble_trees"):
        Hyperparameters.from_dict({"tree_builder": "dpboost", "ensemble_trees": -1})


def test_cli_dpboost_train_evaluate_account_report_export(tmp_path, capsys):
    schema, data = EXAMPLES / "abalone" / "schema.toml", EXAMPLES / "abalone" / "abalone.data"
    out = tmp_path / "m.json"
    assert main(["train", "--schema", str(schema), "--data", str(data), "--tree-builder", "dpboost", "--trees", "6",
                 "--ensemble-trees", "3", "--depth", "3", "--epsilon", "4", "--out", str(out), "--json",
                 "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["epsilon"] <= 4.0 and res["trees"] == 6
    model = Ensemble.load(out)
    p = model.privacy
    assert p["tree_builder"] == "dpboost" and p["dpboost"]["ensembles"] == 2
    assert p["dpboost"]["epsilon_paper"] == pytest.approx(2 * p["dpboost"]["eps_tree"])
    assert p["epsilon"] == min(p["dpboost"]["epsilon_paper"], p["dpboost"]["epsilon_ledger"])
    assert main(["account", "--tree-builder", "dpboost", "--trees", "6", "--ensemble-trees", "3", "--depth", "3",
                 "--epsilon", "4", "--json"]) == 0
    acc = json.loads(capsys.readouterr().out)
    assert acc["dpboost"] == p["dpboost"] and acc["epsilon"] == p["epsilon"]
    assert main(["account", "--tree-builder", "dpboost", "--trees", "6", "--ensemble-trees", "3"]) == 0
    human = capsys.readouterr().out
    assert "paper claims" in human and "our ledger" in human
    assert main(["evaluate", "--model", str(out), "--data", str(data)]) == 0
    assert "rmse" in capsys.readouterr().out
    assert main(["report", "--model", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert "DPBoost ε: paper / ours" in (tmp_path / "r.html").read_text()
    assert main(["export", "--model", str(out), "--format", "xgboost", "--out", str(tmp_path / "x.json")]) == 0
    capsys.readouterr()
    import xgboost as xgb

    from fedsbdt.common.data import load
    from fedsbdt.common.schema import Schema

    ds = load(data, Schema.load(schema))
    booster = xgb.Booster(model_file=str(tmp_path / "x.json"))
    X32 = ds.X.astype(np.float32).astype(np.float64)  # XGBoost compares float32 inputs (docs/xgboost-export.md)
    assert np.abs(booster.predict(xgb.DMatrix(X32)) - model.predict(X32)).max() <= 1e-4
    for bad in (["--filter"], ["--subsample", "0.3"], ["--selection", "histogram"]):
        assert main(["train", "--schema", str(schema), "--data", str(data), "--tree-builder", "dpboost",
                     "--out", str(tmp_path / "x2.json"), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert not (tmp_path / "x2.json").exists()


def test_adult_dpboost_learns_and_estimator_takes_the_mode(adult):
    from fedsbdt.common.estimators import SBDTClassifier
    from fedsbdt.common.metrics import auc

    rows = np.arange(0, adult.n, 4)
    X, y = adult.X[rows], adult.y[rows]
    aucs = []
    for _ in range(3):  # one fit is below 0.7 about once in 100 (noise); the mean of three practically never
        clf = SBDTClassifier(tree_builder="dpboost", trees=8, depth=3, epsilon=8.0, learning_rate=0.3,
                             schema=str(EXAMPLES / "adult" / "schema.toml"))
        clf.fit(X, y)
        assert clf.model_.hyperparameters.l2 == 0.1 and clf.privacy_["tree_builder"] == "dpboost"
        aucs.append(auc(y, clf.predict_proba(X)[:, 1]))
    assert np.mean(aucs) > 0.7, aucs  # at ε = 8 the greedy splits find signal


def test_federated_plan_accepts_dpboost_with_the_gaussian_ledger(adult):
    """A federated DPBoost plan is accounted with Gaussian levels and leaves (docs/dpboost.md "Federation";
    tests/federation/test_dpboost_federation.py runs it); the PLD accountant is refused."""
    from fedsbdt.common.federation.plan import PlanError, SiteEntry, make_plan

    sites = [SiteEntry(f"s{i}", bytes([i]) * 32) for i in range(3)]
    plan = make_plan(adult.schema, Hyperparameters.from_dict({"tree_builder": "dpboost"}), sites)
    cal = plan.calibration()
    assert cal.sigma > 0 and cal.sigma_select > 0 and cal.eps_select == 0 and plan.greedy_grid is not None
    with pytest.raises(PlanError, match="RDP ledger"):
        make_plan(adult.schema, Hyperparameters.from_dict({"tree_builder": "dpboost", "accountant": "pld"}), sites)


def test_noiseless_training_fits_abalone(abalone):
    """Insecure noiseless randomness: the splits are the argmax and the leaves the GLC-clipped means, so the
    model fits Abalone far better than the mean (a check that the pieces fit together)."""
    hp = Hyperparameters.from_dict({"tree_builder": "dpboost", "trees": 20, "depth": 3, "learning_rate": 0.3})
    m = train(abalone, hp, insecure(noise=False)).model
    pred = m.predict(abalone.X)
    rmse = float(np.sqrt(np.mean((pred - abalone.y) ** 2)))
    assert rmse < 0.85 * float(np.std(abalone.y))
