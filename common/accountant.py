"""Privacy accountant for S-BDT (paper Alg. 6, Cor. 6, Cor. 20, Thm. 14, Thm. 23).

Pure functions only.  Notation follows ``../shared/papers/s-bdt.md``:

* ``sigma`` — the *unweighted* leaf noise parameter σ_leaf of Alg. 5.  One tree
  is ``(α, a_γ(α, α/σ²))``-RDP (Cor. 20); for the worst-case record this is
  exactly the RDP of a Poisson-subsampled Gaussian with noise multiplier
  ``σ/√2`` (Thm. 16 with D = 2: the privacy-loss distribution is N(μ, 2μ) with
  μ = 1/σ²).
* ``a_γ(α, ·)`` — the tight Zhu–Wang bound (Thm. 14), valid because the base
  RDP is linear in α (Lemma 15).  Evaluated in log space over integer α.
* Initial score (Alg. 3 / Thm. 18): the record count and the clipped label
  sum are released with *discrete* Laplace noise of scale Δ/ε_ds and
  Δ/ε_init (pure ε-DP each).  We charge them with the RDP of randomized
  response, ``1/(α−1)·log((e^{αε} + e^{−(α−1)ε})/(1+e^ε))``, which bounds the
  RDP of *every* ε-DP mechanism (the privacy-loss ratio lies in [e^−ε, e^ε]
  with mean 1; E[L^α] is convex, so it is maximised by the two-point
  distribution, i.e. randomized response).  It is within 1e−3 relative of the
  paper's Thm. 18 expression for the continuous Laplace and, unlike it, is
  proven for the discrete sampler we use.
* Total (Thm. 23): ``ρ(α) = T·a_γ(α, α/σ²) + ρ_ε_init(α) + ρ_ε_ds(α)``,
  converted to (ε, δ) by Cor. 6 and minimised over the α grid.
* DP quantile split candidates (common/candidates.py, Eq. C2), when a run spends ε_c on them: one more pure
  ε_c-DP release (discrete Laplace histograms), charged like the initial score, ``+ ρ_ε_c(α)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

DEFAULT_ALPHA_MAX = 512
_EXP_UNDERFLOW = 745.0  # math.exp(-x) == 0.0 for x above this
MAX_EPSILON = 700.0  # e^700 ≈ 1e304: the largest budget the accountant calibrates (none means anything near it)


class AccountingError(ValueError):
    """The requested privacy parameters cannot be met or are invalid."""


# --------------------------------------------------------------------------- RDP core


@lru_cache(maxsize=1024)
def _log_binom_row(alpha: int) -> np.ndarray:
    """log C(alpha, l) for l = 0..alpha (cumulative sum of log((α−l+1)/l))."""
    l = np.arange(1, alpha + 1, dtype=np.float64)
    return np.concatenate([[0.0], np.cumsum(np.log((alpha - l + 1.0) / l))])


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(a - m), axis=axis))


def subsampled_rdp(alpha: int, gamma: float, t: float | np.ndarray) -> float | np.ndarray:
    """Tight RDP of a Poisson-subsampled mechanism with base RDP ρ'(l) = l·t (Thm. 14 + Lemma 15).

    ``a_γ(α) = 1/(α−1) · log[ (1−γ)^{α−1}(αγ−γ+1) + Σ_{l=2}^{α} C(α,l)(1−γ)^{α−l} γ^l e^{(l−1)·l·t} ]``

    ``t`` is the slope of the base RDP in α; for one S-BDT tree and the
    worst-case record ``t = 1/σ²`` (Cor. 20), for record *i*
    ``t = (r1·h_i²/h*² + r2·g_i²/g*²)/σ²`` (Thm. 19).  ``t`` may be an array,
    the result then has its shape.  Integer ``alpha ≥ 2`` only.
    """
    alpha = int(alpha)
    if alpha < 2:
        raise AccountingError("the Zhu–Wang bound needs an integer order α ≥ 2")
    if not (0.0 < gamma <= 1.0):
        raise AccountingError(f"subsampling rate γ must be in (0, 1], got {gamma}")
    t_arr = np.asarray(t, dtype=np.float64)
    if np.any(t_arr < 0):
        raise AccountingError("base RDP slope must be non-negative")
    if gamma == 1.0:
        out = alpha * t_arr
        return float(out) if np.ndim(out) == 0 else out
    log_g, log_1g = math.log(gamma), math.log1p(-gamma)
    l = np.arange(2, alpha + 1, dtype=np.float64)
    base = _log_binom_row(alpha)[2:] + (alpha - l) * log_1g + l * log_g  # (α−1,)
    first = (alpha - 1) * log_1g + math.log(alpha * gamma - gamma + 1.0)
    tt = t_arr.reshape(-1, 1)
    terms = base[None, :] + ((l - 1.0) * l)[None, :] * tt  # (k, α−1)
    allterms = np.concatenate([np.full((terms.shape[0], 1), first), terms], axis=1)
    out = _logsumexp(allterms, axis=1) / (alpha - 1)
    out = np.maximum(out, 0.0)
    return float(out[0]) if np.ndim(t_arr) == 0 else out.reshape(t_arr.shape)


def rdp_to_dp(alpha: np.ndarray | int, rho: np.ndarray | float, delta: float) -> np.ndarray | float:
    """Cor. 6: ``ε = ρ(α) + log((α−1)/α) − (log δ + log α)/(α−1)``."""
    a = np.asarray(alpha, dtype=np.float64)
    eps = np.asarray(rho, dtype=np.float64) + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return float(eps) if np.ndim(eps) == 0 else eps


def pure_dp_rdp(alpha: np.ndarray | int, eps: float) -> np.ndarray | float:
    """Tight RDP bound of any ε-DP mechanism (that of randomized response, see module doc)."""
    a = np.asarray(alpha, dtype=np.float64)
    if eps == 0:
        return np.zeros_like(a) if a.ndim else 0.0
    if eps > _EXP_UNDERFLOW:  # e^{−ε} is 0 in float64: the bound is ε itself (and e^{αε} would overflow)
        return np.full_like(a, float(eps)) if a.ndim else float(eps)
    # e^{αε} + e^{−(α−1)ε} = 2e^{ε/2}·cosh((α−½)ε) and 1 + e^ε = 2e^{ε/2}·cosh(ε/2): accurate for tiny ε
    # (no cancellation of log 2's) and free of overflow below the cut above
    out = (_log_cosh((a - 0.5) * eps) - _log_cosh(np.float64(eps / 2))) / (a - 1)
    return float(out) if np.ndim(out) == 0 else out


def _log_cosh(x: np.ndarray) -> np.ndarray:
    """``log cosh x`` for ``x ≥ 0``: ``log1p(2 sinh²(x/2))`` below 1, ``x − log 2 + log1p(e^{−2x})`` above."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    small = x < 1.0
    out[small] = np.log1p(2.0 * np.sinh(x[small] / 2) ** 2)
    big = x[~small]
    out[~small] = big - math.log(2.0) + np.log1p(np.exp(-2.0 * big))
    return out


