"""The central builder of greedy trees: DP-XGB of "Revisiting DP-XGBoost" (§4, Alg. 1/3; docs/greedy.md).

Level by level, every node picks a (feature, candidate threshold) from the public grid with the exponential
mechanism over the gain (eq. 2, :func:`fedsbdt.common.builders.gains`) of add/remove sensitivity ``3·g*²``
(:func:`fedsbdt.common.builders.score_sensitivity`), or the arg max of noisy level histograms
(``selection = "histogram"``, the federation's rule).  Missing values: (split, direction) pairs in the
exponential mechanism, or the right-most histogram bin (docs/missing-values.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.boosting import LocalData
from fedsbdt.common.builders import (EXACT_FLOAT_SUM, MIN_COUNT_SIGMAS, Candidates, float_scores, histogram_scores,
                                     missing_sums, score_sensitivity)
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.modes.greedy.levels import (child_level_sums, count_noise, left_counts, level_layout,
                                                level_noise_scales, root_level_sums, select_splits,
                                                sketch_candidates, sketch_noise_scale, sketch_sums)
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import Splits


@dataclass
class GreedyTrees:
    """DP-XGB node selection (paper §4.2) on the public grid of ``hp.split_candidates`` thresholds.

    ``hp.selection = "exponential"``: the exponential mechanism on the exact gains with ε ``select``;
    ``"histogram"``: the arg max of the gains of noisy level histograms with noise σ_s = ``select``
    (:mod:`fedsbdt.common.modes.greedy.levels`, the federation's rule)."""

    schema: Schema
    hp: Hyperparameters
    select: float  # ε of the exponential mechanism per level, or σ_s of the level histograms
    sigma_sketch: float = 0.0  # σ_k of the adaptive Hessian sketch (0: the uniform grid is the candidate set)
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        K = self.hp.split_candidates
        # with a sketch the candidates of a tree are chosen among a fine public grid of min(255, 4K) edges
        self.candidates, self.edges = Candidates.grid(self.schema, min(255, 4 * K) if self.sigma_sketch > 0 else K)
        self.is_cat = np.array([f.is_categorical for f in self.schema.features])
        self.cand_start = np.searchsorted(self.candidates.feature, np.arange(self.schema.n_features))

    def _codes(self, local: LocalData) -> np.ndarray:
        key = self._cache.get("key")
        if key is None or key is not local.X:
            self._cache["codes"] = kernels.bin_codes(local.X, self.edges, self.is_cat)
            self._cache["key"] = local.X
        return self._cache["codes"]

    def _layouts(self, features: np.ndarray) -> list:
        """The level layouts of a tree carrying ``features``, kept while they stay the same."""
        key = features.tobytes()
        cached = self._cache.get("layouts")
        if cached is None or cached[0] != key:
            cached = self._cache["layouts"] = key, [level_layout(self.schema, self.edges, level, features)
                                                    for level in range(self.hp.depth)]
        return cached[1]

    def _bin_index(self, local: LocalData, layout) -> np.ndarray:
        """``layout.bin_index`` of the records, kept while the records and the carried features stay."""
        key = (local.X, layout.features.tobytes())
        cached = self._cache.get("bin_index")
        if cached is None or cached[0][0] is not key[0] or cached[0][1] != key[1]:
            cached = self._cache["bin_index"] = key, layout.bin_index(self._codes(local))
        return cached[1]

    def _missing(self, local: LocalData) -> tuple[np.ndarray, list]:
        """``(miss, rows)``: the NaN mask of the records and, per feature, the rows where it is NaN."""
        if self._cache.get("miss_key") is not local.X:
            miss = np.isnan(local.X)
            self._cache["missing"] = miss, [np.flatnonzero(miss[:, f]) for f in range(miss.shape[1])]
            self._cache["miss_key"] = local.X
        return self._cache["missing"]

    def records(self, round_id: int, local: LocalData) -> np.ndarray:
        """The records tree ``round_id`` may use (bool mask): here every record that has arrived."""
        return local.arrival <= round_id

    def scale(self, grad_clip: float) -> float:
        """Scale of the exponential mechanism ``P ∝ exp(score/scale)``: ``2Δ/ε_select``."""
        return 2.0 * score_sensitivity(grad_clip) / self.select

    def splits(self, round_id: int, local: LocalData, randomness) -> Splits:
        hp, enc, cand = self.hp, local.enc, self.candidates
        gq, _ = local.grad_hess_units()
        records = self.records(round_id, local)
        codes = self._codes(local)
        allowed = np.ones(cand.feature.size, bool)
        if hp.cyclical:
            allowed = cand.feature == round_id % self.schema.n_features
        if self.sigma_sketch > 0:
            allowed &= self._sketch(local, codes, records, allowed, randomness)
        idx = np.flatnonzero(allowed)
        features = np.unique(cand.feature[idx])
        fpos = np.searchsorted(features, cand.feature[idx])
        g_star = enc.grad.bound_units / enc.scale
        scale, sensitivity = self.scale(g_star), score_sensitivity(g_star)
        node = np.zeros(local.n, np.int64)
        chosen = np.zeros(hp.leaves - 1, np.int64)  # candidate index per inner node
        # missing values (docs/missing-values.md): the exponential mechanism picks (split, direction) pairs;
        # the noisy level histograms hold missing values in the right-most bin, so there they go right
        directed = self.schema.allows_missing and hp.selection != "histogram"
        default_left = np.zeros(hp.leaves - 1, bool)
        miss, miss_rows = self._missing(local) if directed else (None, None)
        # the integer histograms give the float path's gains bit for bit while no float sum of g = gq/scale
        # can leave the exact range (|sum| < 2^53 units); beyond it the float path runs as it always did
        exact = hp.selection == "histogram" or local.n * enc.grad.bound_units < EXACT_FLOAT_SUM
        if directed or not exact:
            g, present = gq / enc.scale, records.astype(np.float64)  # g clipped to g* = bound_units / scale
        sums = None
        layouts = self._layouts(features)
        index = self._bin_index(local, layouts[0]) if exact else None  # the same for every level
        for level, layout in enumerate(layouts):
            n_nodes, first = 2**level, 2**level - 1
            if exact and sums is None:  # the root; below it the routing pass sums the levels
                sums = root_level_sums(index, gq, records, layout, enc.grad.bound_units)
            if hp.selection == "histogram":
                noisy = sums.ravel() + randomness.discrete_gaussian(
                    level_noise_scales(layout, enc.grad.bound_units, self.select))
                k, j = select_splits(noisy, layout, enc.scale, hp.l2,
                                     min_count=MIN_COUNT_SIGMAS * count_noise(layout, self.select))
                chosen[first:first + n_nodes] = self.cand_start[features[k]] + j
            else:
                missing = missing_sums(miss_rows, node, g * present, present, n_nodes, features) if directed \
                    else None
                lo, hi = cand.lo[idx], cand.hi[idx]
                if exact:
                    score = histogram_scores(sums, layout, fpos, lo, hi, enc.scale, hp.l2, missing)
                else:
                    score = float_scores(codes, node, g, present, n_nodes, features, fpos, lo, hi, hp.l2, missing)
                # one draw per node over its candidates (directed: with missing values right, then left)
                pick = randomness.exponential_mechanism(score, scale, sensitivity)
                chosen[first:first + n_nodes] = idx[pick % idx.size]
                default_left[first:first + n_nodes] = pick >= idx.size
            # route every record to its child (heap order: left 2k+1, right 2k+2); below the last level: its leaf
            split = (codes, first, cand.feature[chosen], cand.lo[chosen], cand.hi[chosen], miss, default_left)
            if exact and level + 1 < hp.depth:  # == level_sums(codes, routed node, gq, records, next layout)
                c = chosen[first:first + n_nodes]
                pos = np.searchsorted(features, cand.feature[c])
                left = left_counts(sums, layout, pos, cand.lo[c], cand.hi[c])
                node, sums = child_level_sums(index, node, gq, records, layouts[level + 1], sums, split, left,
                                              enc.grad.bound_units)
            else:
                node = kernels.route_level(codes, node, *split[1:])
        out = Splits(cand.feature[chosen].astype(np.int32), cand.threshold[chosen].astype(np.float64),
                     default_left if self.schema.allows_missing else None)
        local.keep_leaves(out, node)  # the records' leaves, for the leaf sums of this tree
        return out


    def _sketch(self, local: LocalData, codes: np.ndarray, present: np.ndarray, allowed: np.ndarray,
                randomness) -> np.ndarray:
        """Adaptive Hessian sketch: the noisy Hessian mass per fine bin of every numeric feature in play
        (a Gaussian release) and, as post-processing, K candidates per feature at its quantiles.  Returns
        the mask of candidates kept (categorical ones all)."""
        enc, cand = local.enc, self.candidates
        _, hq = local.grad_hess_units()
        feats = np.unique(cand.feature[allowed & ~self.is_cat[cand.feature]])
        keep = self.is_cat[cand.feature].copy()
        if feats.size == 0:
            return keep
        scale = sketch_noise_scale(feats.size, enc.hess.bound_units, self.sigma_sketch)
        for f in feats:
            sums = sketch_sums(codes, hq, present, np.array([f]), len(self.edges[f]) + 1)
            noisy = sums + randomness.discrete_gaussian(np.full(sums.size, scale)).reshape(sums.shape)
            keep[self.cand_start[f] + sketch_candidates(noisy, self.hp.split_candidates)[0]] = True
        return keep
