"""Small fixed-point scales break distributed noise (issue 10, item 6).

The counterexample: scale_bits = 8, g* = h* = 0.01, ε = 8, γ = 1, T = 1 and
100 sites.  Each leaf-noise share is then a discrete Gaussian with std ≈ 0.3
integer units, which is almost always 0: the exact variance of the sum of
the shares is a fraction of the variance the accountant assumed.  The planner
and every site (both parse plans through ``Plan``) must refuse such a plan;
the bound (Kairouz–Liu–Steinke's τ term, docs/privacy.md) is checked here
against an exact numerical computation of the Rényi divergence of a sum of
discrete Gaussians.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.schema import Schema
from fedsbdt.common.federation.plan import MAX_SHARE_EXCESS, Plan, PlanError, SiteEntry, make_plan

from .conftest import EXAMPLES

SCHEMA = Schema.load(EXAMPLES / "abalone" / "schema.toml")
SITES = [SiteEntry(f"site-{i:03d}", Ed25519PrivateKey.generate().public_key().public_bytes_raw()) for i in range(100)]
COUNTEREXAMPLE = Hyperparameters(trees=1, subsample=1.0, epsilon=8.0, grad_clip=0.01, hess_clip=0.01, scale_bits=8,
                                 depth=2, seed=3)
SESSION = dict(threshold=51, assumed_colluders=0, epoch_rounds=4, max_records_per_site=1000)


def discrete_gaussian_pmf(s2: float, half_width: int) -> np.ndarray:
    """Exact (to double precision) pmf of N_Z(0, s2) on −half_width … half_width."""
    k = np.arange(-half_width, half_width + 1, dtype=np.float64)
    w = np.exp(-k * k / (2.0 * s2))
    return w / w.sum()


def test_the_counterexample_lacks_most_of_its_noise_and_is_refused():
    scale = 2.0 ** COUNTEREXAMPLE.scale_bits
    # the plan as it would be with a fine scale: same σ, same shares, same accounting
    fine = make_plan(SCHEMA, COUNTEREXAMPLE.replace(scale_bits=20), SITES, **SESSION)
    sigma = fine.calibration().sigma
    assert fine.noise_divisor(100) == 100
    # at scale 2^8 the gradient sums' full noise has std g*·2^8·σ/√(2·r2) — and each of 100 shares a tenth of it
    delta_g = round(0.01 * scale)
    full = delta_g * sigma / math.sqrt(2 * (1 - COUNTEREXAMPLE.r1))
    share2 = full ** 2 / 100
    assert 0.25 < math.sqrt(share2) < 0.4
    pmf = discrete_gaussian_pmf(share2, 20)
    k = np.arange(-20, 21)
    exact_sum_variance = 100 * float(np.sum(pmf * k * k))
    assert exact_sum_variance < 0.2 * full ** 2  # the attack: most of the accounted noise is missing
    with pytest.raises(PlanError, match="too coarse"):
        make_plan(SCHEMA, COUNTEREXAMPLE, SITES, **SESSION)
    # a site parses the served plan with the same class: it refuses the canonical form of the same plan
    d = json.loads(fine.canonical_json)
    d["hyperparameters"]["scale_bits"] = 8  # σ and ε do not depend on the scale: the statement still checks out
    with pytest.raises(PlanError, match="too coarse"):
        Plan.from_dict(d)


def test_a_fine_enough_scale_is_accepted_and_its_excess_is_negligible():
    for bits in (12, 20):
        p = make_plan(SCHEMA, COUNTEREXAMPLE.replace(scale_bits=bits), SITES, **SESSION)
        smallest, eta = p.share_closeness()
        assert smallest >= 0.5 and eta <= MAX_SHARE_EXCESS
    central = make_plan(SCHEMA, COUNTEREXAMPLE, SITES, noise="central", **SESSION)
    assert central.share_closeness() == (math.inf, 0.0)  # one discrete Gaussian at the coordinator: exact


def hockey_stick_discrete(S: float, delta: int, eps: float) -> float:
    """H_{e^ε}(N_Z(Δ, S²) ‖ N_Z(0, S²)) summed exactly over the support."""
    K = int(40 * S) + 4 * delta
    k = np.arange(-K, K + 1, dtype=np.float64)
    lq = -k * k / (2 * S * S)
    lp = -(k - delta) ** 2 / (2 * S * S)
    lz = np.logaddexp.reduce(lq)
    return float(np.sum(np.clip(np.exp(lp - lz) - np.exp(eps + lq - lz), 0.0, None)))


def test_pld_is_refused_in_plans_because_the_continuous_gaussian_does_not_dominate():
    """The PLD accountant evaluates the continuous Gaussian.  At equal scale it does not dominate the
    discrete Gaussian: at ε = 0 (total variation) the discrete mechanism is worse by ≈ TV/(24 S²)
    (midpoint rule on a concave density).  So no plan may use it, in either noise mode."""
    from scipy.stats import norm

    S, delta = 100.0, 37
    mu = delta / S
    continuous_tv = 2 * norm.cdf(mu / 2) - 1
    assert hockey_stick_discrete(S, delta, 0.0) > continuous_tv + 1e-7
    hp = Hyperparameters(trees=3, seed=1, accountant="pld")
    for noise in ("distributed", "central"):
        with pytest.raises(PlanError, match="PLD"):
            make_plan(SCHEMA, hp, SITES[:3], noise=noise)


@pytest.mark.parametrize("v,m,delta", [(0.6, 3, 1), (1.0, 4, 3), (1.5, 2, 2), (0.8, 6, 1), (0.3, 10, 1)])
def test_the_tau_bound_holds_against_the_exact_renyi_divergence_of_a_sum_of_shares(v, m, delta):
    """Kairouz–Liu–Steinke (one coordinate): D_α(Z + Δ ‖ Z) ≤ α/2·(Δ/√(m·v) + τ)² for Z a sum of m
    N_Z(0, v), τ = 10·Σ_{k<m} exp(−2π²v·k/(k+1)) — the bound Plan.share_closeness uses.  Oracle: the
    exact pmf of Z by convolution and the divergence summed directly.  Also shows why the bound is
    needed: at small v (≤ 0.6) the divergence exceeds the continuous Gaussian's αΔ²/(2mv)."""
    half = int(12 * math.sqrt(v)) + 12
    share = discrete_gaussian_pmf(v, half)
    z = share
    for _ in range(m - 1):
        z = np.convolve(z, share)
    z = z / z.sum()
    p, q = z[delta:], z[:-delta]  # P(Z + Δ = x) against P(Z = x) on the common support
    tau = 10.0 * sum(math.exp(-2 * math.pi ** 2 * v * k / (k + 1)) for k in range(1, m))
    l = delta / math.sqrt(m * v)
    exceeded = False
    for alpha in range(2, 12):
        mask = (p > 1e-280) & (q > 1e-280)
        terms = alpha * np.log(p[mask]) + (1 - alpha) * np.log(q[mask])
        top = terms.max()
        d_alpha = (top + math.log(np.sum(np.exp(terms - top)))) / (alpha - 1)
        assert d_alpha <= alpha / 2 * (l + tau) ** 2 + 1e-9
        exceeded |= d_alpha > alpha * l * l / 2 + 1e-9
    if v <= 0.6:
        assert exceeded