def init_score_rdp(alpha: np.ndarray | int, eps_init: float, eps_ds: float) -> np.ndarray | float:
    """RDP of the initial-score release (Thm. 18 with discrete Laplace; see module doc)."""
    return pure_dp_rdp(alpha, eps_init) + pure_dp_rdp(alpha, eps_ds)


def alpha_grid(alpha_max: int = DEFAULT_ALPHA_MAX) -> np.ndarray:
    """Integer RDP orders: every α in 2..64, then a geometric grid (ratio ≈ 1.02) up to ``alpha_max``.

    Minimising Cor. 6 over any subset of integer orders is a valid bound; the
    sparse tail keeps very small ε (which needs α in the thousands) cheap.
    """
    dense = np.arange(2, min(64, alpha_max) + 1)
    if alpha_max <= 64:
        return dense
    tail = np.unique(np.round(np.geomspace(65, alpha_max, int(np.log(alpha_max / 65) / np.log(1.02)) + 2)))
    return np.unique(np.concatenate([dense, tail.astype(np.int64), [alpha_max]])).astype(np.int64)


def default_alpha_max(epsilon: float, delta: float) -> int:
    """Large enough that Cor. 6's ``log(1/δ)/(α−1)`` term can fall well below ε."""
    return int(min(200_000, max(DEFAULT_ALPHA_MAX, math.ceil(4.0 * math.log(1.0 / delta) / epsilon))))


