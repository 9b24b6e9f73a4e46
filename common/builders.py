"""What the central tree builders share (docs/greedy.md): where the inner nodes of a round's tree come from.

Each mode's package holds its own builder (``Mode.central_builder``): random trees' public random splits
(``common/modes/random/builder.py``), greedy trees' exponential mechanism or noisy level histograms
(``common/modes/greedy/builder.py``), DPBoost's and Sarus' (``common/modes/{dpboost,sarus}/builder.py``).
This module holds what they (and the federated rounds) share, and names no mode:

* :class:`TreeBuilder` — the protocol: ``splits(round_id, local, randomness)``;
* the gain ``score = G_L²/(n_L + λ) + G_R²/(n_R + λ)`` (eq. 2 of "Revisiting DP-XGBoost"; :func:`gains`,
  :func:`pair_gains` with missing values' directions) and its add/remove sensitivity ``Δ = 3·g*²`` (Li et al.
  2022, Lemma 2; :func:`score_sensitivity`);
* the public split grid (:class:`Candidates`), the level histograms and their scores (:func:`level_histograms`,
  :func:`histogram_scores`, :func:`float_scores`, :func:`missing_sums`), and the released leaves of a tree
  whose nodes may stop (:func:`leaf_regions`).

Every builder returns a :class:`~fedsbdt.common.splits.Splits` (complete tree, heap order), so leaf release,
model, exports and the federation see the same kind of tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedsbdt.common import kernels

from .boosting import LocalData, split_edges
from .schema import Schema
from .splits import Splits


#: float64 sums of integers are exact while every partial sum stays below this magnitude
EXACT_FLOAT_SUM = 2**53

#: histogram selection ignores splits with a side whose noisy count is below this many noise stds
MIN_COUNT_SIGMAS = 3.0


class TreeBuilder(Protocol):
    def splits(self, round_id: int, local: LocalData, randomness) -> Splits:
        """The inner nodes of tree ``round_id`` (may look at ``local``'s records only through a DP release)."""


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
