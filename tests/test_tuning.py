"""Private tuning (common/tuning.py): Papernot & Steinke Thm. 2 against independent oracles, the exact trial
sampler, the held-out split, and ``fedsbdt tune`` end to end (docs/auto.md)."""
from __future__ import annotations

import json
import math
import secrets

import mpmath as mp
import numpy as np
import pytest

from fedsbdt.common.tuning import (candidates, holdout_mask, record_scores, sample_trials, tnb_mean, trial_rdp,
                                   tuning_epsilon, tuning_rdp)

ORDERS = np.arange(2, 200)


def gaussian_curve(mu: float) -> np.ndarray:
    return ORDERS * mu**2 / 2


def oracle_theorem2(orders, rdp, gamma, eta):
    """P&S Thm. 2 evaluated with mpmath at every order: E[K] by summing k·P[K = k] of the TNB pmf itself (not
    its closed form), the minimum over λ̂ by a scan; then RDP's monotonicity in the order."""
    mp.mp.dps = 40
    g, e = mp.mpf(gamma), mp.mpf(eta)
    norm = g ** (-e) - 1
    mean, prod, k, total = mp.mpf(0), mp.mpf(1), 0, mp.mpf(0)
    while True:  # P[K=k] = (1−γ)^k/(γ^−η − 1) · Π_{l<k} (l+η)/(l+1)
        prod = prod * (k + e) / (k + 1)
        k += 1
        term = (1 - g) ** k / norm * prod
        total += term
        mean += k * term
        if term < mp.mpf(10) ** -35 and k > 10:
            break
    assert abs(total - 1) < 1e-25  # the pmf sums to one
    c = min((1 + e) * ((1 - mp.mpf(1) / int(lh)) * mp.mpf(float(r)) + mp.log(1 / g) / int(lh))
            for lh, r in zip(orders, rdp))
    bound = [mp.mpf(float(r)) + c + mp.log(mean) / (int(lam) - 1) for lam, r in zip(orders, rdp)]
    return np.array([float(min(bound[i:])) for i in range(len(bound))])


@pytest.mark.parametrize("mu,gamma,eta", [(0.3, 0.25, 1.0), (1.0, 0.1, 1.0), (0.05, 0.5, 1.0), (0.5, 0.2, 0.5)])
def test_theorem2_matches_an_mpmath_evaluation_with_the_mean_summed_from_the_pmf(mu, gamma, eta):
    rdp = gaussian_curve(mu)
    np.testing.assert_allclose(tuning_rdp(ORDERS, rdp, gamma, eta), oracle_theorem2(ORDERS, rdp, gamma, eta),
                               rtol=1e-9)


def test_theorem2_matches_dp_accounting_repeat_and_select():
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_repeat_and_select

    for mu, mean in ((0.3, 4), (2.0, 10), (0.01, 2)):
        rdp = gaussian_curve(mu)
        theirs = _compute_rdp_repeat_and_select(ORDERS, rdp, mean, 1.0)
        np.testing.assert_allclose(tuning_rdp(ORDERS, rdp, 1 / mean), theirs, rtol=1e-9)


def test_the_bound_holds_for_an_exact_repeat_and_select_computation():
    """Brute force over the trial distribution: Q outputs a score in {0..m}; the best of K ~ geometric trials has
    CDF f(F(t)) with f the PGF; its exact Rényi divergence must not exceed Thm. 2's bound at any order."""
    mp.mp.dps = 50
    m, gamma = 12, mp.mpf(1) / 4
    t = np.arange(m + 1)
    P = np.exp(-0.5 * ((t - 5.0) / 2.0) ** 2)
    Q = np.exp(-0.5 * ((t - 5.6) / 2.0) ** 2)
    P, Q = [mp.matrix([mp.mpf(float(x)) for x in v / v.sum()]) for v in (P, Q)]

    def rdp_exact(A, B, lam):
        return float(mp.log(sum(A[i] ** lam * B[i] ** (1 - lam) for i in range(len(A)))) / (lam - 1))

    def best_of_k(D):  # output distribution of the max over K iid draws: CDF f(F(t)), f(x) = γx/(1 − (1−γ)x)
        F, cdf = mp.mpf(0), []
        for i in range(len(D)):
            F += D[i]
            cdf.append(gamma * F / (1 - (1 - gamma) * F))
        return [cdf[0]] + [cdf[i] - cdf[i - 1] for i in range(1, len(cdf))]

    orders = np.arange(2, 40)
    for A, B in ((P, Q), (Q, P)):
        base = np.array([rdp_exact(A, B, int(l)) for l in orders])
        bound = tuning_rdp(orders, base, float(gamma))
        SA, SB = best_of_k(A), best_of_k(B)
        for i, lam in enumerate(orders):
            assert rdp_exact(SA, SB, int(lam)) <= bound[i] + 1e-12


