"""DPBoost trees: the tree-builder strategy of DPBoost mode (docs/dpboost.md; mechanisms in :mod:`fedsbdt.common.modes.dpboost.mechanism`).

A DPBoost tree is a greedy tree (:class:`~fedsbdt.common.modes.greedy.builder.GreedyTrees`: the exponential mechanism per level on
the gain of eq. 3, ΔG = 3·g*_l², on the public candidate grid) grown on *its own* records only — those of
its part of the ensemble's partition (Alg. 2 line 8, drawn per record from the OS CSPRNG) that pass the
gradient filter (GDF) — and, unlike S-BDT's trees, it releases its leaves itself
(:meth:`DPBoostTrees.release_leaves`): the leaf value ``Σg/(n+λ)`` clipped by GLC, on the fixed-point grid,
plus exact discrete Laplace noise of scale ``⌈ΔV_t·2^k⌉/ε_leaf``.  The trees are ordinary complete trees, so
model, exports, estimators and reports take them as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import fedsbdt.common.modes.dpboost.mechanism as dpboost
from fedsbdt.common.boosting import LocalData
from fedsbdt.common.modes.greedy.builder import GreedyTrees
from fedsbdt.common.randomness import csprng_uint64
from fedsbdt.common.splits import Splits


def negative_gradient(pred: np.ndarray, y: np.ndarray, task: str) -> np.ndarray:
    """The exact (unclipped) negative gradient: ``y − ŷ`` (square loss) or ``y − σ(ŷ)`` (logistic loss)."""
    if task == "regression":
        return y - pred
    return y - 1.0 / (1.0 + np.exp(-pred))


@dataclass
class DPBoostTrees(GreedyTrees):
    """DPBoost's Alg. 1 per tree inside Alg. 2's ensemble of ensembles (``select`` = ε per level)."""

    eps_leaf: float = 0.0
    _part: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def ensemble_trees(self) -> int:
        """T_e (all accounted trees when ``hp.ensemble_trees`` is 0)."""
        return self.hp.ensemble_trees or self.hp.accounted_rounds

    def position(self, round_id: int) -> int:
        """1-based position t_e of tree ``round_id`` in its ensemble."""
        return round_id % self.ensemble_trees + 1

    def partition(self, round_id: int, local: LocalData) -> np.ndarray:
        """Each record's (0-based) position in the ensemble of tree ``round_id``: drawn afresh, per record and
        from the OS CSPRNG, when an ensemble starts (Alg. 2 lines 6–9)."""
        ensemble = round_id // self.ensemble_trees
        if self._part.get("key") != (ensemble, id(local)) or self._part["parts"].size != local.n:
            shares = dpboost.tree_shares(self.ensemble_trees, self.hp.learning_rate)
            self._part = {"key": (ensemble, id(local)), "parts": dpboost.draw_partition(shares, csprng_uint64(local.n))}
        return self._part["parts"]

    def records(self, round_id: int, local: LocalData) -> np.ndarray:
        """Tree ``round_id``'s records: arrived, in its part of the partition, and through GDF (|g| ≤ g*_l).
        Computed once per round, so node selection and leaf release use the same records."""
        key = ("records", round_id, id(local))
        if self._cache.get("records_key") != key:
            g = negative_gradient(local.pred, local.y, local.task)
            mask = dpboost.tree_records(self.position(round_id), round_id, g, local.arrival,
                                        self.partition(round_id, local), self.hp.grad_clip)
            self._cache["records_key"], self._cache["records"], self._cache["grad"] = key, mask, g
        return self._cache["records"]

    def release_leaves(self, round_id: int, local: LocalData, splits: Splits, randomness) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
        """Alg. 1 lines 11–14: (leaf of every record, released leaf values) for tree ``round_id``."""
        hp = self.hp
        use = self.records(round_id, local)
        g = self._cache["grad"]
        leaf = local.leaf_index(splits)
        G = np.bincount(leaf[use], weights=g[use], minlength=hp.leaves)
        n = np.bincount(leaf[use], minlength=hp.leaves)
        t = self.position(round_id)
        values = dpboost.clip_leaves(dpboost.leaf_values(G, n, hp.l2), dpboost.glc_threshold(t, hp.grad_clip,
                                                                                           hp.learning_rate))
        scale = local.enc.scale
        b = dpboost.laplace_scale_units(dpboost.leaf_sensitivity(t, hp.grad_clip, hp.l2, hp.learning_rate),
                                        self.eps_leaf, scale)
        noisy = dpboost.leaf_units(values, scale) + randomness.discrete_laplace(np.full(hp.leaves, b))
        # post-processing: the model's leaf clamp [−β, β] (as for every tree builder)
        return leaf, np.clip(noisy / scale, -hp.leaf_clip, hp.leaf_clip)
