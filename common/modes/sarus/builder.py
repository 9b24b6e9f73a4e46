"""The central builder of Sarus DP-XGBoost trees (docs/sarus.md): whole trees, leaves included."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.boosting import LocalData
from fedsbdt.common.builders import Candidates, leaf_regions, level_histograms
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.modes.greedy.levels import sketch_candidates, sketch_sums
import fedsbdt.common.modes.sarus.mechanism as sarus
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import Splits


@dataclass
class SarusTrees:
    """Sarus DP-XGBoost trees (:mod:`fedsbdt.common.modes.sarus.mechanism`, docs/sarus.md): on a Poisson subsample, a Laplace Hessian
    sketch chooses ``hp.split_candidates`` thresholds per numeric feature among a fine equal-width grid, the
    noisy count of each node decides whether it may split, the exponential mechanism picks its (feature,
    candidate), and the leaves are released with Laplace noise.  It releases whole trees
    (:meth:`release_tree`): its leaves are not S-BDT's."""

    schema: Schema
    hp: Hyperparameters
    budget: sarus.TreeBudget
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.candidates, self.edges = Candidates.grid(self.schema, min(255, 4 * self.hp.split_candidates))
        self.is_cat = np.array([f.is_categorical for f in self.schema.features])
        self.cand_start = np.searchsorted(self.candidates.feature, np.arange(self.schema.n_features))

    def _codes(self, local: LocalData) -> np.ndarray:
        if self._cache.get("key") is not local.X:
            self._cache["codes"] = kernels.bin_codes(local.X, self.edges, self.is_cat)
            self._cache["key"] = local.X
        return self._cache["codes"]

    def sketch(self, codes: np.ndarray, sampled: np.ndarray, randomness) -> np.ndarray:
        """The noisy equal-width histograms (one Laplace release of L1 sensitivity m) and, as post-processing,
        the candidates at their weighted quantiles.  Returns the mask of candidates kept (categorical: all)."""
        cand, K = self.candidates, self.hp.split_candidates
        keep = self.is_cat[cand.feature].copy()
        feats = np.flatnonzero(~self.is_cat)
        if feats.size == 0:
            return keep
        ones = np.ones(codes.shape[0], np.int64)
        for f in feats:
            counts = sketch_sums(codes, ones, sampled, np.array([f]), len(self.edges[f]) + 1)
            noisy = sarus.release_histograms(counts, feats.size, self.budget.sketch, randomness)
            keep[self.cand_start[f] + sketch_candidates(noisy, K)[0]] = True
        return keep

    def release_tree(self, round_id: int, local: LocalData, randomness) -> tuple[Splits, np.ndarray, np.ndarray]:
        """Tree ``round_id``: its splits, the leaf of every local record, and the released leaf values."""
        hp, enc, cand = self.hp, local.enc, self.candidates
        N, h = hp.min_child_weight, hp.hess_clip_for(local.task)  # h: every record's Hessian taken as h*
        gq, _ = local.grad_hess_units()
        g_star = enc.grad.bound_units / enc.scale
        g = gq / enc.scale  # clipped to g*
        sampled = np.asarray(randomness.subsample(hp.subsample, local.ids, round_id), bool) & \
            (local.arrival <= round_id)
        w = sampled.astype(np.float64)
        codes = self._codes(local)
        idx = np.flatnonzero(self.sketch(codes, sampled, randomness))
        features = np.unique(cand.feature[idx])
        fpos = np.searchsorted(features, cand.feature[idx])
        lo, hi = cand.lo[idx], cand.hi[idx]
        em_sensitivity = sarus.score_sensitivity(g_star, h)
        em_scale = 2.0 * em_sensitivity / self.budget.select
        inner = hp.leaves - 1
        node = np.zeros(local.n, np.int64)
        chosen = np.zeros(inner, np.int64)  # candidate index per inner node
        stopped = np.zeros(inner, bool)
        rows = np.arange(local.n)
        for level in range(hp.depth):
            n_nodes, first = 2**level, 2**level - 1
            G_node = np.bincount(node, weights=g * w, minlength=n_nodes)
            n_node = np.bincount(node, weights=w, minlength=n_nodes)
            if features.size:
                HG = level_histograms(codes, node, g * w, n_nodes, features)
                HN = level_histograms(codes, node, w, n_nodes, features)
            # one Laplace release per level: the nodes' counts (disjoint records, sensitivity 1)
            noisy_n = sarus.release_counts(np.rint(n_node), self.budget.count, randomness)
            for q in range(n_nodes):
                k = first + q
                if (k > 0 and stopped[(k - 1) // 2]) or idx.size == 0 or not sarus.may_split(noisy_n[q], N):
                    stopped[k] = True
                    continue
                GL, NL = HG[fpos, q, hi] - HG[fpos, q, lo], HN[fpos, q, hi] - HN[fpos, q, lo]
                u = sarus.split_utilities(GL, NL, G_node[q], n_node[q], N, hp.l2, h)
                chosen[k] = idx[randomness.exponential_mechanism(u, em_scale, em_sensitivity)]
            c = chosen[first + node]  # a stopped node keeps candidate 0: its records' region is the node
            code = codes[rows, cand.feature[c]].astype(np.int64)
            node = 2 * node + ~((cand.lo[c] <= code) & (code < cand.hi[c]))
        splits = Splits(cand.feature[chosen].astype(np.int32), cand.threshold[chosen].astype(np.float64))
        leaf = local.leaf_index(splits)
        region = leaf_regions(stopped, hp.depth)[leaf]  # the released leaf each record falls in
        G_r = np.bincount(region, weights=g * w, minlength=hp.leaves + inner)
        n_r = np.bincount(region, weights=w, minlength=hp.leaves + inner)
        used = np.unique(leaf_regions(stopped, hp.depth))
        noisy = sarus.release_leaves(G_r[used], n_r[used], g_star, N, hp.l2, h, self.budget.leaf, enc.scale,
                                     randomness)
        value_of = np.zeros(hp.leaves + inner)
        value_of[used] = np.clip(noisy, -hp.leaf_clip, hp.leaf_clip)  # post-processing
        return splits, leaf, value_of[leaf_regions(stopped, hp.depth)]
