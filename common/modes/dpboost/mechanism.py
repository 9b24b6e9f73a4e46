"""DPBoost (Li, Wu, Wen & He, AAAI'20): its mechanisms and its accounting, as pure functions (docs/dpboost.md).

Notation of ``../shared/papers/dpboost-aaai20.txt``:

* g*_l — the gradient-based data filtering (GDF) threshold (§3.1): a tree uses
  only the records whose gradient has ``|g| ≤ g*_l`` (here ``grad_clip``; 1 in
  the paper, the largest gradient of the square loss at ŷ = 0 with labels in
  [−1, 1], and the bound of the logistic loss's ``|y − σ(ŷ)|`` for binary
  labels).  Filtered records are left out of that tree, not clipped.
* Lemma 1 / Cor. 1: the gain ``G_L²/(n_L+λ) + G_R²/(n_R+λ)`` (eq. 3) has
  sensitivity ``ΔG = 3·g*_l²`` (:func:`fedsbdt.common.builders.score_sensitivity`).
* Lemma 2 / Cor. 1: the leaf value ``V = Σg/(n+λ)`` (eq. 4, gradient
  boosting: counts, not Hessians) has sensitivity ``ΔV = g*_l/(1+λ)``.
* Geometric leaf clipping (GLC, §3.1, Thm. 6): the t-th tree's leaf values are
  clipped to ``g*_l·(1−η)^(t−1)`` before the Laplace release, so (Cor. 2)
  ``ΔV_t = min(g*_l/(1+λ), 2·g*_l·(1−η)^(t−1))``.
* Alg. 1: per tree of budget ε_t, half to the leaves (``ε_leaf = ε_t/2``) and
  ``ε_t/(2·depth)`` to each level's exponential mechanism (Thm. 7: the nodes of
  a level hold disjoint records).
* Alg. 2 / Thm. 8, ensemble of ensembles: ``N_e = ⌈T/T_e⌉`` ensembles of
  ``T_e`` trees; inside an ensemble the trees use disjoint records (parallel
  composition), tree ``t_e`` (1-based position) a share
  ``η(1−η)^(t_e−1) / (1−(1−η)^T_e)`` of them (line 8); ensembles compose
  sequentially, so the paper claims ``ε = N_e·ε_t``.

Where we depart from the paper (each a privacy fix or a tighter bound):

* The partition is drawn **per record** from the CSPRNG (a categorical draw
  with the shares of line 8), not "pick |D|·share unused records": fixed
  sizes make every other record's part depend on whether one record is
  present, which parallel composition does not allow.  A per-record draw
  also lets a site partition its own records.
* The split candidates are a public grid (the greedy builder's), not the
  records' own feature values (which the paper's implementation uses and
  which are not private, Grislain & Gonzalvez §5).
* Leaf values are released on the fixed-point grid ``2^-k`` with exact
  discrete Laplace noise (floor encoding: ``|⌊a⌋−⌊b⌋| ≤ ⌈|a−b|⌉``, so the
  integer sensitivity is ``⌈ΔV_t·2^k⌉``), never with floating-point Laplace.
* Accounting: every release is an event of :mod:`fedsbdt.common.accountant`
  (exponential mechanism: bounded range, Thm. 1 of "Revisiting"; Laplace: the
  RDP of any pure ε-DP mechanism; an ensemble: a :class:`ParallelEvent`), and
  the guarantee is the better of the RDP ledger at δ and the paper's pure
  composition — so a budget is calibrated to a larger ε_t per tree than the
  paper's ``ε/N_e`` whenever the ledger is tighter (many ensembles).

GLC's index: Alg. 2 line 14 writes the global t, but the paper sizes a tree's
data by its leaf sensitivity through its position t_e (line 8) and says the
ensembles "address the side effect of GLC" — both only hold if the clipping
restarts with every ensemble, so we clip with the position t_e.  For one
ensemble (the paper's Fig. 2 setting) the two readings agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedsbdt.common.accountant import (AccountingError, ExponentialEvent, LaplaceEvent, MAX_EPSILON, ParallelEvent,
                         PrivacyCalibration, compose, default_alpha_max, event_epsilon_rdp, event_pld, event_rdp,
                         init_score_events)


# --------------------------------------------------------------------------- mechanisms


def gdf_mask(neg_grad: np.ndarray, threshold: float) -> np.ndarray:
    """Gradient-based data filtering (§3.1): the records with ``|g| ≤ g*_l`` (the others sit this tree out)."""
    return np.abs(np.asarray(neg_grad, np.float64)) <= float(threshold)


def tree_records(position: int, round_id: int, neg_grad: np.ndarray, arrival: np.ndarray, parts: np.ndarray,
                 grad_threshold: float) -> np.ndarray:
    """Alg. 2 lines 8–10: the records tree ``round_id`` (at 1-based ``position`` of its ensemble) uses —
    arrived, in its part of the ensemble's partition, and through GDF."""
    return ((np.asarray(arrival) <= round_id) & (np.asarray(parts) == position - 1)
            & gdf_mask(neg_grad, grad_threshold))


