"""Private hyperparameter tuning (``fedsbdt tune``; docs/auto.md "Private tuning").

``tune`` is ``auto`` plus a short, budget-gated check of the rule's least certain choices.  It must never be
worse than ``auto`` in expectation, so it spends little on the check and most of ε on the released model:

* **Fallback** (``ε·n/K < 10^``:data:`MIN_BUDGET_LOG10`): the budget cannot pay for a check (on the suite,
  splitting ε and holding records out cost more than any setting gained there), so ``tune`` trains ``auto``'s
  own setting on every record with all of ε — exactly what ``fedsbdt train`` does — and says so.
* **Search**: a public short list (:func:`shortlist`): ``auto``'s own setting first (always a candidate),
  then the cyclical flip and, on all-numeric schemas, the deep non-cyclical setting.  Each candidate is a
  *probe*: trained on the training part with a small per-probe budget ε_p = :data:`PROBE_SHARE`·ε and scored
  on the held-out part with Gaussian noise σ_s.  The centre wins unless an alternative's noisy score beats
  it by :data:`SWITCH_MARGIN` noise standard deviations (:func:`pick`); the winner's setting is then trained
  on **every** record with the largest ε_f that keeps the total ≤ ε (about 0.9·ε), and only that final
  model and its setting are released.

**Privacy (RDP composition, not Papernot & Steinke).**  The list and its length m are public (fixed from ε,
δ, the schema and the public or DP row count before any record is read), so the probes compose.  A record
belongs to the held-out part iff a keyed hash of its own stable id says so (:func:`holdout_mask`; the key is
a fresh secret of the run, never released), so adding or removing it changes either every probe's training
run or every probe's score, never both, and moves no other record; the final training uses every record.
By sequential composition (Mironov 2017, Prop. 1; adaptive choices included) and this disjointness, for
every key the whole run is (λ, ρ(λ))-RDP with

    ρ(λ) = max( Σ_{i=1..m} ρ_train,i(λ),  m·λ/(2σ_s²) ) + max_c ρ_final,c(λ)          (eq. T1)

(ρ_train,i: probe i's training curve at ε_p; λ/(2σ_s²): a Gaussian score sum of sensitivity 1; ρ_final,c:
candidate c's training curve at ε_f, maximised over the candidates since the winner is data-dependent), and
(ε, δ)-DP by the accountant's Cor. 6 minimised over λ (:func:`search_epsilon`).  The selection and the
release of the winner are post-processing.  In the fallback ρ(λ) is the one training run's own curve.
Compared with Papernot & Steinke's random search (Thm. 2, the earlier ``tune``), three composed trials cost
about as much as a geometric number with mean 4 (per-trial ε 0.55·ε against 0.58·ε at ε = 1), and a fixed
list always contains the centre.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .accountant import alpha_grid, rdp_to_dp

#: below this b = log10(ε·n/K) (the auto rule's budget signal) tune is auto: on the suite a check never paid
#: for itself there (benchmarks/tune_gate.py, results/tune_vs_auto_v2.json; docs/auto.md "Private tuning")
MIN_BUDGET_LOG10 = 3.0
#: each probe's training target ε as a share of the tuning budget (the final model gets about 0.9·ε with 3)
PROBE_SHARE = 0.2
#: an alternative replaces auto's setting only if its noisy score beats the centre's by this many standard
#: deviations of the difference of two noisy scores (σ_s·√2): auto is the favourite, a tie of the noise is not
#: evidence against it
SWITCH_MARGIN = 1.0


# --------------------------------------------------------------------------- the accounting (pure)


def score_rdp(orders: np.ndarray, sigma_score: float) -> np.ndarray:
    """The Gaussian score release: sensitivity 1 (one record's score lies in [0, 1]), ``λ/(2σ²)``."""
    return np.asarray(orders, dtype=np.float64) / (2 * sigma_score**2)


def search_rdp(orders: np.ndarray, probe_curves: list[np.ndarray], sigma_score: float,
               final_curves: list[np.ndarray]) -> np.ndarray:
    """Eq. T1 (module doc): ``max(Σ_i ρ_train,i(λ), m·λ/(2σ_s²)) + max_c ρ_final,c(λ)`` at every order —
    the m probes (a record is in the training part or the held-out part, never both) composed with the final
    training on every record.  No probes (the fallback): the final curve alone."""
    final = np.max(np.vstack(final_curves), axis=0)
    if not probe_curves:
        return final
    m = len(probe_curves)
    probes = np.maximum(np.sum(np.vstack(probe_curves), axis=0), m * score_rdp(orders, sigma_score))
    return probes + final


def search_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, int]:
    """(ε, λ) at δ of an RDP curve: the accountant's Cor. 6 (:func:`~fedsbdt.common.accountant.rdp_to_dp`),
    minimised over the orders."""
    eps = rdp_to_dp(orders, rdp, delta)
    i = int(np.argmin(eps))
    return float(eps[i]), int(np.asarray(orders)[i])


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


#: the deep setting without cyclical trees that won on all-numeric data (benchmarks/auto_grid.py g21, g19)
DEEP = {"classification": dict(trees=1000, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False),
        "regression": dict(trees=500, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False)}


