"""The accountant against independent oracles (dp-accounting, closed forms of the paper)."""
import math

import numpy as np
import pytest
from dp_accounting import PoissonSampledDpEvent, GaussianDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedsbdt.common import accountant as A

GRID_GAMMA = [0.005, 0.05, 0.1, 0.3, 0.9]
GRID_SIGMA = [0.8, 2.0, 10.0, 60.0]
GRID_ALPHA = [2, 3, 7, 32, 128, 512, 2000]
GRID_T = [1, 10, 150, 1000]


def oracle_rdp(gamma, sigma, alphas, rounds):
    """dp-accounting's RDP accountant for T Poisson-subsampled Gaussians with noise multiplier σ/√2."""
    acc = rdp_lib.RdpAccountant(orders=[float(a) for a in alphas])
    acc.compose(SelfComposedDpEvent(PoissonSampledDpEvent(gamma, GaussianDpEvent(sigma / math.sqrt(2))), rounds))
    return np.asarray(acc._rdp)


@pytest.mark.parametrize("gamma", GRID_GAMMA)
@pytest.mark.parametrize("sigma", GRID_SIGMA)
def test_subsampled_rdp_matches_dp_accounting(gamma, sigma):
    for rounds in GRID_T:
        ref = oracle_rdp(gamma, sigma, GRID_ALPHA, rounds)
        mine = rounds * A.tree_rdp(gamma, sigma, np.array(GRID_ALPHA))
        single = np.array([rounds * A.subsampled_rdp(a, gamma, 1 / sigma**2) for a in GRID_ALPHA])
        finite = np.isfinite(ref)
        assert finite.any()
        np.testing.assert_allclose(mine[finite], ref[finite], rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(single[finite], ref[finite], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("sigma", GRID_SIGMA)
def test_no_subsampling_is_alpha_over_sigma_squared_exactly(sigma):
    for a in GRID_ALPHA:
        t = 1 / sigma**2
        assert A.subsampled_rdp(a, 1.0, t) == a * t
        assert A.tree_rdp(1.0, sigma, np.array([a]))[0] == a / sigma**2


def test_rdp_to_dp_is_corollary_6():
    """Two independent oracles: dp-accounting's RDP→(ε, δ) conversion (CKS20 Prop. 12, the same bound as
    Cor. 6, written independently), and the exact privacy curve of the Gaussian mechanism, whose RDP is
    exactly α·μ²/2: the converted ε must be valid (exact δ(ε) ≤ δ) and at most a little loose."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
    from scipy.stats import norm

    for a in (1.5, 2, 3, 10, 64, 512, 4096):
        for rho in (0.01, 0.3, 2.0, 15.0):
            for d in (1e-3, 1e-6, 5e-8, 1e-12):
                ref, _ = compute_epsilon([a], [rho], d)
                mine = A.rdp_to_dp(a, rho, d)
                if ref > 0:  # dp-accounting clamps at 0 and has a KL shortcut for tiny ρ
                    assert mine == pytest.approx(ref, rel=1e-12, abs=1e-12), (a, rho, d)
    vec = A.rdp_to_dp(np.array([2, 10, 100]), np.array([0.1, 0.5, 3.0]), 1e-6)
    assert vec == pytest.approx([compute_epsilon([a], [r], 1e-6)[0] for a, r in ((2, .1), (10, .5), (100, 3.))])
    for mu in (0.1, 0.5, 1.0, 2.0):  # Gaussian mechanism with sensitivity/σ = μ
        for d in (1e-5, 1e-8):
            alphas = A.alpha_grid(4096)
            eps = float(np.min(A.rdp_to_dp(alphas, alphas * mu * mu / 2, d)))
            exact_delta = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
            assert exact_delta <= d  # valid
            assert exact_delta >= d / 100  # and not wildly loose (a dropped term would move it by orders)


def test_pure_dp_rdp_bounds_discrete_laplace_numerically():
    """ρ_RR(α) must upper-bound the exact Rényi divergence of the discrete Laplace we sample."""
    for eps in (0.005, 0.1, 1.0):
        for delta_units in (1, 5):
            b = delta_units / eps  # scale for sensitivity Δ (pure eps-DP)
            x = np.arange(-int(60 * b) - 10 * delta_units, int(60 * b) + 10 * delta_units + 1)
            logp = -np.abs(x) / b
            logq = -np.abs(x - delta_units) / b
            logz = np.logaddexp.reduce(logp)  # same normaliser for both
            for alpha in (2, 5, 50, 500, 5000):
                exact = (np.logaddexp.reduce(alpha * logp + (1 - alpha) * logq) - logz) / (alpha - 1)
                bound = A.pure_dp_rdp(alpha, eps)
                assert exact <= bound + 1e-12, (eps, delta_units, alpha, exact, bound)
                assert bound <= eps + 1e-12
    # and the bound is tight: randomized response attains it
    eps, alpha = 0.3, 7
    p = math.exp(eps) / (1 + math.exp(eps))
    rr = math.log(p**alpha * (1 - p) ** (1 - alpha) + (1 - p) ** alpha * p ** (1 - alpha)) / (alpha - 1)
    assert A.pure_dp_rdp(alpha, eps) == pytest.approx(rr, rel=1e-12)


def test_pure_dp_rdp_over_the_whole_range_without_overflow():
    """Huge ε (a plan may state anything) or α must neither overflow nor warn; checked against 60-digit
    arithmetic of the randomized-response formula, and the bound never exceeds ε."""
    import warnings

    import mpmath

    mpmath.mp.dps = 60

    def oracle(alpha, eps):
        a, e = mpmath.mpf(int(alpha)), mpmath.mpf(float(eps))
        return float(mpmath.log((mpmath.exp(a * e) + mpmath.exp(-(a - 1) * e)) / (1 + mpmath.exp(e))) / (a - 1))

    alphas = np.array([2, 7, 64, 512, 200_000])
    for eps in (1e-6, 0.005, 0.3, 5.0, 80.0, 700.0, 744.0, 746.0, 1e4, 1e300):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            vec = A.pure_dp_rdp(alphas, eps)
            one = [A.pure_dp_rdp(int(a), eps) for a in alphas]
        assert np.all(np.isfinite(vec)) and np.all(vec <= eps * (1 + 1e-15)) and np.all(vec >= 0), (eps, vec)
        for a, v, w in zip(alphas, vec, one):
            assert v == w
            assert v == pytest.approx(oracle(a, eps), rel=1e-12, abs=1e-300), (eps, a)
    assert A.pure_dp_rdp(5, float("inf")) == float("inf")  # no bound at all, and no warning either


@pytest.mark.parametrize("eps", [700.5, 1e4, 1e308, float("inf"), float("nan")])
def test_absurd_budgets_are_refused_by_name(eps):
    with pytest.raises(A.AccountingError, match="too large for the accountant"):
        A.calibrate(eps, 5e-8, 0.1, 100, 0.1, 0.005)


@pytest.mark.parametrize("eps,gamma,rounds,share", [(0.105, 0.1, 150, 0.1), (0.02, 0.005, 200, 0.0),
                                                     (1.0, 0.2, 500, 0.1), (5.0, 1.0, 20, 0.0)])
def test_calibration_meets_target_and_is_minimal(eps, gamma, rounds, share):
    cal = A.calibrate(eps, 5e-8, gamma, rounds, share, 0.005)
    assert cal.epsilon <= eps
    # ε is recomputed independently from the reported α̂ and σ
    rho_total = rounds * A.subsampled_rdp(cal.alpha, gamma, 1 / cal.sigma**2) + A.init_score_rdp(
        cal.alpha, cal.eps_init, cal.eps_ds)
    assert A.rdp_to_dp(cal.alpha, rho_total, 5e-8) == pytest.approx(cal.epsilon, rel=1e-9)
    assert cal.rho == pytest.approx(rounds * A.subsampled_rdp(cal.alpha, gamma, 1 / cal.sigma**2), rel=1e-12)
    # slightly less noise must break the target on every order of the grid
    eps_less, _ = A.epsilon_rdp(cal.sigma * (1 - 1e-5), gamma, rounds, 5e-8, cal.eps_init, cal.eps_ds,
                                A.default_alpha_max(eps, 5e-8))
    assert eps_less > eps


def test_paper_numbers_abalone():
    """Paper §5.1 / reference run: trees-only ε = 0.09 (0.1 minus the 10% init share), T=150, γ=0.1
    gives σ ≈ 88.06, α̂ = 241, ρ(α̂) ≈ 0.047 with the tight bound."""
    cal = A.calibrate(0.09, 5e-8, 0.1, 150, 0.0, 0.005)
    assert cal.sigma == pytest.approx(88.06, rel=2e-3)
    assert abs(cal.alpha - 241) <= 3
    assert cal.rho == pytest.approx(0.0469, abs=5e-4)


def test_pld_is_tighter_and_agrees_with_dp_accounting_accountant():
    from dp_accounting.pld import pld_privacy_accountant

    cal_r = A.calibrate(0.105, 5e-8, 0.1, 150, 0.1, 0.005, "rdp")
    cal_p = A.calibrate(0.105, 5e-8, 0.1, 150, 0.1, 0.005, "pld")
    assert cal_p.sigma < cal_r.sigma
    assert cal_p.epsilon <= 0.105
    # an independent path: dp-accounting's event-based PLD accountant, trees only
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(SelfComposedDpEvent(PoissonSampledDpEvent(0.1, GaussianDpEvent(cal_p.sigma / math.sqrt(2))), 150))
    trees_only = A.epsilon_pld(cal_p.sigma, 0.1, 150, 5e-8)
    assert acc.get_epsilon(5e-8) == pytest.approx(trees_only, rel=2e-3)


def test_invalid_parameters_are_refused():
    with pytest.raises(A.AccountingError):
        A.calibrate(-1.0, 1e-6, 0.1, 10)
    with pytest.raises(A.AccountingError):
        A.calibrate(1.0, 0.0, 0.1, 10)
    with pytest.raises(A.AccountingError):
        A.subsampled_rdp(1, 0.1, 1.0)
    with pytest.raises(A.AccountingError):
        A.calibrate(1e-9, 1e-12, 1.0, 100000)


def test_subsampled_rdp_is_monotone_in_gamma():
    """Sampling with probability ⌊γ·2^64⌋/2^64 ≤ γ is covered by the bound for γ (monotonicity)."""
    for sigma in (0.8, 5.0, 50.0):
        for a in (2, 9, 100, 1500):
            vals = [A.subsampled_rdp(a, g, 1 / sigma**2) for g in np.linspace(0.001, 1.0, 60)]
            assert all(y >= x * (1 - 1e-12) for x, y in zip(vals, vals[1:]))