def glc_threshold(position: int, grad_threshold: float, learning_rate: float) -> float:
    """Geometric leaf clipping (§3.1, Thm. 6): ``g*_l·(1−η)^(t−1)`` for the tree at (1-based) ``position``."""
    if position < 1:
        raise ValueError("tree positions are 1-based")
    return float(grad_threshold) * (1.0 - float(learning_rate)) ** (position - 1)


def leaf_sensitivity(position: int, grad_threshold: float, l2: float, learning_rate: float) -> float:
    """Cor. 2: ``ΔV_t = min(g*_l/(1+λ), 2·g*_l·(1−η)^(t−1))`` (Lemma 2 with GDF, and the GLC range)."""
    return min(float(grad_threshold) / (1.0 + float(l2)),
               2.0 * glc_threshold(position, grad_threshold, learning_rate))


def leaf_values(grad_sums: np.ndarray, counts: np.ndarray, l2: float) -> np.ndarray:
    """Eq. 4 (gradient boosting on counts): ``V = Σg/(n+λ)`` per leaf, ``g`` the negative gradient; 0 if empty."""
    G, n = np.asarray(grad_sums, np.float64), np.asarray(counts, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n + l2 > 0, G / (n + l2), 0.0)


def clip_leaves(values: np.ndarray, threshold: float) -> np.ndarray:
    """GLC: ``V·min(1, θ/|V|)`` = V clamped to [−θ, θ] (1-Lipschitz, so it never raises the sensitivity)."""
    return np.clip(np.asarray(values, np.float64), -threshold, threshold)


def leaf_units(values: np.ndarray, scale: float) -> np.ndarray:
    """Leaf values on the fixed-point grid: ``⌊V·2^k⌋`` (int64).  Floor, not round: ``|⌊a⌋−⌊b⌋| ≤ ⌈|a−b|⌉``."""
    return np.floor(np.asarray(values, np.float64) * scale).astype(np.int64)


def laplace_scale_units(sensitivity: float, eps_leaf: float, scale: float) -> float:
    """Discrete-Laplace scale (grid units) making the leaf release ε_leaf-DP: ``⌈ΔV_t·2^k⌉/ε_leaf``.

    Lap_Z(b) has ``P[x]/P[x+Δ] ≤ e^{Δ/b}`` for an integer shift Δ, so an integer sensitivity ``Δ_u`` needs
    ``b = Δ_u/ε`` (Thm. 1 of the paper, on the integers)."""
    if not eps_leaf > 0:
        raise ValueError("the leaf budget must be positive")
    return math.ceil(float(sensitivity) * float(scale)) / float(eps_leaf)