def shortlist(centre: dict, task: str, all_numeric: bool) -> list[dict]:
    """``tune``'s public candidates, ``centre`` (auto's own setting) first: then the choice that decides most
    where ``auto`` is unsure — the cyclical flag flipped (non-cyclical trees one level deeper, at most 6, as
    g18 is to g17 in the grid) — and on an all-numeric schema (where non-cyclical deep trees beat cyclical ones
    in 12 of 12 cells of an outside check) the deep non-cyclical setting :data:`DEEP`.  Trees, γ and η
    neighbours are left out: on the suite they rarely changed the score by more than the noise of a check."""
    flip = {**centre, "cyclical": not centre["cyclical"]}
    if centre["cyclical"]:
        flip["depth"] = max(centre["depth"], min(6, centre["depth"] + 1))
    out = [dict(centre), flip]
    if all_numeric:
        out.append({**centre, **DEEP["regression" if task == "regression" else "classification"]})
    unique: list[dict] = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique


def should_search(epsilon: float, rows: int, classes: int = 0) -> bool:
    """Whether ``tune`` checks candidates at all: ``b = log10(ε·n/K) ≥`` :data:`MIN_BUDGET_LOG10` (the auto
    rule's budget signal, :func:`~fedsbdt.common.auto.budget_signal`, of public or DP-counted inputs)."""
    from .auto import budget_signal

    return budget_signal(epsilon, rows, classes) >= MIN_BUDGET_LOG10


@dataclass(frozen=True)
class TuningPlan:
    """What the accountant fixed for a tuning run before any record is read: the probed candidates (centre
    first; only the centre: the fallback, no probe), each probe's ε target, the score noise, the final
    training's ε target and the total (ε, δ) of eq. T1 at its best order."""

    candidates: tuple[dict, ...]
    epsilon_probe: float  # 0 in the fallback
    sigma_score: float  # 0 in the fallback
    epsilon_final: float
    epsilon: float  # the whole tuning (without the DP row count)
    delta: float
    order: int
    switch_margin: float = SWITCH_MARGIN  # in σ_s·√2 (post-processing: any value is private)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("a tuning plan needs at least the centre")
        if not (0 < self.epsilon_final <= self.epsilon and 0 < self.delta < 1):
            raise ValueError(f"bad tuning plan: ε_final {self.epsilon_final}, ε {self.epsilon}, δ {self.delta}")
        if self.searches and not (self.epsilon_probe > 0 and self.sigma_score > 0):
            raise ValueError("a search needs a probe budget and score noise")
        if not (self.switch_margin >= 0 and math.isfinite(self.switch_margin)):
            raise ValueError(f"the switch margin must be finite and ≥ 0, got {self.switch_margin}")

    @property
    def searches(self) -> bool:
        return len(self.candidates) > 1

    def to_dict(self) -> dict:
        return {**self.__dict__, "candidates": [dict(c) for c in self.candidates]}


# --------------------------------------------------------------------------- planning (the accountant's side)


def _train_curve(hp, orders: np.ndarray) -> tuple[np.ndarray, int]:
    """ρ_train(λ) of one candidate at its calibrated noise, and the order its calibration used."""
    from .accountant import init_score_rdp, tree_rdp
    from .engine import calibration_for

    cal = calibration_for(hp)
    rho = hp.accounted_rounds * tree_rdp(cal.gamma, cal.sigma, orders) + init_score_rdp(orders, cal.eps_init,
                                                                                        cal.eps_ds)
    return rho, cal.alpha


def _hp(setting: dict, epsilon: float, delta: float):
    from .config import Hyperparameters

    return Hyperparameters.from_dict({**setting, "epsilon": epsilon, "delta": delta})


def plan_tuning(settings: list[dict], epsilon: float, delta: float, rel_tol: float = 1e-3) -> TuningPlan:
    """The plan for candidates ``settings`` (centre first) at total ``epsilon``: with one candidate, the
    fallback (the centre trained on every record at ``epsilon``, its own accounting); with m > 1, probes at
    ε_p = :data:`PROBE_SHARE`·ε, σ_s such that m score releases cost what the centre's probe costs at its
    calibration order, and the largest ε_f (to ``rel_tol``) whose eq. T1 total is ≤ ``epsilon``.

    Raises :class:`~fedsbdt.common.accountant.AccountingError` if no final budget fits."""
    from .engine import calibration_for

    settings = [dict(s) for s in settings]
    if len(settings) == 1:  # one training run: its calibration is the accounting (refuses what cannot be met)
        cal = calibration_for(_hp(settings[0], epsilon, delta))
        return TuningPlan(tuple(settings), 0.0, 0.0, float(epsilon), float(epsilon), float(delta), int(cal.alpha))
    orders = orders_for(epsilon, delta)
    eps_p = PROBE_SHARE * epsilon
    probes = [_train_curve(_hp(s, eps_p, delta), orders) for s in settings]
    rho0, a0 = probes[0]
    i0 = min(int(np.searchsorted(orders, a0)), len(orders) - 1)
    sigma_score = math.sqrt(orders[i0] / (2 * max(rho0[i0], 1e-300)))
    curves = [c for c, _ in probes]

    def total(eps_f: float) -> tuple[float, int]:
        finals = [_train_curve(_hp(s, eps_f, delta), orders)[0] for s in settings]
        return search_epsilon(orders, search_rdp(orders, curves, sigma_score, finals), delta)

    too_small = (f"ε = {epsilon:g} is too small for a search: the probes leave no final budget; use fedsbdt train, "
                 "or raise ε")
    eps_f = largest_fitting(lambda e: total(e)[0], epsilon, too_small, rel_tol)
    eps, order = total(eps_f)
    return TuningPlan(tuple(settings), eps_p, sigma_score, eps_f, eps, float(delta), order)


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