def test_tnb_mean_closed_form_and_trial_sampler_is_geometric():
    assert tnb_mean(0.25, 1.0) == pytest.approx(4.0)
    assert tnb_mean(0.2, 0.0) == pytest.approx((5 - 1) / math.log(5))
    from scipy.stats import chisquare

    draws = np.array([sample_trials(4) for _ in range(20_000)])
    ks = np.arange(1, 13)
    obs = [int(np.sum(draws == k)) for k in ks] + [int(np.sum(draws > 12))]
    pmf = [0.25 * 0.75 ** (k - 1) for k in ks] + [0.75**12]
    assert chisquare(obs, np.array(pmf) * len(draws)).pvalue > 1e-4
    draws_ = iter([2, 1, 0])
    assert sample_trials(3, randbelow=lambda n: next(draws_)) == 3  # stops at the first draw of 0


def test_trial_rdp_is_the_pointwise_max_and_total_grows_with_the_trial_budget():
    a, b = gaussian_curve(0.2), gaussian_curve(0.4)
    np.testing.assert_array_equal(trial_rdp(ORDERS, [a, b], 1e9), b)
    e1, _ = tuning_epsilon(ORDERS, a, 0.25, 1e-6)
    e2, _ = tuning_epsilon(ORDERS, b, 0.25, 1e-6)
    assert 0 < e1 < e2


def test_holdout_depends_only_on_each_record_id():
    ids = np.arange(10_000, dtype=np.int64)
    m = holdout_mask(ids, 7)
    assert 0.18 < m.mean() < 0.22
    np.testing.assert_array_equal(holdout_mask(ids[::3], 7), m[::3])  # other records do not move a record
    assert not np.array_equal(holdout_mask(ids, 8), m)


def test_scores_lie_in_the_unit_interval():
    y = np.array([0.0, 1.0, 1.0])
    s = record_scores("binary", y, np.array([0.0, 0.0, 0.5]))
    np.testing.assert_allclose(s, [1.0, 0.0, 0.75])
    s = record_scores("multiclass", np.array([0, 2]), np.array([[1, 0, 0], [1, 0, 0.0]]))
    np.testing.assert_allclose(s, [1.0, 0.0])
    s = record_scores("regression", np.array([0.0, 0.0]), np.array([5.0, 100.0]), (0.0, 10.0))
    np.testing.assert_allclose(s, [0.75, 0.0])


def test_candidates_centre_first_and_distinct():
    c = candidates(dict(trees=100, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False))
    assert c[0]["trees"] == 100 and len(c) == len({json.dumps(x, sort_keys=True) for x in c}) >= 8


def test_tune_cli_receipt_covers_all_trials_and_refuses_a_tiny_budget(tmp_path, capsys):
    from pathlib import Path

    from fedsbdt.common.cli import main

    ex = Path(__file__).resolve().parents[1] / "examples" / "abalone"
    out = tmp_path / "m.json"
    argv = ["tune", "--data", str(ex / "abalone.data"), "--schema", str(ex / "schema.toml"), "--out", str(out),
            "--rows", "4177", "--quiet"]
    assert main([*argv, "--epsilon", "1e-5"]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too small for private tuning" in err
    assert main([*argv, "--epsilon", "2", "--trials-mean", "2", "--seed", str(secrets.randbits(30)), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)  # exactly one JSON object
    model = json.loads(out.read_text())
    assert res["epsilon"] == model["privacy"]["epsilon"] and res["trials"] == model["training"]["tuning"]["trials_run"]
    t = model["training"]["tuning"]
    assert model["privacy"]["epsilon"] <= 2 and t["epsilon_tuning"] <= 2
    assert t["epsilon_trial"] < t["epsilon_tuning"]  # one trial is cheaper than the whole tuning
    assert len(t["trials"]) == t["trials_run"] >= 1 and 1 <= t["winner"] <= t["trials_run"]
    assert all(tr["settings"] in t["candidates"] for tr in t["trials"])
    hp = model["hyperparameters"]
    assert {k: hp[k] for k in t["winner_settings"]} == t["winner_settings"]


def test_quiet_tune_prints_the_result_in_one_line(tmp_path, capsys):
    """``--quiet`` (issue 36): one line for the result, not every trial's settings."""
    from pathlib import Path

    from fedsbdt.common.cli import main

    ex = Path(__file__).resolve().parents[1] / "examples" / "abalone"
    out = tmp_path / "m.json"
    assert main(["tune", "--data", str(ex / "abalone.data"), "--schema", str(ex / "schema.toml"), "--out", str(out),
                 "--rows", "4177", "--quiet", "--epsilon", "2", "--trials-mean", "2"]) == 0
    printed = capsys.readouterr()
    (line,) = printed.out.splitlines()
    assert line.startswith("tuned over ") and line.endswith(f"-DP; model written to {out}") and printed.err == ""
