"""Private hyperparameter tuning (``fedsbdt tune``; docs/auto.md "Private tuning").

Papernot & Steinke, "Hyperparameter Tuning with Rényi Differential Privacy" (ICLR 2022).  One *trial* Q
draws a setting uniformly from a public candidate list centred on ``auto`` (public randomness), trains
S-BDT on the training part of the records and computes a DP score of the model on the held-out part.  The
number of trials K is random, truncated negative binomial with shape η = 1 (the geometric distribution
on {1, 2, …}, mean μ = 1/γ); the output is the trial with the highest noisy score.

**What is released.**  Theorem 2 bounds the output of repeat-and-select — the best trial — with K *hidden*:
it says nothing about K, the other trials, their scores or the winner's position among them (a trial
mechanism meeting the same hypothesis can leak far more once they are released).  So :func:`run_tuning`
returns the winning model and its settings only (:class:`TuningResult`), reports no progress (a count of
finished trials is K) and no timing (the run's duration grows with K); what the receipt states besides
is public by construction: the distribution of K and its parameters, the candidate space, the per-trial
budget and score noise the accountant fixed before any data was read.

**Privacy of one trial.**  A record belongs to the held-out part iff a keyed hash of its own stable id says
so (:func:`holdout_mask`; the key is a fresh secret of the run, drawn from the OS CSPRNG before the data is
read and never released), so adding or removing it changes either the training run or the score, never
both, and moves no other record: for every key, Q is (λ, max(ρ_train(λ), ρ_score(λ)))-RDP.  Over the
candidate list Q is a mixture, whose Rényi divergence is at most the largest one (joint quasi-convexity):
ρ_Q(λ) = max_c max(ρ_train,c(λ), ρ_score(λ)).  The bound holds for each key, hence for the run.

**Theorem 2 (P&S 2022).**  If Q is (λ, ε)-RDP and (λ̂, ε̂)-RDP and K ~ D_{η,γ}, repeat-and-select is
(λ, ε')-RDP with ``ε' = ε + (1+η)(1 − 1/λ̂) ε̂ + (1+η) log(1/γ)/λ̂ + log(E[K])/(λ−1)``; we take the best λ̂
of the order grid (:func:`tuning_rdp`) and convert with the accountant's Cor. 6 (:func:`tuning_epsilon`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .accountant import alpha_grid, rdp_to_dp

#: the truncated negative binomial's shape: η = 1 is the geometric distribution, sampled exactly
SHAPE = 1.0


# --------------------------------------------------------------------------- the trial distribution (pure)


def tnb_mean(gamma: float, eta: float = SHAPE) -> float:
    """E[K] of the truncated negative binomial D_{η,γ} (P&S Def. 1): ``η(1−γ)/(γ(1−γ^η))``; η = 0: the
    logarithmic distribution ``(1/γ − 1)/log(1/γ)``."""
    if not 0 < gamma < 1:
        raise ValueError(f"γ must be in (0, 1), got {gamma}")
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def tuning_rdp(orders: np.ndarray, rdp: np.ndarray, gamma: float, eta: float = SHAPE) -> np.ndarray:
    """P&S Thm. 2 at every order λ > 1 of ``orders`` for a trial with RDP curve ``rdp`` (minimised over λ̂ in
    ``orders``), then monotonicity in λ (a lower order's RDP is at most a higher order's)."""
    lam = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    c = (1 + eta) * float(np.min((1 - 1 / lam) * rdp + math.log(1 / gamma) / lam))
    out = np.where(lam > 1, rdp + c + math.log(tnb_mean(gamma, eta)) / np.maximum(lam - 1, 1e-300), np.inf)
    return np.minimum.accumulate(out[::-1])[::-1]  # out[i] = min_{j ≥ i} out[j] (orders ascending)


def tuning_epsilon(orders: np.ndarray, rdp: np.ndarray, gamma: float, delta: float,
                   eta: float = SHAPE) -> tuple[float, int]:
    """(ε, λ) of repeat-and-select at δ: Thm. 2 then Cor. 6, minimised over the orders."""
    eps = rdp_to_dp(orders, tuning_rdp(orders, rdp, gamma, eta), delta)
    i = int(np.argmin(eps))
    return float(eps[i]), int(np.asarray(orders)[i])


# --------------------------------------------------------------------------- a trial's RDP (pure)


def score_rdp(orders: np.ndarray, sigma_score: float) -> np.ndarray:
    """The Gaussian score release: sensitivity 1 (one record's score lies in [0, 1]), ``λ/(2σ²)``."""
    return np.asarray(orders, dtype=np.float64) / (2 * sigma_score**2)


def trial_rdp(orders: np.ndarray, train_curves: list[np.ndarray], sigma_score: float) -> np.ndarray:
    """ρ_Q(λ) = max over candidates of max(ρ_train, ρ_score) (disjoint parts; mixture; module doc)."""
    return np.max(np.vstack([*train_curves, score_rdp(orders, sigma_score)]), axis=0)


def orders_for(epsilon: float, delta: float) -> np.ndarray:
    """Integer orders up to where Cor. 6's log(1/δ)/(λ−1) is well below ε (as the accountant does)."""
    from .accountant import default_alpha_max

    return alpha_grid(default_alpha_max(epsilon, delta))


# --------------------------------------------------------------------------- search space and split (pure)


def candidates(centre: dict) -> list[dict]:
    """The public search space around the ``auto`` setting ``centre``: itself and one-step neighbours in
    trees (×½, ×2), depth (±1), γ (×½, ×2), η (×½, ×2) and the cyclical flag."""
    t, d, g, eta, cyc = (centre[k] for k in ("trees", "depth", "subsample", "learning_rate", "cyclical"))
    out = [dict(centre)]
    for k, v in (("trees", max(5, t // 2)), ("trees", min(1000, 2 * t)), ("depth", max(2, d - 1)),
                 ("depth", min(8, d + 1)), ("subsample", round(g / 2, 4)), ("subsample", min(1.0, 2 * g)),
                 ("learning_rate", round(eta / 2, 4)), ("learning_rate", min(0.5, 2 * eta)), ("cyclical", not cyc)):
        c = {**centre, k: v}
        if c not in out:
            out.append(c)
    return out


#: one record in HOLDOUT_SHARE is held out (in expectation)
HOLDOUT_SHARE = 5
#: bytes of the split key (BLAKE2b keys are at most 64)
SPLIT_KEY_BYTES = 32


def fresh_split_key() -> bytes:
    """A fresh secret key for one tuning run's held-out split, from the OS CSPRNG (never released)."""
    import secrets

    return secrets.token_bytes(SPLIT_KEY_BYTES)


def holdout_mask(ids: np.ndarray, key: bytes, share: int = HOLDOUT_SHARE) -> np.ndarray:
    """Held-out records: ``BLAKE2b-64(key, id) mod share == 0`` — a function of the record's own stable id and
    the run's key only, so deleting or adding a record moves no other record between the parts (module doc).
    ``ids``: the records' stable ids (int64, :attr:`Dataset.ids` of a schema with an ``id_column``)."""
    import hashlib

    if not isinstance(key, bytes) or not 16 <= len(key) <= 64:
        raise ValueError("the split key must be 16–64 bytes (fresh_split_key)")
    ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64)).astype("<i8")
    raw = ids.tobytes()
    digests = b"".join(hashlib.blake2b(raw[i:i + 8], digest_size=8, key=key).digest()
                       for i in range(0, len(raw), 8))
    return np.frombuffer(digests, dtype="<u8") % np.uint64(share) == 0


def record_scores(task: str, y: np.ndarray, pred: np.ndarray, label_range=None) -> np.ndarray:
    """Each held-out record's score in [0, 1] (higher is better): 1 − Brier (binary, multi-class: half the
    squared distance of the probability vector to the one-hot label), 1 − min(((ŷ−y)/(hi−lo))², 1)."""
    if task == "binary":
        return 1 - (np.asarray(pred, float) - y) ** 2
    if task == "multiclass":
        onehot = np.eye(pred.shape[1])[np.asarray(y, int)]
        return 1 - 0.5 * np.sum((pred - onehot) ** 2, axis=1)
    lo, hi = label_range
    return 1 - np.minimum(((np.asarray(pred, float) - y) / (hi - lo)) ** 2, 1.0)


@dataclass(frozen=True)
class TuningPlan:
    """What the accountant fixed for a tuning run: per-trial ε (each candidate's training target), the score
    noise, the trial distribution and the total (ε, δ) of repeat-and-select."""

    epsilon_trial: float
    sigma_score: float
    mean_trials: int
    gamma: float
    epsilon: float  # total of repeat-and-select (without the auto row count)
    delta: float
    order: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# --------------------------------------------------------------------------- planning (the accountant's side)


def _train_curve(hp, orders: np.ndarray) -> tuple[np.ndarray, int]:
    """ρ_train(λ) of one candidate at its calibrated noise, and the order its calibration used."""
    from .accountant import init_score_rdp, tree_rdp
    from .engine import calibration_for

    cal = calibration_for(hp)
    rho = hp.accounted_rounds * tree_rdp(cal.gamma, cal.sigma, orders) + init_score_rdp(orders, cal.eps_init,
                                                                                        cal.eps_ds)
    return rho, cal.alpha


def plan_tuning(settings: list[dict], epsilon: float, delta: float, mean_trials: int,
                rel_tol: float = 0.01) -> TuningPlan:
    """The largest per-trial ε (to ``rel_tol``) whose repeat-and-select total is ≤ ``epsilon``.

    Raises :class:`~fedsbdt.common.accountant.AccountingError` if no trial fits (the budget is too small
    for one trial)."""
    from .accountant import AccountingError
    from .config import Hyperparameters

    if not (isinstance(mean_trials, int) and mean_trials >= 2):
        raise AccountingError(f"the mean number of trials must be an integer ≥ 2, got {mean_trials}")
    gamma = 1.0 / mean_trials
    orders = orders_for(epsilon, delta)

    def total(eps_t: float) -> TuningPlan:
        curves = [_train_curve(Hyperparameters.from_dict({**s, "epsilon": eps_t, "delta": delta}), orders)
                  for s in settings]
        rho0, a0 = curves[0]
        i0 = int(np.searchsorted(orders, a0))
        i0 = min(i0, len(orders) - 1)
        sigma_score = math.sqrt(orders[i0] / (2 * max(rho0[i0], 1e-300)))  # the score as costly as the centre
        eps, order = tuning_epsilon(orders, trial_rdp(orders, [c for c, _ in curves], sigma_score), gamma, delta)
        return TuningPlan(eps_t, sigma_score, mean_trials, gamma, eps, delta, order)

    too_small = (f"ε = {epsilon:g} is too small for private tuning: no per-trial budget fits once the random number "
                 f"of trials (mean {mean_trials}) is accounted (Papernot & Steinke Thm. 2); use fedsbdt train, or raise ε")
    return total(largest_fitting(lambda e: total(e).epsilon, epsilon, too_small, rel_tol))


def largest_fitting(total_of, budget: float, too_small: str, rel_tol: float = 1e-3) -> float:
    """The largest per-trial budget x ≤ ``budget`` (to ``rel_tol``, bisection after halving from budget/2) whose
    total ``total_of(x)`` is ≤ ``budget``; ``total_of`` may raise ValueError (AccountingError, ConfigError) where x
    cannot be calibrated (it does not fit).  Raises AccountingError(``too_small``) if nothing down to budget·10⁻⁴
    fits."""
    from .accountant import AccountingError

    def fits(x: float) -> bool:
        try:
            return total_of(x) <= budget
        except ValueError:
            return False

    hi, lo = budget, budget / 2
    while not fits(lo):
        if lo < budget * 1e-4:
            raise AccountingError(too_small)
        hi, lo = lo, lo / 2
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# --------------------------------------------------------------------------- the run (side effects: training, noise)


def sample_trials(mean_trials: int, randbelow=None) -> int:
    """K ~ geometric on {1, 2, …} with mean ``mean_trials`` (TNB with η = 1, γ = 1/mean), exactly: each
    further trial with probability exactly (mean − 1)/mean from the OS CSPRNG."""
    import secrets

    randbelow = randbelow or secrets.randbelow
    k = 1
    while randbelow(mean_trials) != 0:
        k += 1
    return k


@dataclass(frozen=True)
class TuningResult:
    """What repeat-and-select releases: the best trial's model and its settings.  Never K, the other trials,
    any score or the winner's position (module doc, "What is released")."""

    model: object
    settings: dict
    plan: TuningPlan


def run_tuning(train_ds, holdout_ds, settings: list[dict], plan: TuningPlan, randomness,
               randbelow=None) -> TuningResult:
    """Run K ~ D_{1,γ} trials (each: a uniform candidate, trained on ``train_ds``, scored on ``holdout_ds`` with
    discrete Gaussian noise σ_score on the fixed-point score sum) and return the best one — only the best one."""
    import secrets

    from .auto import noise_matched_l2
    from .config import Hyperparameters
    from .engine import train

    randbelow = randbelow or secrets.randbelow
    k = sample_trials(plan.mean_trials, randbelow)
    scale = 2**20
    best_score, best = None, None
    for _ in range(k):
        c = settings[randbelow(len(settings))]
        hp = Hyperparameters.from_dict({**c, "epsilon": plan.epsilon_trial, "delta": plan.delta})
        if "l2" not in c:  # λ matched to the trial's leaf noise, as auto does (costs no privacy)
            hp = hp.replace(l2=noise_matched_l2(hp, train_ds.schema.task))
        res = train(train_ds, hp, randomness)
        pred = res.model.predict(holdout_ds.X)
        s = record_scores(train_ds.schema.task, holdout_ds.y, pred, train_ds.schema.label_range)
        units = int(np.floor(np.clip(s, 0.0, 1.0) * scale).astype(np.int64).sum())
        noisy = units + int(randomness.discrete_gaussian(np.array([plan.sigma_score * scale]))[0])
        if best_score is None or noisy > best_score:
            best_score, best = noisy, TuningResult(res.model, dict(c), plan)
    return best


def tune_on(ds, centre: dict, plan: TuningPlan, randomness, key: bytes) -> tuple[TuningResult, list]:
    """Split ``ds`` by :func:`holdout_mask` under the run's secret ``key`` and run the trials over the candidates
    around ``centre``; returns the result and the candidate list.  ``ds.ids`` must be stable record ids (the
    schema's ``id_column``; ``fedsbdt tune`` refuses a schema without one), never row numbers."""
    space = candidates(centre)
    mask = holdout_mask(ds.ids, key)
    return run_tuning(ds.subset(~mask), ds.subset(mask), space, plan, randomness), space