def plan_for(schema, epsilon: float, delta: float, rows: int, rows_source: str = "declared"):
    """``fedsbdt tune``'s plan from public inputs: the centre is auto's own setting at the whole budget and n
    (:func:`~fedsbdt.common.auto.resolve`, exactly what ``fedsbdt train`` picks, λ left to each training); the
    fallback below :data:`MIN_BUDGET_LOG10`, else :func:`shortlist`.  Returns (plan, auto's choice)."""
    from .auto import resolve

    keys, choice = resolve({"epsilon": epsilon, "delta": delta}, schema, rows, rows_source)
    centre = {k: keys[k] for k in choice.settings if k != "l2"}
    all_numeric = not any(f.is_categorical for f in schema.features)
    space = (shortlist(centre, schema.task, all_numeric) if should_search(epsilon, rows, schema.n_classes)
             else [centre])
    return plan_tuning(space, epsilon, delta), choice


# --------------------------------------------------------------------------- the run (side effects: training, noise)


@dataclass(frozen=True)
class TuningResult:
    """What ``tune`` releases: the final model and its setting.  Never the probes, their scores or which
    position won (module doc)."""

    model: object
    settings: dict
    plan: TuningPlan


def _hyperparameters(setting: dict, epsilon: float, delta: float, task: str):
    """A candidate at a training target, λ matched to its leaf noise as auto does (costs no privacy)."""
    from .auto import noise_matched_l2

    hp = _hp(setting, epsilon, delta)
    return hp if "l2" in setting else hp.replace(l2=noise_matched_l2(hp, task))


def noisy_score(task: str, y: np.ndarray, pred: np.ndarray, label_range, sigma_score: float, randomness) -> int:
    """A probe's released score: Σ record scores on the held-out part in fixed point (2^20 units per record),
    plus discrete Gaussian noise of σ_s·2^20 units (sensitivity one record = 2^20 units)."""
    scale = 2**20
    s = record_scores(task, y, pred, label_range)
    units = int(np.floor(np.clip(s, 0.0, 1.0) * scale).astype(np.int64).sum())
    return units + int(randomness.discrete_gaussian(np.array([sigma_score * scale]))[0])


def pick(scores: list[int], sigma_score: float, margin: float = SWITCH_MARGIN) -> int:
    """The index of the released setting from the probes' noisy scores (fixed-point units, centre first): the
    best alternative if it beats the centre's score by more than ``margin``·σ_s·√2·2^20 (the noise std of a
    difference of two scores), else 0, the centre.  Post-processing of the noisy scores."""
    best = max(range(1, len(scores)), key=lambda i: scores[i], default=0)
    return best if best and scores[best] - scores[0] > margin * sigma_score * math.sqrt(2) * 2**20 else 0


def run_tuning(ds, holdout: np.ndarray, plan: TuningPlan, randomness) -> TuningResult:
    """Probe every candidate of ``plan`` (trained on ``ds`` without ``holdout``, scored on ``holdout``), pick by
    :func:`pick` (the centre unless an alternative beats it clearly), train it on every record of ``ds`` at ε_f
    and return that model only.  The fallback (one candidate) trains the centre on every record at ε and
    probes nothing."""
    from .engine import train

    task, label_range = ds.schema.task, ds.schema.label_range
    winner = plan.candidates[0]
    if plan.searches:
        train_ds, held = ds.subset(~holdout), ds.subset(holdout)
        scores = []
        for c in plan.candidates:
            probe = train(train_ds, _hyperparameters(c, plan.epsilon_probe, plan.delta, task), randomness)
            scores.append(noisy_score(task, held.y, probe.model.predict(held.X), label_range, plan.sigma_score,
                                      randomness))
        winner = plan.candidates[pick(scores, plan.sigma_score, plan.switch_margin)]
    res = train(ds, _hyperparameters(winner, plan.epsilon_final, plan.delta, task), randomness)
    return TuningResult(res.model, dict(winner), plan)


def tune_on(ds, plan: TuningPlan, randomness, key: bytes) -> TuningResult:
    """Split ``ds`` by :func:`holdout_mask` under the run's secret ``key`` and run :func:`run_tuning`.  ``ds.ids``
    must be stable record ids (the schema's ``id_column``; ``fedsbdt tune`` refuses a schema without one)."""
    return run_tuning(ds, holdout_mask(ds.ids, key), plan, randomness)
