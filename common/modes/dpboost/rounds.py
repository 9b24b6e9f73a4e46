"""Federated DPBoost: what DPBoost adds to the federated greedy level rounds (docs/dpboost.md, "Federation").

A federated DPBoost tree is a federated greedy tree (``common/modes/greedy/rounds.py``: ``depth`` level
rounds of noisy histograms, the coordinator's arg max, then a leaf round) with three DPBoost pieces:

1. **Partition and GDF at the site.**  When an ensemble starts, a site draws every one of its records' tree in
   the ensemble from the OS CSPRNG (:func:`fedsbdt.common.modes.dpboost.mechanism.draw_partition`, Alg. 2 line 8) and keeps the
   draw in its database (:class:`SitePartition`): a restarted site reuses it, so no record lies in two
   trees of one ensemble.  A tree's level and leaf vectors cover only the records of its part that pass
   gradient-based data filtering (``|g| ≤ g*_l``, the public threshold): :func:`tree_records`.
2. **Splits** come from the level histograms (sensitivity: a kept record has ``|g| ≤ g*_l``, as a clipped
   one in greedy trees), each level a Gaussian release inside the ensemble's parallel composition.
3. **Leaves.**  The leaf round releases per-leaf gradient sums and record counts (a count enters as
   ``h*`` fixed-point units per record, so the S-BDT leaf noise and its sensitivity apply unchanged); the
   coordinator computes ``V = Σg/(n+λ)``, clips it by GLC and clamps it: post-processing
   (:func:`leaf_values`).

Accounting (:func:`calibrate_federated`): a tree is ``depth`` Gaussian levels of noise multiplier σ_s/√2
and a Gaussian leaf release of multiplier σ/√2 (:func:`fedsbdt.common.accountant.greedy_tree_event`, histogram
selection); an ensemble is the :class:`~fedsbdt.common.accountant.ParallelEvent` of its trees; ensembles and the
initial score compose sequentially — one RDP ledger.  Everything here is side-effect free except
:class:`SitePartition`, which reads and writes the site's store it is given.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import fedsbdt.common.modes.dpboost.mechanism as dpboost
from fedsbdt.common.accountant import (AccountingError, ParallelEvent, PrivacyCalibration, calibrate_greedy, compose,
                               default_alpha_max, event_epsilon_rdp, event_rdp, greedy_tree_event,
                               init_score_events)
from fedsbdt.common.boosting import TASK_CODE, Contribution
from fedsbdt.common.modes.dpboost.builder import negative_gradient
from fedsbdt.common.randomness import csprng_uint64


class DPBoostRequestError(ValueError):
    """A request does not fit the plan's DPBoost trees (or a stored partition does not fit the site's data)."""


# --------------------------------------------------------------------------- the ensemble of ensembles


def ensemble_trees(hp) -> int:
    """T_e: trees per ensemble (all accounted trees when ``hp.ensemble_trees`` is 0)."""
    return hp.ensemble_trees or hp.accounted_rounds


def position(hp, tree: int) -> int:
    """1-based position t_e of tree ``tree`` in its ensemble (GLC and the partition restart per ensemble)."""
    return tree % ensemble_trees(hp) + 1


def ensemble_of(hp, tree: int) -> int:
    return tree // ensemble_trees(hp)


def check_tree(hp, tree: int) -> str | None:
    """Why tree ``tree`` is not a tree of the plan (index beyond the plan's trees / ensembles), or None."""
    n_e = dpboost.ensembles(hp.accounted_rounds, hp.ensemble_trees)
    if not 0 <= tree < hp.total_rounds or ensemble_of(hp, tree) >= n_e:
        return (f"tree {tree} is not a tree of the plan ({hp.total_rounds} trees in {n_e} ensemble(s) of "
                f"{ensemble_trees(hp)})")
    return None


def tree_records(hp, tree: int, neg_grad: np.ndarray, arrival: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """The records tree ``tree`` uses (Alg. 2 lines 8–10): arrived, in the tree's part of its ensemble's
    partition, and through GDF ``|g| ≤ g*_l`` (g the exact negative gradient)."""
    return dpboost.tree_records(position(hp, tree), tree, neg_grad, arrival, parts, hp.grad_clip)


def leaf_sums(leaf: np.ndarray, grad_units: np.ndarray, use: np.ndarray, leaves: int, hess_units: int) -> np.ndarray:
    """One party's leaf vector ``[h*·n per leaf | Σg per leaf]`` (int64 units) over the records ``use``: the
    S-BDT layout ``[Hessian | gradient]`` with every kept record's "Hessian" = h* (so ``n`` = sum / h*)."""
    rows = np.flatnonzero(use)
    out = np.zeros(2 * leaves, np.int64)
    lf = np.asarray(leaf, np.int64)[rows]
    np.add.at(out, lf, np.int64(hess_units))
    np.add.at(out, leaves + lf, np.asarray(grad_units, np.int64)[rows])
    return out


def leaf_values(noisy_sums: np.ndarray, hp, enc, tree: int) -> np.ndarray:
    """The coordinator's post-processing of a released leaf vector: ``V = Σg/(n+λ)`` (eq. 4, 0 where the noisy
    count is not positive), clipped by GLC to ``g*_l·(1−η)^(t_e−1)`` and clamped to ``[−β, β]``."""
    L = hp.leaves
    s = np.asarray(noisy_sums, np.float64)
    n = s[:L] / enc.hess.bound_units
    G = s[L:] / enc.grad.scale
    v = np.where(n > 0, dpboost.leaf_values(G, np.maximum(n, 0.0), hp.l2), 0.0)
    v = dpboost.clip_leaves(v, dpboost.glc_threshold(position(hp, tree), hp.grad_clip, hp.learning_rate))
    return np.clip(v, -hp.leaf_clip, hp.leaf_clip)


# --------------------------------------------------------------------------- a site's partition


class SitePartition:
    """A site's per-ensemble partition of its records: drawn once per ensemble from the OS CSPRNG and stored
    (with a digest of the record ids it was drawn for) *before* any vector that depends on it leaves the site.

    ``load(ensemble) -> bytes | None`` and ``save(ensemble, bytes)`` are the site database's (durable)."""

    def __init__(self, hp, ids: np.ndarray, load, save) -> None:
        self.hp = hp
        self.ids = np.ascontiguousarray(np.asarray(ids, np.int64))
        self._digest = hashlib.sha256(self.ids.astype("<i8").tobytes()).digest()
        self._load, self._save = load, save
        self._cache: dict[int, np.ndarray] = {}

    def parts(self, ensemble: int) -> np.ndarray:
        """Every record's 0-based position in ensemble ``ensemble`` (the stored draw, or a new, stored one)."""
        got = self._cache.get(ensemble)
        if got is not None:
            return got
        blob = self._load(ensemble)
        if blob is None:
            shares = dpboost.tree_shares(ensemble_trees(self.hp), self.hp.learning_rate)
            got = dpboost.draw_partition(shares, csprng_uint64(self.ids.size))
            self._save(ensemble, self._digest + got.astype("<u4").tobytes())  # durable before first use
            return got  # not kept in memory: a save rolled back with an outer transaction must not be used again
        if blob[:32] != self._digest or len(blob) != 32 + 4 * self.ids.size:
            raise DPBoostRequestError(f"the stored partition of ensemble {ensemble} was drawn for other "
                                      "records than this site's data; refusing to draw a second one")
        got = np.frombuffer(blob[32:], "<u4").astype(np.int64)
        self._cache = {ensemble: got}  # only what the database holds
        return got

    def records(self, tree: int, local) -> np.ndarray:
        """Tree ``tree``'s records among the site's ``local`` data (:func:`tree_records`)."""
        g = negative_gradient(local.pred, local.y, local.task)
        return tree_records(self.hp, tree, g, local.arrival, self.parts(ensemble_of(self.hp, tree)))

    def contribution(self, splits, tree: int, local, use: np.ndarray | None = None) -> Contribution:
        """The leaf round's vector of tree ``tree`` (:func:`leaf_sums`) as a :class:`Contribution`, over ``use``
        (default: the tree's records, :meth:`records`; the site's gate may leave out records whose budget is
        spent)."""
        enc, hp = local.enc, self.hp
        use = self.records(tree, local) if use is None else np.asarray(use, bool)
        gq, _ = local.kernels.grad_hess_units(local.pred, local.y, TASK_CODE[local.task], enc.scale,
                                        enc.grad.bound_units, enc.hess.bound_units)
        leaf = local.leaf_index(splits)
        n = int(use.sum())
        return Contribution(leaf_sums(leaf, gq, use, hp.leaves, enc.hess.bound_units), leaf, None, n, n)


# --------------------------------------------------------------------------- accounting


def tree_event(sigma_select: float, sigma: float, depth: int):
    """One federated DPBoost tree: ``depth`` Gaussian levels (σ_s/√2) and the Gaussian leaf release (σ/√2)."""
    return greedy_tree_event(sigma_select, sigma, depth, "histogram")


def trees_event(sigma_select: float, sigma: float, depth: int, trees: int, ensemble_trees_: int):
    """The trees of a run: ``N_e`` ensembles in sequence, each the parallel composition of its trees."""
    per = int(ensemble_trees_) if ensemble_trees_ > 0 else int(trees)
    return compose(ParallelEvent((tree_event(sigma_select, sigma, depth),) * per),
                   count=dpboost.ensembles(trees, ensemble_trees_))


def training_event(sigma_select: float, sigma: float, depth: int, trees: int, ensemble_trees_: int,
                   eps_init: float = 0.0, eps_ds: float = 0.0):
    """Everything a federated DPBoost run releases: the initial score (if any), then the ensembles."""
    init = init_score_events(eps_init, eps_ds) if eps_init > 0 or eps_ds > 0 else None
    return compose(init, trees_event(sigma_select, sigma, depth, trees, ensemble_trees_))


@dataclass(frozen=True)
class FederatedDPBoostCalibration(PrivacyCalibration):
    """A federated DPBoost budget: σ of the leaves, σ_s of the levels, and the sequential composition the
    paper's Thm. 8 would apply (per-ensemble (ε, δ/N_e) summed over ensembles) beside our ledger's ε."""

    ensembles: int = 1  # N_e
    ensemble_trees: int = 0  # T_e
    eps_ensemble: float = 0.0  # ε of one ensemble (= one tree) at δ/N_e by the RDP ledger
    eps_composed: float = 0.0  # N_e·eps_ensemble + ε_init + ε_ds: the paper's sequential composition, at δ


@lru_cache(maxsize=64)
def calibrate_federated(epsilon: float, delta: float, trees: int, ensemble_trees_: int, depth: int,
                        selection_share: float = 0.5, init_share: float = 0.0, eps_ds: float = 0.0,
                        accountant: str = "rdp") -> FederatedDPBoostCalibration:
    """The (σ_s, σ) whose whole release (:func:`training_event`) is (ε, δ)-DP by the RDP ledger.

    An ensemble's parallel composition of identical trees costs one tree, so the run costs as much as
    ``N_e`` sequential greedy trees with histogram selection: :func:`~fedsbdt.common.accountant.calibrate_greedy`
    with ``N_e`` rounds finds the budget (levels : leaves = s : 1 − s of the zCDP cost); the ε reported is
    recomputed from :func:`training_event` itself."""
    if accountant != "rdp":
        raise AccountingError("federated DPBoost is accounted by the RDP ledger (accountant = \"rdp\"): its "
                              "releases are sums of discrete Gaussian shares, which the PLD of the continuous "
                              "Gaussian does not dominate (docs/privacy.md \"PLD\")")
    n_e = dpboost.ensembles(trees, ensemble_trees_)
    base = calibrate_greedy(epsilon, delta, n_e, depth, selection_share, init_share, eps_ds, "rdp",
                            selection="histogram")
    alpha_max = default_alpha_max(epsilon, delta)
    ev = training_event(base.sigma_select, base.sigma, depth, trees, ensemble_trees_, base.eps_init, base.eps_ds)
    eps, alpha = event_epsilon_rdp(ev, delta, alpha_max)
    trees_ev = trees_event(base.sigma_select, base.sigma, depth, trees, ensemble_trees_)
    rho = float(event_rdp(trees_ev, np.array([alpha]))[0])
    one = ParallelEvent((tree_event(base.sigma_select, base.sigma, depth),))
    eps_e = event_epsilon_rdp(one, delta / n_e, alpha_max)[0]
    return FederatedDPBoostCalibration("rdp", base.sigma, alpha, rho, eps, delta, int(trees), 1.0, base.eps_init,
                                       base.eps_ds, 0.0, base.sigma_select, ensembles=n_e,
                                       ensemble_trees=int(ensemble_trees_), eps_ensemble=eps_e,
                                       eps_composed=n_e * eps_e + base.eps_init + base.eps_ds)


def calibration_for(hp) -> FederatedDPBoostCalibration:
    """:func:`calibrate_federated` for a plan's hyperparameters."""
    return calibrate_federated(hp.epsilon, hp.delta, hp.accounted_rounds, hp.ensemble_trees, hp.depth,
                               hp.selection_share, hp.init_share, hp.eps_ds, hp.accountant)


def receipt(cal: FederatedDPBoostCalibration) -> dict:
    """What federated DPBoost adds to the model's privacy block (replacing the central DPBoost block)."""
    return {"selection": "histogram",
            "dpboost": {"federated": True, "ensembles": cal.ensembles, "ensemble_trees": cal.ensemble_trees,
                        "sigma_level": cal.sigma_select, "sigma_leaf": cal.sigma,
                        "epsilon_ledger": cal.epsilon, "eps_ensemble": cal.eps_ensemble,
                        "epsilon_composed": cal.eps_composed, "pure": False,
                        "claim": _claim(cal)}}


def _claim(cal: FederatedDPBoostCalibration) -> str:
    return (f"Gaussian levels and leaves (no pure ε: the paper's ε_t-DP tree has no federated counterpart "
            f"here); one ensemble costs ε = {cal.eps_ensemble:.6g} at δ/N_e, so the paper's sequential "
            f"composition (Thm. 8) gives ε = {cal.eps_composed:.6g} at δ = {cal.delta:.3g}; our ledger gives "
            f"ε = {cal.epsilon:.6g}")


def account_lines(cal: FederatedDPBoostCalibration, target: float) -> str:
    """``fedsbdt account --plan`` for a federated DPBoost plan."""
    return (f"accountant     {cal.accountant}   (federated DPBoost: docs/dpboost.md \"Federation\")\n"
            f"ensembles      {cal.ensembles} of {cal.ensemble_trees or cal.rounds} trees "
            f"(sequential; parallel inside)\n"
            f"sigma_select   {cal.sigma_select:.6g}   (noise of the level histograms, σ_s; Gaussian per level)\n"
            f"sigma          {cal.sigma:.6g}   (leaf sums and counts, σ_leaf)\n"
            f"per ensemble   ε = {cal.eps_ensemble:.6g} at δ/N_e = {cal.delta / cal.ensembles:.3g}\n"
            f"paper-style    ε = {cal.eps_composed:.6g} at δ = {cal.delta:.3g} (N_e ensembles composed "
            f"sequentially, Thm. 8; no pure ε: Gaussian releases)\n"
            f"epsilon        {cal.epsilon:.6g}   (our ledger, achieved, target {target:g}; δ = {cal.delta:.3g})")
