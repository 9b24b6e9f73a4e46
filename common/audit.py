"""The one-run privacy audit: an empirical *lower* bound on ε (docs/audit.md).

Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023 (arXiv:2305.08846v1),
applied to S-BDT.  The auditor

1. draws m canary records and, for each, a fair coin from the OS CSPRNG that only it keeps (the paper's
   Algorithm 1: canary i is in the training data iff its coin says so);
2. trains once, as usual, on the data plus the canaries whose coin came up "in";
3. scores every canary from the released model alone (plus what it knew before training: the data, the
   canaries, the public split seed), guesses "in" for the k+ highest scores, "out" for the k− lowest and
   abstains on the rest (r = k+ + k− guesses);
4. counts the v correct guesses and turns (m, r, v) into ε_lower: the largest ε such that an (ε, δ)-DP
   training run would make ≥ v correct guesses with probability at most β (confidence 1 − β).

If the implementation really is (ε, δ)-DP, ``ε_lower ≤ ε`` except with probability ≤ β.  ε_lower is a lower
bound, never a proof: a small ε_lower says this attack could not see more, not that nothing leaks.

This module holds the pure parts: the bound (:func:`p_value`, :func:`epsilon_lower_bound`), the canaries
(:func:`draw_canaries`), the attack (:func:`canary_scores`) and the guesses (:func:`audit_guesses`).
:func:`run_central_audit` puts them together around :func:`fedsbdt.common.engine.train`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from fedsbdt.common import modes

#: the largest ε the search of :func:`epsilon_lower_bound` tries (far beyond anything m canaries can show)
EPSILON_SEARCH_MAX = 1024.0
#: relative width at which the bisection of :func:`epsilon_lower_bound` stops (it returns the low end)
BISECTION_TOL = 1e-10
#: grid step of the scan that brackets the first crossing when 2·m·δ > 1
SCAN_STEP = 1.0 / 64


class AuditError(ValueError):
    """Invalid audit parameters (one line for the command line)."""


def auditable_builders() -> str:
    """The tree builders the audit trains (``Mode.auditable``: splits that spend no privacy), for a refusal."""
    return " or ".join(f"{n} trees" for n, m in modes.tree_builders().items() if m.auditable)


# --------------------------------------------------------------------------- the bound


def _check_counts(m: int, r: int, v: int) -> None:
    for name, x in (("m", m), ("r", r), ("v", v)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise AuditError(f"{name} = {x!r}: must be an integer")
    if m < 1:
        raise AuditError(f"m = {m}: at least one canary is needed")
    if not 0 <= v <= r <= m:
        raise AuditError(f"need 0 ≤ v ≤ r ≤ m (correct ≤ guesses ≤ canaries), got v = {v}, r = {r}, m = {m}")


def _check_delta(m: int, delta: float) -> None:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
        raise AuditError(f"δ = {delta!r}: must be a finite number ≥ 0")


@lru_cache(maxsize=64)
def _log_binomial_coefficients(r: int) -> np.ndarray:
    """``log C(r, k)`` for k = 0 … r, from ``math.lgamma`` (relative error ~1e-15 per term)."""
    lg = np.array([math.lgamma(k + 1.0) for k in range(r + 1)])
    out = lg[r] - lg - lg[::-1]
    out.setflags(write=False)
    return out


def binomial_pmf(r: int, epsilon: float) -> np.ndarray:
    """``P[Binomial(r, q) = k]`` for k = 0 … r with ``q = e^ε/(1 + e^ε)``, the accuracy of ε-DP randomized
    response (log space: ``log q = −log(1 + e^−ε)``, ``log(1 − q) = −ε − log(1 + e^−ε)``, no overflow)."""
    k = np.arange(r + 1, dtype=np.float64)
    log1pe = math.log1p(math.exp(-epsilon))
    return np.exp(_log_binomial_coefficients(r) - k * log1pe + (r - k) * (-epsilon - log1pe))


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """An upper bound on ``P[≥ v of r guesses correct]`` for an (ε, δ)-DP training run with m canaries.

    Pure ε-DP (δ = 0), the paper's main theorem for ε-DP (§3): with the coins uniform and the guesses a
    function of the output, the number of correct guesses is stochastically dominated by
    ``Binomial(r, e^ε/(1 + e^ε))``, so the bound is that binomial's upper tail ``P[B ≥ v]``.

    (ε, δ)-DP, the paper's approximate-DP result (Corollary 5.4; the code of Appendix D)::

        P[B ≥ v] + 2·m·δ · max_{i=1..v} P[v − i ≤ B < v] / i,     B ~ Binomial(r, e^ε/(1 + e^ε))

    Capped at 1.  For 2·m·δ ≤ 1 it is non-decreasing in ε: for each i the sum
    ``P[B ≥ v] + c·P[v−i ≤ B < v]/i = (1 − c/i)·P[B ≥ v] + (c/i)·P[B ≥ v−i]`` is a combination with
    non-negative weights of binomial upper tails, each non-decreasing in q, and a maximum of
    non-decreasing functions is non-decreasing.  That is what makes the bisection of
    :func:`epsilon_lower_bound` return the first crossing (for 2·m·δ > 1 it scans first, see there).
    """
    _check_counts(m, r, v)
    _check_delta(m, delta)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) \
            or epsilon < 0:
        raise AuditError(f"ε = {epsilon!r}: must be a finite number ≥ 0")
    if v == 0:
        return 1.0
    pmf = binomial_pmf(int(r), float(epsilon))
    tail = math.fsum(pmf[v:])
    if delta == 0:
        return min(tail, 1.0)
    below = np.cumsum(pmf[v - 1::-1])  # P[v − i ≤ B < v] for i = 1 … v
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float) -> float:
    """ε_lower: the largest ε with ``p_value(m, r, v, ε, δ) ≤ β`` (0 if none), by bisection.

    The paper's ``get_eps_audit`` (Appendix D), with the p-value above computed without scipy, bisection
    to a relative width of :data:`BISECTION_TOL` and the low end returned (the conservative side).  An
    (ε, δ)-DP run gives ``ε_lower > ε`` with probability ≤ β: ``ε_lower > ε`` means ``p_value(ε) ≤ β``
    (the p-value is non-decreasing in ε), which has probability ≤ β under the null hypothesis.  With
    2·m·δ > 1 (e.g. the paper's m = 10^5, δ = 10^-5) monotonicity is not proven, so the first crossing is
    bracketed on a grid of step :data:`SCAN_STEP` before the bisection.
    """
    _check_counts(m, r, v)
    _check_delta(m, delta)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < 1:
        raise AuditError(f"β = {beta!r}: 1 − confidence must be in (0, 1)")
    if v == 0 or p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    if 2 * m * delta <= 1:  # monotone (see p_value): bracket by doubling
        lo, hi = 0.0, 1.0
        while p_value(m, r, v, hi, delta) <= beta:
            lo, hi = hi, 2.0 * hi
            if hi > EPSILON_SEARCH_MAX:
                return lo
    else:  # not proven monotone: the first grid point (step 1/64) above β brackets the first crossing
        lo, hi = 0.0, SCAN_STEP
        while p_value(m, r, v, hi, delta) <= beta:
            lo, hi = hi, hi + SCAN_STEP
            if hi > EPSILON_SEARCH_MAX:
                return lo
    while hi - lo > BISECTION_TOL * max(hi, 1.0):
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def max_auditable_epsilon(m: int, delta: float, beta: float) -> float:
    """ε_lower of a perfect attack on m canaries that guesses all of them right: no audit with m canaries can
    show more (the paper's observation that auditing ε needs about ``e^ε·log(1/β)`` canaries)."""
    return epsilon_lower_bound(m, m, m, delta, beta)


# --------------------------------------------------------------------------- guesses


def guess_counts(m: int) -> tuple[int, ...]:
    """The numbers of guesses r the audit tries, fixed before training: 10, 20, 50, 100, 200, 500, … below m,
    and m itself.  Trying J of them costs a Bonferroni factor: each is tested at β/J."""
    out, base = [], 10
    while base < m:
        out.extend(x for x in (base, 2 * base, 5 * base) if x < m)
        base *= 10
    return tuple(sorted(set(out))) + (m,)


@dataclass(frozen=True)
class Guesses:
    """One choice of r guesses: the k+ = ⌈r/2⌉ highest scores "in", the k− = ⌊r/2⌋ lowest "out"."""

    r: int
    k_plus: int
    k_minus: int
    correct: int
    epsilon_lower: float


def audit_guesses(scores: np.ndarray, coins: np.ndarray, delta: float, beta: float,
                  counts: tuple[int, ...] | None = None) -> tuple[Guesses, tuple[Guesses, ...]]:
    """Guess from ``scores`` (higher: more likely "in"), score the guesses against ``coins`` and return the best
    choice of r (largest ε_lower, each r tested at β/len(counts): Bonferroni) and all of them."""
    scores = np.asarray(scores, dtype=np.float64)
    coins = np.asarray(coins, dtype=bool)
    m = scores.size
    if coins.shape != scores.shape or m == 0:
        raise AuditError(f"{m} scores but {coins.size} coins")
    if not np.all(np.isfinite(scores)):
        raise AuditError("canary scores must be finite")
    counts = guess_counts(m) if counts is None else tuple(counts)
    if not counts or any(not 1 <= r <= m for r in counts):
        raise AuditError(f"numbers of guesses must be in 1..{m}, got {counts}")
    order = np.argsort(-scores, kind="stable")  # highest first
    ranked = coins[order]
    in_correct = np.concatenate([[0], np.cumsum(ranked)])  # among the top j: how many are in
    out_correct = np.concatenate([[0], np.cumsum(~ranked[::-1])])  # among the bottom j: how many are out
    each = []
    for r in counts:
        kp, km = (r + 1) // 2, r // 2
        v = int(in_correct[kp] + out_correct[km])
        each.append(Guesses(r, kp, km, v, epsilon_lower_bound(m, r, v, delta, beta / len(counts))))
    best = max(each, key=lambda g: (g.epsilon_lower, g.correct / g.r))
    return best, tuple(each)


# --------------------------------------------------------------------------- canaries


@dataclass(frozen=True)
class Canaries:
    """The auditor's canaries: records (features as level index for categorical ones, labels in the schema's
    units) and the coins it keeps (True: in the training data)."""

    X: np.ndarray  # float64 (m, features)
    y: np.ndarray  # float64 (m,): an end of the label range (regression) or 0/1 (binary)
    coins: np.ndarray  # bool (m,)

    def __post_init__(self) -> None:
        m = self.X.shape[0]
        if self.X.ndim != 2 or self.y.shape != (m,) or self.coins.shape != (m,) or self.coins.dtype != bool:
            raise AuditError("canaries: X (m × features), y (m) and boolean coins (m) must agree")
        if m < 1:
            raise AuditError("canaries: at least one")

    @property
    def m(self) -> int:
        return int(self.X.shape[0])


def _uniform01(n: int) -> np.ndarray:
    """n uniform doubles in [0, 1) from the OS-keyed CSPRNG (53 random bits each)."""
    from .randomness import csprng_uint64

    return (csprng_uint64(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _fair_coins(n: int) -> np.ndarray:
    from .randomness import csprng_uint64

    return (csprng_uint64(n) & np.uint64(1)).astype(bool)


def draw_canaries(schema, m: int) -> Canaries:
    """m canaries spread over the schema's public box, all from the OS CSPRNG.

    * Numeric features uniform in the public range ``[lo, hi]``, categorical ones a uniform level: the
      canaries land in many different leaves of the random trees, so each one's membership moves its own
      combination of leaves (what the attack, :func:`canary_scores`, solves for).
    * Labels at an end of the label range (regression: ``lo`` or ``hi`` of ``label_range``; binary: 0 or 1),
      the end by a fair coin: the clipped gradient is then ±g* whatever the model predicts there, a worst-case
      record for the leaf's gradient sum (its sensitivity), and the canaries' signs cancel on average, so
      they do not bias the model for the real records.
    * The membership coins, one fair coin each, kept by the auditor.
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise AuditError(f"--canaries {m!r}: must be a positive integer")
    if schema.task not in ("regression", "binary"):
        raise AuditError(f"the audit supports regression and binary tasks, not {schema.task}")
    X = np.empty((m, schema.n_features))
    for j, f in enumerate(schema.features):
        u = _uniform01(m)
        if f.is_categorical:
            X[:, j] = np.minimum(np.floor(u * len(f.levels)), len(f.levels) - 1)
        else:
            X[:, j] = f.lo + (f.hi - f.lo) * u
    high = _fair_coins(m)
    if schema.task == "regression":
        lo, hi = schema.label_range
        y = np.where(high, float(hi), float(lo))
    else:
        y = high.astype(np.float64)
    return Canaries(X, y, _fair_coins(m))


# --------------------------------------------------------------------------- the attack


@dataclass(frozen=True)
class NoiseModel:
    """What the attack assumes about the released leaves: the *claimed* noise (the receipt's σ), the clips,
    λ, β, γ.  Real units (not fixed-point)."""

    sigma: float
    grad_clip: float
    hess_clip: float
    r1: float
    l2: float
    leaf_clip: float
    subsample: float

    @property
    def grad_std(self) -> float:
        return self.grad_clip * self.sigma / math.sqrt(2.0 * (1.0 - self.r1))

    @property
    def hess_std(self) -> float:
        return self.hess_clip * self.sigma / math.sqrt(2.0 * self.r1)

    @classmethod
    def for_model(cls, model) -> "NoiseModel":
        hp = model.hyperparameters
        return cls(float(model.privacy.get("sigma", 0.0)), hp.grad_clip, hp.hess_clip_for(model.task), hp.r1,
                   hp.l2, hp.leaf_clip, hp.subsample)


def canary_scores(model, data_X: np.ndarray, data_y: np.ndarray, canaries: Canaries,
                  cg_iterations: int = 300) -> np.ndarray:
    """Each canary's score: a weighted least-squares estimate of its membership (≈ 1 in, ≈ 0 out) from the
    released trees.  Uses only the model, the data and the canaries (never the coins).

    Replaying the released trees on every record (data and all m canaries) gives each record's clipped
    gradient g and Hessian h at every round.  A released leaf value v = clamp(ũ/(w̃ + λ), ±β), with
    ũ = Σ b·g + N_u and w̃ = Σ b·h + N_w over the leaf's records (b: in the round's Poisson subsample), is, when
    it is not clamped nor zeroed, the exact identity ``Σ_leaf b·(g − v·h) + N_u − v·N_w = v·λ``.  Taking
    E[b] = γ, canary c's unknown membership s_c enters linearly::

        γ · Σ_{canaries c in the leaf} s_c·(g_c − v·h_c)  ≈  v·λ − γ · Σ_{data in the leaf} (g − v·h)

    with error variance σ_u² + v²·σ_w² (the claimed noise) + γ(1−γ)·Σ (g − v·h)² (subsampling).  One such
    equation per leaf and tree; the scores solve them by weighted least squares (conjugate gradients, a
    small ridge towards ½).  Without noise and with γ = 1 the equations are exact, so a model with more
    leaves than canaries gives every membership away; with the real noise they are as noisy as the
    mechanism makes them.  Clamped leaves (|v| = β) and zeroed ones (v = 0, a negative noisy Hessian sum)
    are left out: the identity does not hold there.
    """
    from .boosting import LocalData
    from .splits import Splits

    hp = model.hyperparameters
    task = model.task
    if task not in ("regression", "binary"):
        raise AuditError(f"the audit supports regression and binary tasks, not {task}")
    noise = NoiseModel.for_model(model)
    n, m = int(data_X.shape[0]), canaries.m
    X = np.vstack([np.asarray(data_X, np.float64), canaries.X])
    y = np.concatenate([np.asarray(data_y, np.float64), canaries.y])
    label_range = model.schema.label_range if task == "regression" else None
    local = LocalData(X, y, np.arange(n + m, dtype=np.int64), task, hp, label_range,
                      is_categorical=model.is_categorical())
    local.set_init_score(model.init_score)
    gamma, L = noise.subsample, hp.leaves
    rows, cols, vals, targets, variances = [], [], [], [], []
    row0 = 0
    floor = (2.0 ** -hp.scale_bits) ** 2 * (n + m)  # fixed-point rounding: keeps exact equations finite
    for tree in model.trees:
        splits = Splits(tree.features, tree.thresholds, tree.default_left)
        leaf = local.leaf_index(splits)
        gq, hq = local.grad_hess_units()
        g = gq / local.enc.grad.scale
        h = hq / local.enc.hess.scale
        v_leaf = np.asarray(tree.leaves, np.float64)
        v = v_leaf[leaf]
        e = g - v * h  # every record's g − v·h in its leaf of this tree
        usable = (v_leaf != 0.0) & (np.abs(v_leaf) < noise.leaf_clip * (1 - 1e-12))
        d_leaf, c_leaf = leaf[:n], leaf[n:]
        data_sum = np.bincount(d_leaf, weights=e[:n], minlength=L)
        data_sq = np.bincount(d_leaf, weights=e[:n] ** 2, minlength=L)
        can_sq = np.bincount(c_leaf, weights=e[n:] ** 2, minlength=L)
        index = np.full(L, -1, np.int64)
        index[usable] = row0 + np.arange(int(usable.sum()))
        targets.append((v_leaf * noise.l2 - gamma * data_sum)[usable])
        variances.append((noise.grad_std ** 2 + v_leaf ** 2 * noise.hess_std ** 2
                          + gamma * (1 - gamma) * (data_sq + 0.5 * can_sq) + floor)[usable])
        keep = index[c_leaf] >= 0
        rows.append(index[c_leaf][keep])
        cols.append(np.flatnonzero(keep))
        vals.append(gamma * e[n:][keep])
        row0 += int(usable.sum())
        local.apply(leaf, v_leaf)
    if row0 == 0:
        return np.full(m, 0.5)
    return _weighted_ridge(np.concatenate(rows), np.concatenate(cols), np.concatenate(vals),
                           np.concatenate(targets), 1.0 / np.concatenate(variances), m, cg_iterations)


def _weighted_ridge(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, b: np.ndarray, w: np.ndarray, m: int,
                    iterations: int) -> np.ndarray:
    """argmin_s Σ_rows w·(A s − b)² + ρ·|s − ½|² for the sparse A = (rows, cols, vals), by Jacobi-preconditioned
    conjugate gradients on the normal equations; ρ = 1e-6 of the mean diagonal of AᵀWA."""
    n_rows = b.size

    def A(s: np.ndarray) -> np.ndarray:
        return np.bincount(rows, weights=vals * s[cols], minlength=n_rows)

    def At(z: np.ndarray) -> np.ndarray:
        return np.bincount(cols, weights=vals * z[rows], minlength=m)

    diag = np.bincount(cols, weights=w[rows] * vals ** 2, minlength=m)
    rho = 1e-6 * max(float(diag.mean()), 1e-300)
    diag = diag + rho
    s0 = np.full(m, 0.5)
    rhs = At(w * (b - A(s0)))  # solve for x = s − ½
    x = np.zeros(m)
    res = rhs.copy()
    z = res / diag
    p = z.copy()
    rz = float(res @ z)
    tol = 1e-20 * max(float(rhs @ rhs), 1e-300)
    for _ in range(iterations):
        if float(res @ res) <= tol:
            break
        q = At(w * A(p)) + rho * p
        a = rz / float(p @ q)
        x += a * p
        res -= a * q
        z = res / diag
        rz_new = float(res @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return s0 + x


# --------------------------------------------------------------------------- one audit


@dataclass(frozen=True)
class AuditResult:
    """What ``fedsbdt audit`` prints (and what a model file may carry under ``audit``)."""

    epsilon_claimed: float  # the receipt's ε
    delta: float
    epsilon_lower: float  # the audit's ε_lower at confidence 1 − β
    confidence: float  # 1 − β
    canaries: int  # m
    included: int  # canaries whose coin said "in"
    guesses: int  # r of the best choice
    correct: int  # v of the best choice
    k_plus: int
    k_minus: int
    guess_counts: tuple[int, ...]  # every r tried (each at β/len)
    max_auditable: float  # ε_lower of a perfect attack with these m, δ, β
    mode: str = "central"  # central, or federated with the canaries at one site
    sites: int = 1
    trees: int = 0
    rows: int = 0  # real records (canaries not counted)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.confidence < 1:
            raise AuditError(f"confidence {self.confidence!r}: must be in (0, 1)")
        if self.epsilon_lower < 0 or not 0 <= self.correct <= self.guesses <= self.canaries:
            raise AuditError("inconsistent audit result")

    @property
    def below_claim(self) -> bool:
        return self.epsilon_lower <= self.epsilon_claimed

    def to_dict(self) -> dict:
        return {"epsilon_claimed": self.epsilon_claimed, "delta": self.delta, "epsilon_lower": self.epsilon_lower,
                "confidence": self.confidence, "canaries": self.canaries, "included": self.included,
                "guesses": self.guesses, "correct": self.correct, "k_plus": self.k_plus, "k_minus": self.k_minus,
                "guess_counts": list(self.guess_counts), "max_auditable": self.max_auditable, "mode": self.mode,
                "sites": self.sites, "trees": self.trees, "rows": self.rows, "seconds": self.seconds,
                "below_claim": self.below_claim, **self.extra}


def result_from_scores(scores: np.ndarray, canaries: Canaries, epsilon_claimed: float, delta: float,
                       confidence: float, **info) -> AuditResult:
    """The audit's verdict from the canaries' scores and the auditor's coins."""
    beta = 1.0 - confidence
    best, _ = audit_guesses(scores, canaries.coins, delta, beta)
    counts = guess_counts(canaries.m)
    return AuditResult(float(epsilon_claimed), float(delta), best.epsilon_lower, float(confidence), canaries.m,
                       int(canaries.coins.sum()), best.r, best.correct, best.k_plus, best.k_minus, counts,
                       max_auditable_epsilon(canaries.m, delta, beta / len(counts)), **info)


class ScaledNoise:
    """TEST-ONLY: a randomness source whose leaf noise (discrete Gaussian) is multiplied by ``factor``
    (0: none).  It exists to show the audit's power (a run with shrunk noise must give ε_lower > ε) and is
    reachable only through :func:`run_central_audit`'s keyword ``_noise_factor``; no command line flag,
    plan key or environment variable sets it."""

    def __init__(self, inner, factor: float) -> None:
        if not 0 <= factor <= 1:
            raise AuditError("the test-only noise factor must be in [0, 1]")
        self._inner, self._factor = inner, float(factor)

    def discrete_gaussian(self, scales: np.ndarray) -> np.ndarray:
        scales = np.asarray(scales, dtype=np.float64)
        if self._factor == 0:
            return np.zeros(scales.shape, dtype=np.int64)
        return self._inner.discrete_gaussian(scales * self._factor)

    def describe(self) -> str:
        return f"TEST ONLY: leaf noise × {self._factor:g} ({self._inner.describe()})"

    def __getattr__(self, name):
        return getattr(self._inner, name)


def with_canaries(dataset, canaries: Canaries):
    """The training data: every record of ``dataset`` plus the canaries whose coin says "in" (new ids)."""
    from .data import Dataset

    inside = canaries.coins
    start = int(dataset.ids.max()) + 1 if dataset.n else 0
    ids = np.concatenate([dataset.ids, start + np.flatnonzero(inside)]).astype(np.int64)
    X = np.vstack([dataset.X, canaries.X[inside]])
    y = np.concatenate([dataset.y, canaries.y[inside]])
    arrival = None if dataset.arrival is None else np.concatenate(
        [dataset.arrival, np.zeros(int(inside.sum()), np.int64)])
    return Dataset(X, y, ids, dataset.schema, dataset.source, dataset.dropped, arrival)


def audit_hyperparameters(hp):
    """The audit trains with the given hyperparameters and a public split seed of its own (drawn from the OS
    CSPRNG when none is given); only random trees (S-BDT) are audited."""
    import secrets

    if not modes.training_mode(hp).auditable:
        raise AuditError(f"the audit supports {auditable_builders()}, not tree_builder = {hp.tree_builder!r}")
    return hp if hp.seed is not None else hp.replace(seed=secrets.randbits(63))


def check_audit_inputs(dataset, confidence: float) -> None:
    """What every audit run refuses before training (one line each, :class:`AuditError`)."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise AuditError(f"--confidence {confidence!r}: must be in (0, 1)")
    if dataset.schema.task not in ("regression", "binary"):
        raise AuditError(f"the audit supports regression and binary tasks, not {dataset.schema.task}")


def run_central_audit(dataset, hp, canaries: int = 1000, confidence: float = 0.95, randomness=None, progress=None,
                      *, _noise_factor: float = 1.0) -> tuple[AuditResult, object]:
    """Draw canaries, train centrally (:func:`fedsbdt.common.engine.train`) on the data plus the canaries whose
    coin says "in", score them from the released model and return the verdict and the model.

    ``_noise_factor`` is TEST-ONLY (the negative control and the planted noise-losing bug of the tests and
    ``benchmarks/audit.py``): the leaf noise is multiplied by it; the model's receipt still states the
    claimed ε.  The command line never sets it."""
    import time

    from .engine import train
    from .randomness import SecureRandomness

    check_audit_inputs(dataset, confidence)
    hp = audit_hyperparameters(hp)
    t0 = time.perf_counter()
    can = draw_canaries(dataset.schema, canaries)
    randomness = randomness or SecureRandomness()
    if _noise_factor != 1.0:
        randomness = ScaledNoise(randomness, _noise_factor)
    res = train(with_canaries(dataset, can), hp, randomness, progress=progress)
    model = res.model
    scores = canary_scores(model, dataset.X, dataset.y, can)
    result = result_from_scores(scores, can, model.privacy["epsilon"], model.privacy["delta"], confidence,
                                trees=len(model.trees), rows=dataset.n, seconds=round(time.perf_counter() - t0, 3))
    return result, model


# --------------------------------------------------------------------------- the reconstruction benchmark

def check_reconstruction(d) -> dict:
    """The reconstruction benchmark's results (benchmarks/results/reconstruction.json), validated: a summary of
    shares in [0, 1] for each arm present (one-line :class:`AuditError` otherwise)."""
    summary = d.get("summary") if isinstance(d, dict) else None
    if not isinstance(summary, dict) or not summary:
        raise AuditError("not a reconstruction benchmark result (no 'summary'; benchmarks/reconstruction.py writes "
                         "one)")
    for arm, v in summary.items():
        for metric in ("records", "features"):
            x = (v.get(metric) or {}).get("mean") if isinstance(v, dict) else None
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1:
                raise AuditError(f"reconstruction result: {arm}.{metric}.mean must be a share in [0, 1], got {x!r}")
    return d
