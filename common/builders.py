"""Tree builders: where the inner nodes of a round's tree come from (docs/greedy.md).

* :class:`RandomTrees` — S-BDT: public, data-independent random splits
  (:func:`fedsbdt.common.splits.random_splits`); they cost no privacy.
* :class:`GreedyTrees` — DP-XGB of "Revisiting DP-XGBoost" (§4, Alg. 1/3):
  level by level, every node picks a (feature, candidate threshold) from the
  public grid with the exponential mechanism over the gain
  ``score = G_L²/(n_L + λ) + G_R²/(n_R + λ)`` (eq. 2; gradient sums G over
  the node's records, counts n), which has add/remove sensitivity
  ``Δ = 3·g*²`` (Li et al. 2022, Lemma 2; :func:`score_sensitivity`).  The
  nodes of a level hold disjoint records, so one level is one ε_select
  bounded-range release (parallel composition), charged by the accountant
  with Thm. 1 (:func:`fedsbdt.common.accountant.greedy_tree_event`).  The cyclical
  variant (XGB_cyc) lets tree r choose only among feature ``r mod m``.

Missing values (docs/missing-values.md): random trees take public default
directions from the split seed; greedy trees choose (split, direction) pairs in
the exponential mechanism (same sensitivity), or send missing values right
with noisy level histograms (their last bin, counted right by every candidate).

Both return a :class:`~fedsbdt.common.splits.Splits` (complete tree, heap order), so
leaf release, model, exports and the federation see the same kind of tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.modes.sarus import mechanism as sarus
from .accountant import PrivacyCalibration
from .boosting import LocalData, split_edges
from .config import Hyperparameters
from fedsbdt.common.modes.greedy.levels import (child_level_sums, count_noise, left_counts, level_layout, level_noise_scales,
                            root_level_sums, select_splits, sketch_candidates, sketch_noise_scale, sketch_sums)
from .schema import Schema
from .splits import Splits, random_splits


#: float64 sums of integers are exact while every partial sum stays below this magnitude
EXACT_FLOAT_SUM = 2**53

#: histogram selection ignores splits with a side whose noisy count is below this many noise stds
MIN_COUNT_SIGMAS = 3.0


class TreeBuilder(Protocol):
    def splits(self, round_id: int, local: LocalData, randomness) -> Splits:
        """The inner nodes of tree ``round_id`` (may look at ``local``'s records only through a DP release)."""


@dataclass(frozen=True)
class RandomTrees:
    """S-BDT's public random splits (Alg. 4 line 2): data-independent, free of privacy cost."""

    schema: Schema
    hp: Hyperparameters

    def splits(self, round_id: int, local: LocalData, randomness) -> Splits:
        hp = self.hp
        return random_splits(self.schema, hp.depth, hp.seed, round_id, hp.cyclical, hp.split_candidates)


def score_sensitivity(grad_clip: float) -> float:
    """Add/remove sensitivity of the gain (eq. 2): ``3·g*²`` for any λ ≥ 0 (Li et al. 2022, Lemma 2).

    One record sits in one child of one node; ``|(G+g)²/(n+1+λ) − G²/(n+λ)|``
    with ``|G| ≤ n·g*``, ``|g| ≤ g*`` is below ``3·g*²`` (attained as n → ∞
    with G = n·g*, g = −g*)."""
    return 3.0 * float(grad_clip) ** 2


def gains(G_left: np.ndarray, n_left: np.ndarray, G: np.ndarray, n: np.ndarray, l2: float) -> np.ndarray:
    """Eq. 2 for every candidate: ``G_L²/(n_L+λ) + G_R²/(n_R+λ)`` (an empty side scores 0)."""
    G_right, n_right = G - G_left, n - n_left
    with np.errstate(divide="ignore", invalid="ignore"):
        left = np.where(n_left + l2 > 0, G_left**2 / (n_left + l2), 0.0)
        right = np.where(n_right + l2 > 0, G_right**2 / (n_right + l2), 0.0)
    return left + right


@dataclass(frozen=True)
class Candidates:
    """The public split grid: per candidate its feature, threshold and the code test ``lo ≤ code < hi``."""

    feature: np.ndarray  # int32 (C,)
    threshold: np.ndarray  # float64 (C,)
    lo: np.ndarray  # int64 (C,)
    hi: np.ndarray  # int64 (C,)

    @classmethod
    def grid(cls, schema: Schema, split_candidates: int) -> tuple["Candidates", list]:
        """Numeric feature: its edges (``x < edge`` ⟺ ``code ≤ j``); categorical: one level against the rest."""
        edges = [None if e is None else np.unique(np.asarray(e, np.float64))
                 for e in split_edges(schema, split_candidates)]
        return cls.from_edges(schema, edges), edges

    @classmethod
    def from_edges(cls, schema: Schema, edges: list) -> "Candidates":
        """The grid of sorted thresholds ``edges[f]`` per numeric feature (categorical: every level)."""
        feat, thr, lo, hi = [], [], [], []
        for f, feature in enumerate(schema.features):
            if feature.is_categorical:
                levels = min(len(feature.levels), kernels.NO_LEVEL)
                j = np.arange(levels)
                feat.append(np.full(levels, f)), thr.append(j.astype(np.float64)), lo.append(j), hi.append(j + 1)
            else:
                e = edges[f]
                j = np.arange(e.size)
                feat.append(np.full(e.size, f)), thr.append(e), lo.append(np.zeros(e.size, np.int64))
                hi.append(j + 1)
        return cls(np.concatenate(feat).astype(np.int32), np.concatenate(thr),
                   np.concatenate(lo).astype(np.int64), np.concatenate(hi).astype(np.int64))


def level_histograms(codes: np.ndarray, node: np.ndarray, weight: np.ndarray, n_nodes: int,
                     features: np.ndarray) -> np.ndarray:
    """``(len(features), n_nodes, 257)`` cumulative histograms: ``[k, q, c]`` = Σ weight over the records of
    node q whose code of feature ``features[k]`` is < c (so a code test ``lo ≤ code < hi`` sums to
    ``H[.., hi] − H[.., lo]``)."""
    out = np.zeros((len(features), n_nodes, 257))
    base = node.astype(np.int64) * 256
    for k, f in enumerate(features):
        h = np.bincount(base + codes[:, f], weights=weight, minlength=n_nodes * 256).reshape(n_nodes, 256)
        np.cumsum(h, axis=1, out=out[k, :, 1:])
    return out


def pair_gains(G_left: np.ndarray, n_left: np.ndarray, G_missing: np.ndarray, n_missing: np.ndarray,
               G: np.ndarray, n: np.ndarray, l2: float) -> np.ndarray:
    """Eq. 2 for every (candidate, direction) pair: first every candidate with the node's missing records on
    the right (``G_left``, ``n_left`` count present values only), then every candidate with them on the left.
    Each pair is a partition of the node's records into two children, so one record moves one side by
    ``(g, 1)`` and :func:`score_sensitivity` bounds every pair (docs/missing-values.md)."""
    return np.concatenate([gains(G_left, n_left, G, n, l2), gains(G_left + G_missing, n_left + n_missing, G, n, l2)])


def missing_sums(miss_rows: list, node: np.ndarray, weight: np.ndarray, present: np.ndarray, n_nodes: int,
                 features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(G, N)``, each ``(len(features), n_nodes)``: per node the sum of ``weight`` and the count of the present
    records whose value of ``features[k]`` is missing (``miss_rows[f]``: the rows where feature f is NaN),
    i.e. the mass a default direction moves."""
    G = np.zeros((len(features), n_nodes))
    N = np.zeros((len(features), n_nodes))
    for k, f in enumerate(features):
        m = miss_rows[f]
        G[k] = np.bincount(node[m], weights=weight[m], minlength=n_nodes)
        N[k] = np.bincount(node[m], weights=present[m], minlength=n_nodes)
    return G, N


def float_scores(codes: np.ndarray, node: np.ndarray, g: np.ndarray, present: np.ndarray, n_nodes: int,
                 features: np.ndarray, fpos: np.ndarray, lo: np.ndarray, hi: np.ndarray, l2: float,
                 missing: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """:func:`histogram_scores` from float histograms of ``g·present`` (:func:`level_histograms`): the
    straightforward computation, kept for sums beyond the exact range of float64."""
    HG = level_histograms(codes, node, g * present, n_nodes, features)
    HN = level_histograms(codes, node, present, n_nodes, features)
    out = []
    for q in range(n_nodes):
        GL = HG[fpos, q, hi] - HG[fpos, q, lo]
        NL = HN[fpos, q, hi] - HN[fpos, q, lo]
        if missing is None:
            out.append(gains(GL, NL, HG[0, q, 256], HN[0, q, 256], l2))
        else:
            out.append(pair_gains(GL, NL, missing[0][fpos, q], missing[1][fpos, q], HG[0, q, 256], HN[0, q, 256],
                                  l2))
    return np.array(out)


def histogram_scores(sums: np.ndarray, layout, fpos: np.ndarray, lo: np.ndarray, hi: np.ndarray, scale: float,
                     l2: float, missing: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Eq. 2 of every candidate ``(fpos, lo, hi)`` at every node of a level, ``(n_nodes, C)`` (``2C`` with
    ``missing``: :func:`pair_gains`), from the level's exact integer histograms ``sums``
    (:func:`fedsbdt.common.modes.greedy.levels.child_level_sums`; gradients in units of ``1/scale``).

    A candidate's side is a range of bins, so ``G_L`` is a difference of the bins' prefix sums — exact
    integers, equal to the float sums of ``g = g_units/scale`` in any order while every partial sum stays
    below 2^53 units (``scale`` is a power of two), so the scores equal :func:`level_histograms`' bit for
    bit (tests/test_greedy_fast.py)."""
    off = layout.offsets
    return kernels.level_gains(sums, off[fpos] + lo, off[fpos] + hi, (off[0], off[0] + layout.bins[0]), scale, l2,
                               None if missing is None else (missing[0][fpos], missing[1][fpos]))


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


def leaf_regions(stopped: np.ndarray, depth: int) -> np.ndarray:
    """Per leaf of the complete tree (heap order), the heap index of the released leaf it belongs to: its
    highest stopped ancestor, or itself (``stopped``: per inner node, whether it stayed unsplit)."""
    leaves = 2**depth
    out = np.empty(leaves, np.int64)
    for j in range(leaves):
        k, region = leaves - 1 + j, leaves - 1 + j
        while k > 0:
            k = (k - 1) // 2
            if stopped[k]:
                region = k
        out[j] = region
    return out


def tree_builder_for(hp: Hyperparameters, schema: Schema, cal: PrivacyCalibration) -> TreeBuilder:
    """The strategy ``hp.tree_builder`` names, with the calibrated selection budget for greedy trees."""
    if hp.tree_builder == "dpboost":
        from fedsbdt.common.modes.dpboost.builder import DPBoostTrees

        return DPBoostTrees(schema, hp, cal.eps_select, eps_leaf=cal.eps_leaf)
    if hp.tree_builder == "sarus":
        return SarusTrees(schema, hp, sarus.TreeBudget.split(cal.eps_sketch / sarus.SKETCH_SHARE, hp.depth))
    if hp.tree_builder == "greedy":
        return GreedyTrees(schema, hp, cal.eps_select if hp.selection == "exponential" else cal.sigma_select,
                           cal.sigma_sketch)
    return RandomTrees(schema, hp)
