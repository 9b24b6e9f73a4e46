"""Sarus DP-XGBoost (Grislain & Gonzalvez 2021): its mechanisms as pure functions (docs/sarus.md).

One tree runs on a Poisson subsample of rate γ and releases, with a per-tree budget ε_t split as the
paper does (§4.4: ε_sketch = ε_t/3, ε_select = ε_t/(3·depth) per level, ε_leaf = ε_t/3):

1. **Sketch** (§4.1): per numeric feature an equal-width histogram of the Hessian weight (unit weights:
   the paper's squared loss has h ≡ 1) with discrete Laplace noise ``Lap(m/ε_sketch)`` per bin — one record
   adds 1 to one bin of each of the m histograms, L1 sensitivity m.  The weighted quantile sketch of the
   noisy histogram (post-processing) gives the split candidates.
2. **Selection** (§4.2): per level, per node, a noisy record count ``n + Lap(1/ε_count)`` decides whether
   the node may split (:func:`may_split`), then the exponential mechanism over *every* (feature, candidate)
   pair (:func:`split_utilities`), ``P ∝ exp(ε·u/(2Δu))`` with ``Δu = 3·g*²``; the level's ε_t/(3·depth) is
   shared equally by the two (``ε_count = ε_select``).
3. **Leaves** (§4.3): ``V = G/(h·max(n, N) + λ) + Lap(Δ_V/ε_leaf)`` with N = ``min_child_weight`` and G the
   sum of the (clipped) *negative* gradients (:func:`leaf_sensitivity`).

Every record's Hessian is taken as the constant h = h* (the task's Hessian bound): the paper's squared
loss has h ≡ 1, which regression keeps exactly; a binary task (logistic loss, h ≤ 1/4) takes h = 1/4, a
conservative Newton step (``h·n ≥ Σh``).  Real Hessians in the denominator would make the sensitivity
unbounded ("Revisiting…" Appendix B.1); a constant keeps every bound below.

The two flaws "Revisiting DP-XGBoost" (Appendix B.2) found, and how they are fixed here:

* The original ran the exponential mechanism on the best split of every feature, gathered
  non-privately.  Here it runs once over all (feature, candidate) pairs of the node.
* The original compared the exact Hessian sum of a child with ``min_child_weight``.  Here nothing
  compares an exact sum with N: a node splits only if its *noisy* count reaches 2N (a Laplace release
  charged to the ledger), a candidate whose child falls below N loses utility through the clamp
  ``max(n, N)`` in the gain (inside the exponential mechanism), and the same clamp in the leaf denominator
  makes the leaf sensitivity hold for *every* dataset (proofs in the docstrings) — privacy never rests on
  a leaf really holding N records.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedsbdt.common.accountant import (DEFAULT_ALPHA_MAX, AccountingError, ComposedEvent, ExponentialEvent, LaplaceEvent,
                         PoissonSampledEvent, PrivacyCalibration, compose, event_epsilon_rdp, init_score_events,
                         subsampled_pure_epsilon)

#: the paper's per-tree split: sketch and leaves a third each, node selection a third over the levels
SKETCH_SHARE = LEAF_SHARE = SELECT_SHARE = 1.0 / 3.0
ACCOUNTANTS = ("rdp", "pure")


# --------------------------------------------------------------------------- sensitivities


def score_sensitivity(grad_clip: float, weight: float = 1.0) -> float:
    """Δu of the clamped gain: ``3·g*²/h`` (Li et al. 2020, Lemma 2; Sarus eq. 5 for h = 1).

    With every record's Hessian taken as the constant h (:func:`clamped_score`),
    ``G²/(h·max(n,N) + λ) = (1/h)·G²/(max(n,N) + λ/h)``: the h = 1 bound below with λ/h, divided by h.

    A record sits in one child of one node, so it changes one term ``t(n, G) = G²/(max(n, N) + λ)`` of
    each utility.  Adding it (n → n + 1, G → G + g, ``|G| ≤ n·g*``, ``|g| ≤ g*``):
    if n ≥ N the denominators are n + λ and n + 1 + λ and the change is
    ``|2Gg(n+λ) + g²(n+λ) − G²| / ((n+λ)(n+1+λ)) < 3·g*²`` (Lemma 2);
    if n + 1 ≤ N both are N + λ and the change is ``|2Gg + g²|/(N+λ) ≤ (2n+1)·g*²/(N+λ) < 2·g*²``."""
    return 3.0 * float(grad_clip) ** 2 / float(weight)


def leaf_sensitivity(grad_clip: float, min_child_weight: int, l2: float, weight: float = 1.0) -> float:
    """Δ_V of ``V = G/(h·max(n, N) + λ)`` for add/remove of one record (|g| ≤ g*), for *every* n ≥ 0.

    ``G/(h·max(n,N) + λ) = (1/h)·G/(max(n,N) + λ/h)``, so Δ_V is the h = 1 value at λ/h, divided by h;
    for h = 1:

    With n → n + 1, G → G + g:
    * n + 1 ≤ N: both denominators are N + λ, so ``|ΔV| = |g|/(N+λ) ≤ g*/(N+λ)``, which is at most the
      next case's value at n = N (``2N+λ ≥ N+1+λ`` when N ≥ 1);
    * n ≥ N: ``|ΔV| = |G − g(n+λ)| / ((n+λ)(n+1+λ)) ≤ g*(2n+λ)/((n+λ)(n+1+λ))`` (Sarus eq. 6), which is
      non-increasing over integers n ≥ 0 (its derivative in n has the sign of ``λ − 2n(n+λ)``, and n = 0
      and n = 1 give the same value), so its maximum over n ≥ N is at n = N.

    ``Δ_V = g*·(2N+λ)/((N+λ)(N+1+λ))`` (attained at n = N, G = N·g*, g = −g*) — never above the paper's
    ``2g*/(N+1+λ)`` (eq. 7) when N + λ ≥ 1.  No dataset needs n ≥ N: the clamp makes the bound
    unconditional, so no child weight is ever compared with N."""
    N, h, g = int(min_child_weight), float(weight), float(grad_clip)
    if not h > 0:
        raise AccountingError("the unit Hessian weight h must be > 0")
    lam = float(l2) / h
    if N < 0 or lam < 0 or N + lam <= 0:
        raise AccountingError("the leaf sensitivity needs min_child_weight ≥ 0, λ ≥ 0 and min_child_weight + λ > 0")
    return g * (2 * N + lam) / ((N + lam) * (N + 1 + lam)) / h


# --------------------------------------------------------------------------- utilities and values


def clamped_score(G: np.ndarray, n: np.ndarray, min_child_weight: int, l2: float, weight: float = 1.0) -> np.ndarray:
    """``G²/(h·max(n, N) + λ)`` — one side's term of the gain (Sarus eq. 3) with the child count clamped at N
    and every record's Hessian the constant h (the paper's squared loss: h = 1)."""
    d = weight * np.maximum(np.asarray(n, np.float64), float(min_child_weight)) + l2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, np.asarray(G, np.float64) ** 2 / d, 0.0)


def split_utilities(G_left: np.ndarray, n_left: np.ndarray, G: float, n: float, min_child_weight: int,
                    l2: float, weight: float = 1.0) -> np.ndarray:
    """The exponential mechanism's utility of every candidate split of one node (Sarus eq. 3 with the clamp):
    ``G_L²/(max(n_L,N)+λ) + G_R²/(max(n_R,N)+λ)``.  A child below N counts as if it held N records, so a
    split that isolates a few records scores low — XGBoost's ``min_child_weight`` check, inside the
    mechanism.  Sensitivity: :func:`score_sensitivity`."""
    G_left, n_left = np.asarray(G_left, np.float64), np.asarray(n_left, np.float64)
    return clamped_score(G_left, n_left, min_child_weight, l2, weight) + \
        clamped_score(G - G_left, n - n_left, min_child_weight, l2, weight)


def may_split(noisy_count: float, min_child_weight: int) -> bool:
    """Whether a node may split: its *noisy* count (``n + Lap(1/ε_count)``, sensitivity 1) reaches 2N, room for
    two children of N.  Post-processing of a Laplace release — never the exact count."""
    return bool(noisy_count >= 2 * int(min_child_weight))


def leaf_value(G: np.ndarray, n: np.ndarray, min_child_weight: int, l2: float, weight: float = 1.0) -> np.ndarray:
    """The exact leaf value ``G/(h·max(n, N) + λ)`` (Sarus eq. 4 with the clamp; G sums *negative* gradients, as
    :func:`fedsbdt.common.kernels.grad_hess_units` returns them) before noise."""
    n = np.maximum(np.asarray(n, np.float64), float(min_child_weight))
    return np.asarray(G, np.float64) / (weight * n + l2)


def leaf_noise_units(grad_clip: float, min_child_weight: int, l2: float, eps_leaf: float, scale: float,
                     weight: float = 1.0) -> float:
    """Discrete-Laplace scale (fixed-point units of 1/``scale``) of a leaf value: ``(Δ_V·scale + 1)/ε_leaf``.

    The value is rounded to the grid before the exact discrete Laplace is added; rounding moves
    neighbouring values apart by at most one more unit, hence the ``+ 1``."""
    return (leaf_sensitivity(grad_clip, min_child_weight, l2, weight) * scale + 1.0) / eps_leaf


def sketch_noise_scale(features: int, eps_sketch: float) -> float:
    """Discrete-Laplace scale per histogram bin: ``m/ε_sketch`` (a record adds 1 to one bin of each of the m
    sketched features' histograms: L1 sensitivity m; Sarus §4.4 ``Lap(m/ε_sketch)``)."""
    return float(features) / eps_sketch


# --------------------------------------------------------------------------- the releases (noise from ``randomness``)


def release_histograms(counts: np.ndarray, features: int, eps_sketch: float, randomness) -> np.ndarray:
    """The sketch release: integer bin counts of ``features`` histograms plus ``Lap_Z(m/ε_sketch)`` each (exact
    discrete Laplace; :func:`sketch_noise_scale`)."""
    counts = np.asarray(counts, np.int64)
    return counts + randomness.discrete_laplace(np.full(counts.size, sketch_noise_scale(features, eps_sketch))
                                                ).reshape(counts.shape)


def release_counts(counts: np.ndarray, eps_count: float, randomness) -> np.ndarray:
    """The node counts of one level (disjoint records, sensitivity 1) plus ``Lap_Z(1/ε_count)`` each."""
    counts = np.asarray(counts, np.int64)
    return counts + randomness.discrete_laplace(np.full(counts.size, 1.0 / eps_count))


def release_leaves(G: np.ndarray, n: np.ndarray, grad_clip: float, min_child_weight: int, l2: float, weight: float,
                   eps_leaf: float, scale: float, randomness) -> np.ndarray:
    """The leaf release: :func:`leaf_value` rounded to the fixed-point grid (``scale`` units per 1.0) plus exact
    discrete Laplace noise of :func:`leaf_noise_units`, back in real units (disjoint leaves: one ε_leaf)."""
    exact = np.rint(leaf_value(G, n, min_child_weight, l2, weight) * scale).astype(np.int64)
    units = leaf_noise_units(grad_clip, min_child_weight, l2, eps_leaf, scale, weight)
    return (exact + randomness.discrete_laplace(np.full(exact.size, units))) / scale


# --------------------------------------------------------------------------- budget and accounting


@dataclass(frozen=True)
class TreeBudget:
    """The per-tree ε of each Sarus release (§4.4)."""

    sketch: float
    select: float  # per level: the exponential mechanism
    count: float  # per level: the noisy node counts
    leaf: float

    @classmethod
    def split(cls, eps_tree: float, depth: int) -> "TreeBudget":
        level = SELECT_SHARE * eps_tree / depth
        return cls(SKETCH_SHARE * eps_tree, level / 2.0, level / 2.0, LEAF_SHARE * eps_tree)


def tree_event(eps_tree: float, depth: int, gamma: float) -> PoissonSampledEvent:
    """One Sarus tree as data: on a Poisson subsample of rate γ, the Laplace sketch, ``depth`` levels of noisy
    node counts and the exponential mechanism (the nodes of a level hold disjoint records: one release each
    per level) and the Laplace leaves (disjoint leaves: one release)."""
    b = TreeBudget.split(eps_tree, depth)
    level = compose(LaplaceEvent(b.count), ExponentialEvent(b.select), count=depth)
    return PoissonSampledEvent(gamma, compose(LaplaceEvent(b.sketch), level, LaplaceEvent(b.leaf)))


def training_event(eps_tree: float, depth: int, gamma: float, rounds: int, eps_init: float,
                   eps_ds: float) -> ComposedEvent:
    """Everything a Sarus run releases: the initial score and ``rounds`` trees."""
    return compose(init_score_events(eps_init, eps_ds), compose(tree_event(eps_tree, depth, gamma), count=rounds))


def paper_epsilon(eps_tree: float, gamma: float, rounds: int, eps_init: float = 0.0, eps_ds: float = 0.0) -> float:
    """The pure ε the paper's own accounting claims (§4.4): amplification ``log(1 + γ(e^{ε_t} − 1))`` per tree,
    basic composition over trees (plus our initial score, also pure)."""
    return rounds * subsampled_pure_epsilon(eps_tree, gamma) + eps_init + eps_ds


def paper_tree_epsilon(epsilon: float, gamma: float, rounds: int, eps_init: float = 0.0, eps_ds: float = 0.0) -> float:
    """The per-tree ε_t whose paper accounting is exactly ``epsilon`` (inverse of :func:`paper_epsilon`)."""
    left = epsilon - eps_init - eps_ds
    if not left > 0:
        raise AccountingError(f"the initial score uses all of ε = {epsilon:g}")
    return math.log1p(math.expm1(left / rounds) / gamma)


@lru_cache(maxsize=128)
def calibrate_sarus(epsilon: float, delta: float, rounds: int, depth: int, gamma: float, init_share: float = 0.0,
                    eps_ds: float = 0.0, accountant: str = "rdp",
                    alpha_max: int = 4 * DEFAULT_ALPHA_MAX) -> PrivacyCalibration:
    """The largest per-tree ε_t whose whole release (:func:`training_event`) meets the target.

    ``accountant="pure"``: the paper's composition (:func:`paper_epsilon`) gives ε exactly — a pure ε-DP
    guarantee (δ = 0).  ``"rdp"``: our RDP ledger (:func:`fedsbdt.common.accountant.event_rdp`: each tree the tight
    RDP of a subsampled ε_t-DP mechanism, the initial score randomized response's) and Cor. 6 at δ,
    bisected on ε_t.  Either way both numbers are reported: ``eps_paper`` and ``eps_rdp``."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise AccountingError(f"ε must be a positive number, got {epsilon}")
    if not 0 < delta < 1:
        raise AccountingError(f"δ must be in (0, 1), got {delta}")
    if rounds < 1 or depth < 1:
        raise AccountingError("at least one accounted tree of depth ≥ 1 is needed")
    if accountant not in ACCOUNTANTS:
        raise AccountingError(f"Sarus trees are accounted by 'rdp' (ours) or 'pure' (the paper's), not {accountant!r}")
    eps_init = init_share * epsilon
    eps_ds = eps_ds if init_share > 0 else 0.0

    def ours(eps_tree: float) -> tuple[float, int]:
        return event_epsilon_rdp(training_event(eps_tree, depth, gamma, rounds, eps_init, eps_ds), delta, alpha_max)

    if accountant == "pure":
        eps_tree = paper_tree_epsilon(epsilon, gamma, rounds, eps_init, eps_ds)
    else:
        lo, hi = 1e-9, 200.0
        if ours(hi)[0] <= epsilon:
            eps_tree = hi
        elif ours(lo)[0] > epsilon:
            raise AccountingError(f"target ε={epsilon:g} is unreachable for {rounds} Sarus trees at δ={delta:g}")
        else:
            while hi - lo > 1e-9 * hi:
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if ours(mid)[0] <= epsilon else (lo, mid)
            eps_tree = lo
    eps_rdp, alpha = ours(eps_tree)
    eps_paper = paper_epsilon(eps_tree, gamma, rounds, eps_init, eps_ds)
    b = TreeBudget.split(eps_tree, depth)
    pure = accountant == "pure"
    return PrivacyCalibration(accountant, 0.0, 0 if pure else alpha, 0.0, eps_paper if pure else eps_rdp,
                              0.0 if pure else delta, rounds, gamma, eps_init, eps_ds, eps_select=b.select,
                              eps_sketch=b.sketch, eps_leaf=b.leaf, eps_paper=eps_paper, eps_rdp=eps_rdp)


def epsilon_curve(privacy: dict, points: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """ε after r accounted Sarus trees of a central model, by its own accountant (the report's curve): the
    paper's composition for ``accountant = "pure"``, our RDP ledger at the model's δ otherwise (a federated
    model's: :func:`fedsbdt.common.modes.sarus.rounds.epsilon_curve`)."""
    T = int(privacy.get("rounds_accounted", 0) or 0)
    eps_tree = float(privacy.get("eps_sketch", 0.0) or 0.0) / SKETCH_SHARE
    if T < 1 or depth < 1 or not eps_tree > 0:
        return np.zeros(0), np.zeros(0)
    rs = np.unique(np.linspace(1, T, min(points, T)).round().astype(int))
    gamma, e_init, e_ds = float(privacy["subsample"]), float(privacy["eps_init"]), float(privacy["eps_ds"])
    if privacy.get("accountant") == "pure":
        return rs, np.array([paper_epsilon(eps_tree, gamma, int(r), e_init, e_ds) for r in rs])
    delta = float(privacy["delta"])
    return rs, np.array([event_epsilon_rdp(training_event(eps_tree, depth, gamma, int(r), e_init, e_ds), delta,
                                           4 * DEFAULT_ALPHA_MAX)[0] for r in rs])