def tree_shares(ensemble_trees: int, learning_rate: float) -> np.ndarray:
    """Alg. 2 line 8: the share of an ensemble's records for the tree at position k = 1…T_e,
    ``η(1−η)^(k−1) / (1−(1−η)^T_e)`` (sums to 1; proportional to the tree's GLC threshold)."""
    eta = float(learning_rate)
    k = np.arange(int(ensemble_trees), dtype=np.float64)
    if eta >= 1.0:  # (1−η)^k = 0 for k ≥ 1: everything to the first tree
        return (k == 0).astype(np.float64)
    w = (1.0 - eta) ** k
    return w / w.sum()


def draw_partition(shares: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Position (0-based) of every record in its ensemble, one categorical draw per record from a uniform
    64-bit word: the 53 top bits as ``u ∈ [0, 1)``, the part whose cumulative share first exceeds ``u``.
    Independent of every record's data, as parallel composition needs."""
    u = (np.asarray(words, np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    cum = np.cumsum(np.asarray(shares, np.float64))
    return np.minimum(np.searchsorted(cum, u, side="right"), len(cum) - 1).astype(np.int64)


# --------------------------------------------------------------------------- budget and accounting


def ensembles(trees: int, ensemble_trees: int) -> int:
    """``N_e = ⌈T/T_e⌉`` (Alg. 2 line 1); ``T_e = 0`` puts all trees in one ensemble."""
    return 1 if ensemble_trees <= 0 else -(-int(trees) // int(ensemble_trees))


def tree_budget(eps_tree: float, depth: int, selection_share: float = 0.5) -> tuple[float, float]:
    """Alg. 1 lines 1–2: (ε per level of node selection, ε_leaf) = ``(s·ε_t/depth, (1−s)·ε_t)``; paper s = 1/2."""
    return selection_share * eps_tree / depth, (1.0 - selection_share) * eps_tree


def tree_event(eps_tree: float, depth: int, selection_share: float = 0.5):
    """One DPBoost tree: ``depth`` levels of the exponential mechanism (a level's nodes hold disjoint records,
    so a level is one release) and the Laplace leaf release (the leaves hold disjoint records)."""
    level, leaf = tree_budget(eps_tree, depth, selection_share)
    return compose(compose(ExponentialEvent(level), count=depth), LaplaceEvent(leaf))


def training_event(eps_tree: float, depth: int, trees: int, ensemble_trees: int, selection_share: float = 0.5,
                   eps_init: float = 0.0, eps_ds: float = 0.0):
    """Everything a DPBoost run releases: the initial score (if any), then ``N_e`` ensembles in sequence, each
    the parallel composition of its trees (the last may hold fewer trees; it costs the same)."""
    per = int(ensemble_trees) if ensemble_trees > 0 else int(trees)
    tree = tree_event(eps_tree, depth, selection_share)
    init = init_score_events(eps_init, eps_ds) if eps_init > 0 or eps_ds > 0 else None
    return compose(init, compose(ParallelEvent((tree,) * per), count=ensembles(trees, ensemble_trees)))


def paper_epsilon(eps_tree: float, trees: int, ensemble_trees: int, eps_init: float = 0.0,
                  eps_ds: float = 0.0) -> float:
    """The pure ε the paper's own composition claims (Thm. 7, 8): ``N_e·ε_t`` (+ the initial score, sequential)."""
    return ensembles(trees, ensemble_trees) * float(eps_tree) + eps_init + eps_ds


@dataclass(frozen=True)
class DPBoostCalibration(PrivacyCalibration):
    """A DPBoost budget: ``eps_select`` is ε per level; ``epsilon`` = min(paper's pure ε, the ledger's ε at δ)."""

    eps_tree: float = 0.0  # ε_t of every tree (Alg. 2 line 2 sets ε/N_e; ours may be larger)
    eps_leaf: float = 0.0  # ε of the Laplace leaf release per tree
    ensembles: int = 1  # N_e
    ensemble_trees: int = 0  # T_e (trees per ensemble)
    eps_paper: float = 0.0  # pure ε the paper's composition claims for eps_tree (δ = 0)
    eps_ledger: float = 0.0  # ε at δ of our RDP/PLD ledger for eps_tree
    eps_tree_paper: float = 0.0  # ε_t the paper would use for the same target ε
    eps_ledger_paper_tree: float = 0.0  # our ledger's ε at δ for the paper's own run (ε_t = eps_tree_paper)

    @property
    def pure(self) -> bool:
        """The guarantee holds with δ = 0 (the paper's composition was the tighter one)."""
        return self.eps_paper <= self.eps_ledger


def _ledger_epsilon(ev, delta: float, accountant: str, alpha_max: int, interval: float) -> tuple[float, int]:
    if accountant == "rdp":
        return event_epsilon_rdp(ev, delta, alpha_max)
    return float(event_pld(ev, interval).get_epsilon_for_delta(delta)), 0


@lru_cache(maxsize=128)
def calibrate_dpboost(epsilon: float, delta: float, trees: int, ensemble_trees: int, depth: int,
                      selection_share: float = 0.5, init_share: float = 0.0, eps_ds: float = 0.0,
                      accountant: str = "rdp", alpha_max: int | None = None) -> DPBoostCalibration:
    """The largest per-tree ε_t whose whole release (:func:`training_event`) meets the target: either the paper's
    pure composition ``N_e·ε_t + ε_init + ε_ds ≤ ε`` (δ = 0) or our ledger's (ε, δ) — whichever allows more
    (bisection on ε_t; the ledger's ε grows with ε_t)."""
    if not (epsilon > 0 and math.isfinite(epsilon)) or epsilon > MAX_EPSILON:
        raise AccountingError(f"ε must be a positive number up to {MAX_EPSILON:g}, got {epsilon}")
    if not (0 < delta < 1):
        raise AccountingError(f"δ must be in (0, 1), got {delta}")
    if trees < 1 or depth < 1:
        raise AccountingError("at least one accounted tree of depth ≥ 1 is needed")
    if accountant not in ("rdp", "pld"):
        raise AccountingError(f"unknown accountant {accountant!r} (use 'rdp' or 'pld')")
    eps_init = init_share * epsilon
    eps_ds = eps_ds if init_share > 0 else 0.0
    n_e = ensembles(trees, ensemble_trees)
    paper_tree = (epsilon - eps_init - eps_ds) / n_e
    if not paper_tree > 0:
        raise AccountingError("the initial score uses the whole budget; lower init_share or eps_ds")
    if alpha_max is None:
        alpha_max = default_alpha_max(epsilon, delta)
    interval = min(1e-3, epsilon * 1e-2)

    def ledger(eps_tree: float) -> tuple[float, int]:
        ev = training_event(eps_tree, depth, trees, ensemble_trees, selection_share, eps_init, eps_ds)
        try:
            return _ledger_epsilon(ev, delta, accountant, alpha_max, interval)
        except OverflowError:
            return math.inf, 0

    eps_tree = paper_tree  # always meets the target by the paper's pure composition
    at_paper_tree = ledger(paper_tree)[0]
    if at_paper_tree <= epsilon:  # the ledger allows more than the paper: bracket, then bisect
        lo, hi = paper_tree, 2.0 * paper_tree
        while ledger(hi)[0] <= epsilon and hi < MAX_EPSILON:
            lo, hi = hi, 2.0 * hi
        while hi / lo > 1.0 + 1e-7:
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if ledger(mid)[0] <= epsilon else (lo, mid)
        eps_tree = lo
    eps_ledger, alpha = ledger(eps_tree)
    claimed = paper_epsilon(eps_tree, trees, ensemble_trees, eps_init, eps_ds)
    level, leaf = tree_budget(eps_tree, depth, selection_share)
    rho = 0.0
    if accountant == "rdp":
        per = ensemble_trees if ensemble_trees > 0 else trees
        trees_ev = compose(ParallelEvent((tree_event(eps_tree, depth, selection_share),) * per), count=n_e)
        rho = float(event_rdp(trees_ev, np.array([alpha]))[0])
    return DPBoostCalibration(accountant, 0.0, alpha, rho, min(claimed, eps_ledger), delta, int(trees), 1.0,
                              eps_init, eps_ds, eps_select=level, eps_tree=eps_tree, eps_leaf=leaf,
                              ensembles=n_e, ensemble_trees=int(ensemble_trees), eps_paper=claimed,
                              eps_ledger=eps_ledger, eps_tree_paper=paper_tree,
                              eps_ledger_paper_tree=at_paper_tree)


def receipt(cal: DPBoostCalibration) -> dict:
    """What DPBoost adds to a model's privacy block: its guarantee (pure when the paper's composition is the
    tighter bound) and the ``dpboost`` block with both the paper's claimed ε and ours."""
    pure = (f"{cal.epsilon:.6g}-differential privacy (pure, δ = 0)" if cal.pure else
            f"({cal.epsilon:.6g}, {cal.delta:.3g})-differential privacy")
    return {"guarantee": f"{pure} for every record (add/remove one record), covering the initial score and all "
                         "released trees",
            "dpboost": _block(cal)}


def _block(cal: DPBoostCalibration) -> dict:
    return {"eps_tree": cal.eps_tree, "eps_level": cal.eps_select, "eps_leaf": cal.eps_leaf,
            "ensembles": cal.ensembles, "ensemble_trees": cal.ensemble_trees,
            "epsilon_paper": cal.eps_paper, "epsilon_ledger": cal.eps_ledger,
            "eps_tree_paper": cal.eps_tree_paper, "epsilon_ledger_paper_run": cal.eps_ledger_paper_tree,
            "pure": cal.pure,
            "claim": (f"the paper's composition (Thm. 7, 8: N_e·ε_t) claims pure ε = {cal.eps_paper:.6g} for these "
                      f"trees; our ledger gives ε = {cal.eps_ledger:.6g} at δ = {cal.delta:.3g}; the paper would "
                      f"give each tree ε_t = {cal.eps_tree_paper:.6g} for the same target, we give "
                      f"{cal.eps_tree:.6g} (the paper's own run, claimed ε = {_paper_run(cal):.6g}, is ε = {cal.eps_ledger_paper_tree:.6g} at δ = {cal.delta:.3g} by our ledger)")}


def _paper_run(cal: DPBoostCalibration) -> float:
    return cal.eps_tree_paper * cal.ensembles + cal.eps_init + cal.eps_ds


def account_lines(cal: DPBoostCalibration, target: float) -> str:
    """``fedsbdt account`` for DPBoost mode: the budget per tree and both ε — the paper's and ours."""
    return (f"accountant     {cal.accountant}   (DPBoost: docs/dpboost.md)\n"
            f"ensembles      {cal.ensembles} of {cal.ensemble_trees or cal.rounds} trees "
            f"(sequential; parallel inside)\n"
            f"eps_tree       {cal.eps_tree:.6g}   (per tree; the paper's Alg. 2 gives {cal.eps_tree_paper:.6g})\n"
            f"eps_level      {cal.eps_select:.6g}   (exponential mechanism per level, ΔG = 3·g*²)\n"
            f"eps_leaf       {cal.eps_leaf:.6g}   (discrete Laplace leaves, ΔV = min(g*/(1+λ), 2g*(1−η)^(t−1)))\n"
            f"paper claims   ε = {cal.eps_paper:.6g} (pure, δ = 0; Thm. 7, 8: N_e·ε_t)\n"
            f"paper's run    ε_t = {cal.eps_tree_paper:.6g}: claimed ε = {_paper_run(cal):.6g}, our ledger "
            f"{cal.eps_ledger_paper_tree:.6g} at δ = {cal.delta:.3g}\n"
            f"our ledger     ε = {cal.eps_ledger:.6g} at δ = {cal.delta:.3g} ("
            + ("RDP: bounded-range exponential, pure-DP Laplace" if cal.accountant == "rdp" else
               "dp-accounting PLD of pure-DP releases") + ")\n"
            f"epsilon        {cal.epsilon:.6g}   (achieved, target {target:g}; "
            f"{'pure' if cal.pure else f'δ = {cal.delta:.3g}'})")