@lru_cache(maxsize=16)
def _zhu_wang_terms(gamma: float, alphas: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat log-space terms of Thm. 14 for all orders (without the σ-dependent part)."""
    log_g, log_1g = math.log(gamma), math.log1p(-gamma)
    consts, coefs, offsets = [], [], []
    pos = 0
    for a in alphas:
        l = np.arange(2, a + 1, dtype=np.float64)
        first = (a - 1) * log_1g + math.log(a * gamma - gamma + 1.0)
        consts.append(np.concatenate([[first], _log_binom_row(a)[2:] + (a - l) * log_1g + l * log_g]))
        coefs.append(np.concatenate([[0.0], (l - 1.0) * l]))
        offsets.append(pos)
        pos += a
    return np.concatenate(consts), np.concatenate(coefs), np.asarray(offsets)


def tree_rdp(gamma: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """Cor. 20: ``a_γ(α, α/σ²)`` for one tree and the worst-case record, for each order in ``alphas``."""
    alphas = np.asarray(alphas, dtype=np.int64)
    if gamma == 1.0:
        return alphas / sigma**2
    const, coef, offsets = _zhu_wang_terms(float(gamma), tuple(int(a) for a in alphas))
    lse = np.logaddexp.reduceat(const + coef / sigma**2, offsets)
    return np.maximum(lse / (alphas - 1), 0.0)


def total_rdp(
    sigma: float, gamma: float, rounds: int, eps_init: float = 0.0, eps_ds: float = 0.0,
    alpha_max: int = DEFAULT_ALPHA_MAX, eps_candidates: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Thm. 23: (orders α, ρ(α)) for ``rounds`` trees plus the initial score (plus the pure ε_c-DP quantile
    candidates, if any)."""
    alphas = alpha_grid(alpha_max)
    rho = rounds * tree_rdp(gamma, sigma, alphas)
    rho = rho + init_score_rdp(alphas, eps_init, eps_ds)
    return alphas, (rho + pure_dp_rdp(alphas, eps_candidates)) if eps_candidates > 0 else rho


def epsilon_rdp(
    sigma: float, gamma: float, rounds: int, delta: float, eps_init: float = 0.0, eps_ds: float = 0.0,
    alpha_max: int = DEFAULT_ALPHA_MAX, eps_candidates: float = 0.0,
) -> tuple[float, int]:
    """Smallest ε over the α grid (Cor. 6) and the order α̂ achieving it."""
    alphas, rho = total_rdp(sigma, gamma, rounds, eps_init, eps_ds, alpha_max, eps_candidates)
    eps = rdp_to_dp(alphas, rho, delta)
    i = int(np.argmin(eps))
    return float(eps[i]), int(alphas[i])


def epsilon_so_far(cal: "PrivacyCalibration", rounds: int, init_released: bool, target_epsilon: float) -> float:
    """ε of what a session released so far, for the worst-case record (random trees, RDP accountant): Thm. 23
    for the first ``rounds`` of the plan's ``cal.rounds`` accounted trees (and the initial score once it is
    released), converted by Cor. 6 over the α grid the calibration used (its upper end set by the target ε,
    :func:`default_alpha_max`); 0 before anything is released.  Equals ``cal.epsilon`` once every accounted
    round and the initial score are released."""
    rounds = max(0, min(int(rounds), cal.rounds))
    init = bool(init_released and (cal.eps_init > 0 or cal.eps_ds > 0))
    if rounds == 0 and not init:
        return 0.0
    alphas, per_tree, init_rdp = _progress_terms(cal, target_epsilon)
    return float(np.min(rdp_to_dp(alphas, rounds * per_tree + (init_rdp if init else 0.0), cal.delta)))


@lru_cache(maxsize=8)
def _progress_terms(cal: "PrivacyCalibration", target_epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(α grid, one tree's RDP, the initial score's RDP) of :func:`epsilon_so_far`, as :func:`epsilon_rdp` has
    them (so that a session's progress costs one vector operation per tree)."""
    alphas = alpha_grid(default_alpha_max(target_epsilon, cal.delta))
    return alphas, tree_rdp(cal.gamma, cal.sigma, alphas), init_score_rdp(alphas, cal.eps_init, cal.eps_ds)


def record_epsilon(rdp: np.ndarray, alpha: int, delta: float) -> np.ndarray:
    """Cor. 6 at one order α (the filter's α̂) for each record's spent RDP ``rdp`` (its Rényi ledger, plus the
    initial score's RDP where that was released); 0 for a record that spent nothing."""
    rdp = np.asarray(rdp, dtype=np.float64).reshape(-1)
    return np.where(rdp > 0, np.asarray(rdp_to_dp(int(alpha), rdp, delta)).reshape(-1), 0.0)


# --------------------------------------------------------------------------- PLD (dp-accounting)


def epsilon_pld(
    sigma: float, gamma: float, rounds: int, delta: float, eps_init: float = 0.0, eps_ds: float = 0.0,
    value_discretization_interval: float = 1e-4, eps_candidates: float = 0.0,
) -> float:
    """ε of the same mechanism by ``dp-accounting``'s PLD accountant (filter off only).

    One tree is a Poisson-subsampled Gaussian with noise multiplier σ/√2
    (add/remove neighbours); each initial-score release is a pure ε-DP
    mechanism, represented by its worst-case PLD.
    """
    from dp_accounting.pld import common, privacy_loss_distribution as pld_lib

    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma / math.sqrt(2.0), sensitivity=1.0, sampling_prob=gamma,
        value_discretization_interval=value_discretization_interval,
    ).self_compose(int(rounds))
    for e in (eps_init, eps_ds, eps_candidates):
        if e > 0:
            pld = pld.compose(pld_lib.from_privacy_parameters(
                common.DifferentialPrivacyParameters(e, 0.0),
                value_discretization_interval=value_discretization_interval))
    return float(pld.get_epsilon_for_delta(delta))


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class PrivacyCalibration:
    """Result of Alg. 6: the noise and the filter budget for a training run."""

    accountant: str  # "rdp" or "pld"
    sigma: float  # unweighted leaf noise σ_leaf
    alpha: int  # α̂ (RDP order used for the filter); 0 for pld
    rho: float  # ρ(α̂): per-record RDP budget of the trees (filter budget); 0 for pld
    epsilon: float  # achieved total ε (≤ target)
    delta: float
    rounds: int  # accounted tree rounds
    gamma: float
    eps_init: float
    eps_ds: float
    eps_select: float = 0.0  # greedy trees: ε of the exponential mechanism per level (0: random trees)
    sigma_select: float = 0.0  # greedy trees with histogram selection: σ_s of the level histograms
    sigma_sketch: float = 0.0  # greedy trees with the adaptive Hessian sketch: σ_k of its histograms
    eps_sketch: float = 0.0  # Sarus trees: ε of the Laplace Hessian histograms per tree (docs/sarus.md)
    eps_leaf: float = 0.0  # Sarus trees: ε of the Laplace leaf values per tree
    eps_paper: float = 0.0  # Sarus trees: the pure ε the paper's composition claims for this run
    eps_rdp: float = 0.0  # Sarus trees: our RDP ledger's ε at the plan's δ for this run
    eps_candidates: float = 0.0  # ε_c of the DP quantile split candidates (0: none; common/candidates.py)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _bisect_sigma(eps_of_sigma, target: float, lo: float = 1e-3, hi: float = 1e6, rel_tol: float = 1e-7) -> float:
    """Smallest σ (to ``rel_tol``) with ``eps_of_sigma(σ) ≤ target``; ε is decreasing in σ."""
    if eps_of_sigma(hi) > target:
        raise AccountingError(
            f"target ε={target:g} is unreachable even with σ={hi:g}; raise ε, lower the number of trees "
            "or the subsampling rate, or lower the initial-score share"
        )
    if eps_of_sigma(lo) <= target:
        return lo
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if eps_of_sigma(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


@lru_cache(maxsize=128)
def calibrate(
    epsilon: float, delta: float, gamma: float, rounds: int, init_share: float = 0.0, eps_ds: float = 0.0,
    accountant: str = "rdp", alpha_max: int | None = None, eps_candidates: float = 0.0,
) -> PrivacyCalibration:
    """Alg. 6 (see :func:`_calibrate`); a budget too large to compute is an :class:`AccountingError`."""
    if not epsilon <= MAX_EPSILON:
        raise AccountingError(f"ε = {epsilon:g} is too large for the accountant (above {MAX_EPSILON:g}, where "
                              "e^ε leaves double precision); such a budget gives no meaningful privacy")
    try:
        return _calibrate(epsilon, delta, gamma, rounds, init_share, eps_ds, accountant, alpha_max, eps_candidates)
    except OverflowError:
        raise AccountingError(f"ε = {epsilon:g} is too large for the accountant (numerical overflow); such a "
                              "budget gives no meaningful privacy") from None


def _calibrate(
    epsilon: float, delta: float, gamma: float, rounds: int, init_share: float, eps_ds: float,
    accountant: str, alpha_max: int | None, eps_candidates: float = 0.0,
) -> PrivacyCalibration:
    """Alg. 6: the smallest σ_leaf whose total guarantee (Thm. 23) is (ε, δ)-DP.

    ``init_share`` = ε_init/ε; ε_init and ε_ds parameterise the Gaussian
    initial-score release (``init_share = 0`` disables it and ε_ds with it).
    ``accountant="rdp"`` uses :func:`alpha_grid` (and yields the filter's
    α̂ and ρ(α̂)); ``"pld"`` uses dp-accounting's PLD accountant.  ``eps_candidates`` (ε_c ≥ 0): a pure
    ε_c-DP release composed with the rest (the DP quantile split candidates, common/candidates.py).
    """
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise AccountingError(f"ε must be a positive number, got {epsilon}")
    if not (0 < delta < 1):
        raise AccountingError(f"δ must be in (0, 1), got {delta}")
    if not (0 <= init_share < 1):
        raise AccountingError(f"init share ε_init/ε must be in [0, 1), got {init_share}")
    if rounds < 1:
        raise AccountingError("at least one accounted tree is needed")
    eps_init = init_share * epsilon
    eps_ds = eps_ds if init_share > 0 else 0.0
    if not (0 <= eps_candidates < epsilon):
        raise AccountingError(f"ε_c of the quantile candidates must be in [0, ε), got {eps_candidates}")
    ec = float(eps_candidates)
    if alpha_max is None:
        alpha_max = default_alpha_max(epsilon, delta)
    if accountant == "rdp":
        f = lambda s: epsilon_rdp(s, gamma, rounds, delta, eps_init, eps_ds, alpha_max, ec)[0]  # noqa: E731
        sigma = _bisect_sigma(f, epsilon)
        eps, alpha = epsilon_rdp(sigma, gamma, rounds, delta, eps_init, eps_ds, alpha_max, ec)
        rho = rounds * float(tree_rdp(gamma, sigma, np.array([alpha]))[0])
        return PrivacyCalibration("rdp", sigma, alpha, rho, eps, delta, rounds, gamma, eps_init, eps_ds,
                                  eps_candidates=ec)
    if accountant == "pld":
        # PLD is never looser than RDP: bracket the search by the RDP calibration.
        upper = calibrate(epsilon, delta, gamma, rounds, init_share, eps_ds, "rdp", alpha_max, ec).sigma
        interval = min(1e-4, epsilon * 1e-3)
        f = lambda s: epsilon_pld(s, gamma, rounds, delta, eps_init, eps_ds, interval, ec)  # noqa: E731
        sigma = _bisect_sigma(f, epsilon, lo=upper / 4.0, hi=upper, rel_tol=1e-4)
        return PrivacyCalibration("pld", sigma, 0, 0.0, f(sigma), delta, rounds, gamma, eps_init, eps_ds,
                                  eps_candidates=ec)
    raise AccountingError(f"unknown accountant {accountant!r} (use 'rdp' or 'pld')")


# --------------------------------------------------------------------------- exponential mechanism (bounded range)


def bounded_range_rdp(alpha: np.ndarray | int | float, eps: float) -> np.ndarray | float:
    """Thm. 1 of "Revisiting DP-XGBoost" (eq. 4): RDP of any ε-bounded-range mechanism, e.g. the exponential
    mechanism ``P[y] ∝ exp(ε·u(y)/(2Δu))`` (Dong et al. 2019).

    ``f(α) = sup_{t∈[0,ε]} 1/(α−1)·[α(t−ε) + log((e^{αε}−1)·p_{ε,t} + 1)]``,
    ``p_{ε,t} = (e^{−t} − e^{−ε})/(1 − e^{−ε})`` — the Rényi divergence of the
    generalised randomized response RR_{ε,t} (Lemma 1).  The bracket
    ``h(t)`` vanishes at t = 0 and t = ε and has exactly one stationary point
    (``h'(t) = 0`` is linear in e^{−t}):
    ``t* = ε + log((α−1)/α) − log(1 − 1/R)``, ``R = (e^{αε}−1)/(e^ε−1) ≥ α``,
    which lies in [0, ε]; so the supremum is ``h(t*)`` — exact, no grid.
    Evaluated with ``expm1``/``log1p`` and in log space for large αε
    (Appendix A.1), so neither tiny ε nor large α loses precision or
    overflows.  ``α = 1`` gives the KL bound ``ε/(e^ε−1) − 1 − log(ε/(e^ε−1))``.
    """
    a = np.asarray(alpha, dtype=np.float64)
    if np.any(a < 1):
        raise AccountingError("RDP orders must be ≥ 1")
    if eps < 0 or not math.isfinite(eps):
        raise AccountingError(f"bounded-range ε must be finite and ≥ 0, got {eps}")
    if eps == 0:
        return np.zeros_like(a) if a.ndim else 0.0
    kl = eps / math.expm1(eps) - 1.0 - math.log(eps / math.expm1(eps))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        am = np.where(a > 1, a, 2.0)
        log_A = am * eps + np.log(-np.expm1(-am * eps))  # log(e^{αε} − 1)
        log_R = log_A - math.log(math.expm1(eps))
        t = np.clip(eps + np.log((am - 1) / am) - np.log1p(-np.exp(-log_R)), 0.0, eps)
        p = np.expm1(eps - t) / math.expm1(eps)  # p_{ε,t}
        log_X = log_A + np.log(p)  # log((e^{αε} − 1)·p)
        log1p_X = np.where(log_X < 0, np.log1p(np.exp(np.minimum(log_X, 0.0))),
                           log_X + np.log1p(np.exp(-np.maximum(log_X, 0.0))))
        h = am * (t - eps) + log1p_X
        out = np.where(a > 1, np.maximum(h, 0.0) / (am - 1), kl)
    return float(out) if np.ndim(out) == 0 else out


def exponential_zcdp_rdp(alpha: np.ndarray | int | float, eps: float) -> np.ndarray | float:
    """Cesar & Rogers (2021) / Dong et al.: an ε-bounded-range mechanism is ε²/8-zCDP, i.e. (α, α·ε²/8)-RDP."""
    a = np.asarray(alpha, dtype=np.float64)
    out = a * eps**2 / 8.0
    return float(out) if np.ndim(out) == 0 else out


# --------------------------------------------------------------------------- releases as data (DpEvent-like)


@dataclass(frozen=True)
class GaussianEvent:
    """Gaussian mechanism with L2 sensitivity 1 and noise std ``noise_multiplier``: RDP α/(2z²)."""

    noise_multiplier: float


@dataclass(frozen=True)
class PoissonSampledEvent:
    """``event`` run on a Poisson subsample of rate ``rate`` (add/remove neighbours)."""

    rate: float
    event: "DpEvent"


@dataclass(frozen=True)
class ExponentialEvent:
    """An ε-bounded-range release: the exponential mechanism ``∝ exp(ε·u/(2Δu))`` (paper Thm. 1)."""

    epsilon: float


@dataclass(frozen=True)
class LaplaceEvent:
    """A pure ε-DP release (here: the discrete Laplace of the initial score)."""

    epsilon: float


@dataclass(frozen=True)
class ComposedEvent:
    """Adaptive composition of ``events`` each repeated ``count`` times."""

    events: tuple
    count: int = 1


@dataclass(frozen=True)
class ParallelEvent:
    """``events`` run on disjoint parts of the records, each record's part drawn independently of the data:
    one record takes part in exactly one of them, so the whole costs the worst part (parallel composition,
    McSherry 2009; in RDP the pointwise maximum of the curves, since Rényi divergence is quasi-convex in
    each argument and the other parts see the same records)."""

    events: tuple


DpEvent = GaussianEvent | PoissonSampledEvent | ExponentialEvent | LaplaceEvent | ComposedEvent | ParallelEvent


def compose(*events: DpEvent, count: int = 1) -> ComposedEvent:
    return ComposedEvent(tuple(e for e in events if e is not None), int(count))


def event_rdp(event: DpEvent, alphas: np.ndarray) -> np.ndarray:
    """RDP curve ρ(α) of ``event`` at the integer ``alphas`` (≥ 2); composition adds curves."""
    alphas = np.asarray(alphas, dtype=np.int64)
    if isinstance(event, ComposedEvent):
        total = np.zeros(alphas.shape)
        for e in event.events:
            total = total + event_rdp(e, alphas)
        return event.count * total
    if isinstance(event, ParallelEvent):
        if not event.events:
            raise AccountingError("empty parallel composition")
        return np.max([event_rdp(e, alphas) for e in set(event.events)], axis=0)
    if isinstance(event, GaussianEvent):
        return alphas / (2.0 * event.noise_multiplier**2)
    if isinstance(event, PoissonSampledEvent):
        z = gaussian_multiplier(event.event)
        if z is not None:
            return tree_rdp(event.rate, math.sqrt(2.0) * z, alphas)
        eps = pure_epsilon(event.event)
        if eps is None:
            raise AccountingError("only Poisson-subsampled Gaussian or pure-DP releases are supported")
        # both are valid bounds at every order: the amplified worst case, and no amplification at all
        return np.minimum(subsampled_pure_dp_rdp(alphas, eps, event.rate), event_rdp(event.event, alphas))
    if isinstance(event, ExponentialEvent):
        return np.asarray(bounded_range_rdp(alphas, event.epsilon), dtype=np.float64)
    if isinstance(event, LaplaceEvent):
        return np.asarray(pure_dp_rdp(alphas, event.epsilon), dtype=np.float64)
    raise AccountingError(f"unknown privacy event {event!r}")


def gaussian_multiplier(event: DpEvent) -> float | None:
    """The noise multiplier z of ``event`` if it is a Gaussian release or an (adaptive) composition of Gaussian
    releases only, else None.  Composed Gaussians of multipliers z_i have the RDP curve
    ``α·Σ 1/(2z_i²)`` — that of one Gaussian with ``1/z² = Σ 1/z_i²`` (Thm. 5), linear in α, so Lemma 15
    holds and the tight subsampling bound (Thm. 14) applies to the composition as to one Gaussian (a
    Sarus tree: sketch, levels and leaves on one Poisson subsample, docs/sarus.md "Federation")."""
    if isinstance(event, GaussianEvent):
        return float(event.noise_multiplier)
    if isinstance(event, ComposedEvent) and event.events:
        parts = [gaussian_multiplier(e) for e in event.events]
        if any(p is None for p in parts):
            return None
        return 1.0 / math.sqrt(event.count * sum(1.0 / p**2 for p in parts))
    return None


def pure_epsilon(event: DpEvent) -> float | None:
    """The pure ε of ``event`` by basic composition, or None if it holds a Gaussian release (not pure DP)."""
    if isinstance(event, (LaplaceEvent, ExponentialEvent)):
        return float(event.epsilon)
    if isinstance(event, ComposedEvent):
        parts = [pure_epsilon(e) for e in event.events]
        return None if any(p is None for p in parts) else event.count * float(sum(parts))
    if isinstance(event, PoissonSampledEvent):
        inner = pure_epsilon(event.event)
        return None if inner is None else subsampled_pure_epsilon(inner, event.rate)
    return None


def subsampled_pure_epsilon(eps: float, gamma: float) -> float:
    """Amplification by subsampling of an ε-DP mechanism: ``log(1 + γ(e^ε − 1))`` (Balle et al. 2018; the
    bound DP-XGBoost (Grislain & Gonzalvez) §4.4 uses; exact for Poisson sampling, add/remove)."""
    return math.log1p(gamma * math.expm1(eps))


def subsampled_pure_dp_rdp(alpha: np.ndarray | int, eps: float, gamma: float) -> np.ndarray | float:
    """RDP of an ε-DP mechanism run on a Poisson subsample of rate γ (add/remove), tight for the worst case.

    Every ε-DP mechanism is dominated by randomized response ``P₀ = (e^ε, 1)/(1+e^ε)``,
    ``Q₀ = (1, e^ε)/(1+e^ε)`` (Kairouz et al. 2015), Poisson subsampling maps a dominating pair (P, Q) to
    ``(γP + (1−γ)Q, Q)`` for removal and ``(Q, γP + (1−γ)Q)`` for addition (Zhu, Dong & Wang 2022, Thm. 11),
    and the Rényi divergence respects dominance (it is an f-divergence of the pair).  So
    ``ρ(α) = max(D_α(M‖Q₀), D_α(Q₀‖M))``, ``M = γP₀ + (1−γ)Q₀`` — a two-point computation in log space.
    γ = 1 gives randomized response itself (:func:`pure_dp_rdp`)."""
    a = np.asarray(alpha, dtype=np.float64)
    if not 0 < gamma <= 1:
        raise AccountingError(f"subsampling rate γ must be in (0, 1], got {gamma}")
    if eps < 0 or not math.isfinite(eps):
        raise AccountingError(f"ε must be finite and ≥ 0, got {eps}")
    if eps == 0:
        return np.zeros_like(a) if a.ndim else 0.0
    if gamma == 1.0:
        return pure_dp_rdp(alpha, eps)
    log_z = np.logaddexp(0.0, eps)
    log_p = np.array([eps - log_z, -log_z])  # log P₀
    log_q = log_p[::-1]  # log Q₀
    log_m = np.logaddexp(math.log(gamma) + log_p, math.log1p(-gamma) + log_q)
    am = np.where(a > 1, a, 2.0)[..., None]
    d_mq = _logsumexp(am * log_m + (1 - am) * log_q, axis=-1)
    d_qm = _logsumexp(am * log_q + (1 - am) * log_m, axis=-1)
    out = np.maximum(np.maximum(d_mq, d_qm), 0.0) / (am[..., 0] - 1)
    return float(out) if np.ndim(out) == 0 else out


def event_epsilon_rdp(event: DpEvent, delta: float, alpha_max: int = DEFAULT_ALPHA_MAX) -> tuple[float, int]:
    """(ε, α̂) of ``event`` by the RDP ledger and Cor. 6."""
    alphas = alpha_grid(alpha_max)
    eps = rdp_to_dp(alphas, event_rdp(event, alphas), delta)
    i = int(np.argmin(eps))
    return float(eps[i]), int(alphas[i])


def event_pld(event: DpEvent, value_discretization_interval: float = 1e-4):
    """``event`` as a dp-accounting privacy-loss distribution.

    Gaussian, subsampled Gaussian and pure-DP releases are exact; an
    exponential mechanism is represented by the worst-case PLD of a pure
    ε-DP mechanism (valid: it is ε-DP; dp-accounting has no bounded-range
    PLD, so its BR refinement (Thm. 1) is not used there).
    """
    from dp_accounting.pld import common, privacy_loss_distribution as pld_lib

    vdi = value_discretization_interval
    if isinstance(event, ComposedEvent):
        parts = [event_pld(e, vdi) for e in event.events]
        if not parts:
            raise AccountingError("empty composition")
        pld = parts[0]
        for p in parts[1:]:
            pld = pld.compose(p)
        return pld.self_compose(event.count) if event.count > 1 else pld
    if isinstance(event, ParallelEvent):
        if len(set(event.events)) != 1:  # a PLD has no pointwise maximum; identical parts are one part
            raise AccountingError("dp-accounting can only represent a parallel composition of identical parts")
        return event_pld(event.events[0], vdi)
    if isinstance(event, GaussianEvent):
        return pld_lib.from_gaussian_mechanism(standard_deviation=event.noise_multiplier, sensitivity=1.0,
                                               value_discretization_interval=vdi)
    if isinstance(event, PoissonSampledEvent) and isinstance(event.event, GaussianEvent):
        return pld_lib.from_gaussian_mechanism(standard_deviation=event.event.noise_multiplier, sensitivity=1.0,
                                               sampling_prob=event.rate, value_discretization_interval=vdi)
    if isinstance(event, (ExponentialEvent, LaplaceEvent)):
        return pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(event.epsilon, 0.0),
                                               value_discretization_interval=vdi)
    raise AccountingError(f"dp-accounting cannot represent {event!r}")


def init_score_events(eps_init: float, eps_ds: float) -> ComposedEvent:
    """The initial score (Alg. 3): two discrete-Laplace releases."""
    return compose(*(LaplaceEvent(e) for e in (eps_init, eps_ds) if e > 0))


SELECTIONS = ("exponential", "histogram")


def greedy_tree_event(select: float, sigma: float, depth: int, selection: str = "exponential",
                      sigma_sketch: float = 0.0) -> ComposedEvent:
    """One greedy tree: ``depth`` levels of node selection and the Gaussian leaf release of S-BDT with
    unweighted noise σ (noise multiplier σ/√2, module doc).

    The nodes of a level hold disjoint records, so a level is one release (parallel composition):
    ``selection="exponential"``: the exponential mechanism, ``select`` = its ε (bounded range, Thm. 1);
    ``"histogram"``: noisy level histograms (:mod:`fedsbdt.common.modes.greedy.levels`), ``select`` = their σ_s, a
    Gaussian of noise multiplier σ_s/√2.  ``sigma_sketch > 0``: first the adaptive Hessian sketch
    (:mod:`fedsbdt.common.modes.greedy.levels`), a Gaussian of noise multiplier σ_k/√2."""
    if selection == "exponential":
        level = ExponentialEvent(select)
    elif selection == "histogram":
        level = GaussianEvent(select / math.sqrt(2.0))
    else:
        raise AccountingError(f"unknown selection {selection!r} (use 'exponential' or 'histogram')")
    sketch = GaussianEvent(sigma_sketch / math.sqrt(2.0)) if sigma_sketch > 0 else None
    return compose(sketch, compose(level, count=depth), GaussianEvent(sigma / math.sqrt(2.0)))


def greedy_training_event(select: float, sigma: float, depth: int, rounds: int, eps_init: float, eps_ds: float,
                          selection: str = "exponential", sigma_sketch: float = 0.0) -> ComposedEvent:
    """Everything a greedy training run releases: the initial score and ``rounds`` greedy trees."""
    return compose(init_score_events(eps_init, eps_ds),
                   compose(greedy_tree_event(select, sigma, depth, selection, sigma_sketch), count=rounds))


def greedy_budget(scale: float, rounds: int, depth: int, selection_share: float,
                  selection: str = "exponential", sketch_share: float = 0.0) -> tuple[float, float]:
    """(selection parameter per level, σ) for a zCDP budget ``scale`` split selection : leaves = s : 1 − s.

    The shares are of the trees' zCDP cost (paper §6: selection : leaf = 0.7 : 0.3):
    exponential: ``T·d·ε_select²/8 = s·scale``; histogram: ``T·d/σ_s² = s·scale``; leaves
    ``T/σ² = (1 − s)·scale`` (a Gaussian of multiplier σ/√2 is (α, α/σ²)-RDP).  The accountant then
    charges the exponential mechanism with the tighter Thm. 1, so its achieved ε is below zCDP's.
    With an adaptive Hessian sketch (share k, :func:`sketch_sigma`) the leaves get ``1 − s − k``
    (paper: sketch : selection : leaf = 0.1 : 0.6 : 0.3).
    """
    per_level = selection_share * scale / (rounds * depth)
    select = math.sqrt(8.0 * per_level) if selection == "exponential" else math.sqrt(1.0 / per_level)
    sigma = math.sqrt(rounds / ((1.0 - selection_share - sketch_share) * scale))
    return select, sigma


def sketch_sigma(scale: float, rounds: int, sketch_share: float) -> float:
    """σ_k of the per-tree Hessian sketch: ``T/σ_k² = k·scale`` (0 without a sketch)."""
    return math.sqrt(rounds / (sketch_share * scale)) if sketch_share > 0 else 0.0


@lru_cache(maxsize=128)
def calibrate_greedy(
    epsilon: float, delta: float, rounds: int, depth: int, selection_share: float = 0.7, init_share: float = 0.0,
    eps_ds: float = 0.0, accountant: str = "rdp", alpha_max: int | None = None, selection: str = "exponential",
    sketch_share: float = 0.0,
) -> PrivacyCalibration:
    """The largest greedy budget (selection parameter, σ) whose whole release (:func:`greedy_training_event`) is
    (ε, δ)-DP under ``accountant`` (bisection on the zCDP budget scale of :func:`greedy_budget`)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise AccountingError(f"ε must be a positive number, got {epsilon}")
    if not (0 < delta < 1):
        raise AccountingError(f"δ must be in (0, 1), got {delta}")
    if rounds < 1 or depth < 1:
        raise AccountingError("at least one accounted tree of depth ≥ 1 is needed")
    eps_init = init_share * epsilon
    eps_ds = eps_ds if init_share > 0 else 0.0
    if alpha_max is None:
        alpha_max = default_alpha_max(epsilon, delta)
    # dp-accounting's PLDs are pessimistic at any discretization (valid upper bounds); 1e-3 keeps the
    # composition of T·d pure-DP events fast
    interval = min(1e-3, epsilon * 1e-2)

    if selection not in SELECTIONS:
        raise AccountingError(f"unknown selection {selection!r} (use 'exponential' or 'histogram')")
    if accountant not in ("rdp", "pld"):
        raise AccountingError(f"unknown accountant {accountant!r} (use 'rdp' or 'pld')")

    def eps_of(scale: float) -> float:
        select, sigma = greedy_budget(scale, rounds, depth, selection_share, selection, sketch_share)
        ev = greedy_training_event(select, sigma, depth, rounds, eps_init, eps_ds, selection,
                                   sketch_sigma(scale, rounds, sketch_share))
        try:
            if accountant == "rdp":
                return event_epsilon_rdp(ev, delta, alpha_max)[0]
            return float(event_pld(ev, interval).get_epsilon_for_delta(delta))
        except OverflowError:  # a budget far beyond any target (the bisection's upper end)
            return math.inf

    # ε grows with the scale: bisect for the largest scale with ε ≤ target (σ = 1/√scale-like inversion).
    lo, hi = 1e-6, 1e8
    if accountant == "pld":  # bracket the search around the (fast) RDP calibration
        r = calibrate_greedy(epsilon, delta, rounds, depth, selection_share, init_share, eps_ds, "rdp", alpha_max,
                             selection, sketch_share)
        scale_rdp = rounds / ((1.0 - selection_share - sketch_share) * r.sigma**2)
        lo, hi = 1.0 / (16.0 * scale_rdp), 16.0 / scale_rdp
    try:
        inv = _bisect_sigma(lambda x: eps_of(1.0 / x), epsilon, lo=lo, hi=hi,
                            rel_tol=1e-7 if accountant == "rdp" else 1e-3)
    except OverflowError:
        raise AccountingError(f"ε = {epsilon:g} is too large for the accountant (numerical overflow)") from None
    scale = 1.0 / inv
    select, sigma = greedy_budget(scale, rounds, depth, selection_share, selection, sketch_share)
    sk = sketch_sigma(scale, rounds, sketch_share)
    ev = greedy_training_event(select, sigma, depth, rounds, eps_init, eps_ds, selection, sk)
    if accountant == "rdp":
        eps, alpha = event_epsilon_rdp(ev, delta, alpha_max)
        rho = float(event_rdp(compose(greedy_tree_event(select, sigma, depth, selection, sk), count=rounds),
                              np.array([alpha]))[0])
    else:
        eps, alpha, rho = eps_of(scale), 0, 0.0
    exponential = selection == "exponential"
    return PrivacyCalibration(accountant, sigma, alpha, rho, eps, delta, rounds, 1.0, eps_init, eps_ds,
                              select if exponential else 0.0, 0.0 if exponential else select, sk)
