"""Noisy level histograms: greedy node selection from released sums (docs/greedy.md, "Federated greedy").

The exponential mechanism needs exact gains, which no party of a federation
holds.  Here a level of a greedy tree is instead released as a vector of
**histograms** — per node of the level, per carried feature, per bin of the
public grid: the clipped-gradient sum and the record count — with Gaussian
noise, and the split of every node is the arg max of the gain computed from
the noisy histograms: post-processing, no extra privacy cost.  Every site can
compute its part of the vector (:func:`level_sums`), the parts add up exactly
(int64 fixed point) through secure aggregation, and the coordinator runs
:func:`select_splits` on the noisy sum.  In one process the same functions
give the central variant (``selection = "histogram"``).

Sensitivity: a record lies in one node and, per carried feature, in one bin,
so one record changes ``F`` gradient entries by ≤ g* and ``F`` count entries
by 1.  With per-entry noise ``g*·σ_s·√F/√(2·r_g)`` on gradient entries and
``σ_s·√F/√(2·(1−r_g))`` on counts the level is a Gaussian mechanism of
noise multiplier ``σ_s/√2`` — the form of S-BDT's leaf release
(:func:`fedsbdt.common.accountant.greedy_tree_event` with ``selection="histogram"``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.schema import Schema

#: gradient share of the level noise (the rest goes to the counts)
GRAD_SHARE = 0.5


@dataclass(frozen=True)
class LevelLayout:
    """Public layout of one level's vector ``[gradient histograms | count histograms]``.

    Per node (``n_nodes``) and carried feature (``features``): ``bins[k]``
    entries — numeric: ``K + 1`` bins of the grid codes; categorical: one bin
    per level plus one for codes that match no level.
    """

    n_nodes: int
    features: np.ndarray  # int64 (F,)
    bins: np.ndarray  # int64 (F,)
    categorical: np.ndarray  # bool (F,)

    @property
    def per_node(self) -> int:
        return int(self.bins.sum())

    @property
    def length(self) -> int:
        return 2 * self.n_nodes * self.per_node

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.bins)[:-1]]).astype(np.int64)

    def bin_index(self, codes: np.ndarray) -> np.ndarray:
        """Each record's entry within a node's histograms, per carried feature: ``off_k + min(code, bins[k] − 1)``
        (codes past the last bin share it), ``(n, F)`` uint16 (uint32 for nodes of ≥ 2^16 entries) — what
        :func:`child_level_sums` adds up; a function of the public grid, so it can be kept across trees."""
        dtype = np.uint16 if self.per_node < 2**16 else np.uint32
        sub = np.ascontiguousarray(codes[:, self.features], dtype)  # row-major: a record's entries in one line
        np.minimum(sub, (self.bins - 1).astype(dtype), out=sub)
        sub += self.offsets.astype(dtype)
        return sub


def level_layout(schema: Schema, edges: list, level: int, features: np.ndarray) -> LevelLayout:
    """Layout of level ``level`` carrying ``features`` (all of them, or tree r's feature when cyclical)."""
    features = np.asarray(features, np.int64)
    bins = np.array([min(len(schema.features[f].levels), kernels.NO_LEVEL) + 1 if schema.features[f].is_categorical
                     else len(edges[f]) + 1 for f in features], np.int64)
    return LevelLayout(2**level, features, bins,
                       np.array([schema.features[f].is_categorical for f in features], bool))


def level_sums(codes: np.ndarray, node: np.ndarray, grad_units: np.ndarray, present: np.ndarray,
               layout: LevelLayout) -> np.ndarray:
    """One party's level vector (int64): per node, feature, bin the clipped-gradient sum (fixed-point units)
    and the count of its present records.  ``codes``: :func:`kernels.bin_codes`; ``node``: each record's
    node at this level."""
    out = np.zeros((2, layout.n_nodes, layout.per_node), np.int64)
    rows = np.flatnonzero(present)
    base = node[rows].astype(np.int64) * layout.per_node
    g = grad_units[rows].astype(np.int64)
    for off, f, b in zip(layout.offsets, layout.features, layout.bins):
        cell = base + off + np.minimum(codes[rows, f].astype(np.int64), b - 1)
        out[0] += _int_bincount(cell, g, out[0].size).reshape(out[0].shape)
        out[1] += np.bincount(cell, minlength=out[1].size).astype(np.int64).reshape(out[1].shape)
    return out.ravel()


def root_level_sums(index: np.ndarray, grad_units: np.ndarray, present: np.ndarray,
                    layout: LevelLayout, bound: int | None = None) -> np.ndarray:
    """:func:`level_sums` of the root, equal bit for bit, as ``(2, 1, per_node)`` int64, in one numba pass
    over the records (:func:`fedsbdt.common.kernels.node_bin_sums`) from their bin indices ``index`` =
    ``layout.bin_index(codes)``; ``bound``: a bound on ``|grad_units|`` if known."""
    every = np.zeros(0, np.int64)  # no node array: every record is in node 0
    return kernels.node_bin_sums(index, every, np.zeros(1, np.int64), grad_units, np.asarray(present, np.bool_),
                                 layout.per_node, bound=bound).reshape(2, 1, layout.per_node)


def child_level_sums(index: np.ndarray, node: np.ndarray, grad_units: np.ndarray, present: np.ndarray,
                     layout: LevelLayout, parent: np.ndarray, route: tuple,
                     left: np.ndarray, bound: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The records' nodes one level down and that level's :func:`level_sums`, equal bit for bit, as
    ``(2, n_nodes, per_node)`` int64, in one numba pass over the records
    (:func:`fedsbdt.common.kernels.node_bin_sums`): ``node`` holds their nodes one level up, ``route``
    :func:`fedsbdt.common.kernels.route_level`'s arguments but ``node``, ``index`` = ``layout.bin_index(codes)``.

    ``parent`` is the level above's sums of the same features, ``(2, n_nodes / 2, per_node)``: only the
    child holding fewer present records of each parent is summed; its sibling is the parent minus it
    (exact in integers: LightGBM's histogram subtraction).  Children of parent p are nodes 2p and 2p + 1.
    The smaller children are named by ``left``, each parent's count of present records going left
    (:func:`left_counts`); which child is summed never changes the sums, only the time.  ``bound``: a bound
    on ``|grad_units|`` if known."""
    n_nodes = layout.n_nodes
    right_smaller = 2 * np.asarray(left) > parent[1, :, :layout.bins[0]].sum(axis=1)
    small = 2 * np.arange(n_nodes // 2) + right_smaller  # the smaller child of each parent
    slot = np.full(n_nodes, -1, np.int64)
    slot[small] = np.arange(small.size)
    node, part = kernels.node_bin_sums(index, node, slot, grad_units, np.asarray(present, np.bool_),
                                       layout.per_node, route, bound)
    out = np.empty((2, n_nodes, layout.per_node), np.int64)
    out[:, small] = part
    out[:, small ^ 1] = parent - part
    return node, out


def left_counts(sums: np.ndarray, layout: LevelLayout, fpos: np.ndarray, lo: np.ndarray,
                hi: np.ndarray) -> np.ndarray:
    """Per node of a level, the present records its split ``(carried feature fpos, lo ≤ code < hi)`` sends
    left, from the level's exact count histograms ``sums[1]`` (missing values counted where their code falls)."""
    start = layout.offsets[fpos]
    return np.array([sums[1, q, start[q] + lo[q]:start[q] + hi[q]].sum() for q in range(layout.n_nodes)], np.int64)


def _int_bincount(cell: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
    """Exact int64 weighted bincount: float64 partial sums of integers are exact below 2^53."""
    if weights.size and float(np.abs(weights).max()) * weights.size >= 2.0**53:
        out = np.zeros(size, np.int64)
        np.add.at(out, cell, weights)
        return out
    return np.rint(np.bincount(cell, weights=weights.astype(np.float64), minlength=size)).astype(np.int64)


def level_noise_scales(layout: LevelLayout, grad_units: int, sigma_select: float, shares: int = 1) -> np.ndarray:
    """Per-entry noise std (integer units) making the level a Gaussian mechanism of multiplier σ_s/√2;
    split into ``shares`` equal-variance shares for distributed noise."""
    F = layout.features.size
    sg = grad_units * sigma_select * math.sqrt(F) / math.sqrt(2.0 * GRAD_SHARE) / math.sqrt(shares)
    sn = sigma_select * math.sqrt(F) / math.sqrt(2.0 * (1.0 - GRAD_SHARE)) / math.sqrt(shares)
    half = layout.n_nodes * layout.per_node
    return np.concatenate([np.full(half, sg), np.full(half, sn)])


def select_splits(noisy: np.ndarray, layout: LevelLayout, scale: float, l2: float,
                  min_count: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Coordinator side (post-processing): per node the (carried-feature index, grid position) of the
    largest gain ``G_L²/(n_L+λ) + G_R²/(n_R+λ)`` on the noisy histograms.

    Numeric feature: candidate j sends bins ≤ j left (``x < edge_j``); categorical: candidate l sends bin l
    left.  A side whose noisy count is below ``min_count`` would let noise alone make a large gain
    (``noise²/λ``), so such candidates only win where no candidate has both sides above it; among
    those the most balanced split (largest smaller side) is taken.  Returns ``(feature position k,
    candidate j)`` per node."""
    v = np.asarray(noisy, np.float64).reshape(2, layout.n_nodes, layout.per_node)
    G_all, N_all = v[0] / scale, np.maximum(v[1], 0.0)
    rows = np.arange(layout.n_nodes)
    best = np.full(layout.n_nodes, -np.inf)
    best_k = np.zeros(layout.n_nodes, np.int64)
    best_j = np.zeros(layout.n_nodes, np.int64)
    bal = np.full(layout.n_nodes, -np.inf)  # fallback: the most balanced candidate
    bal_k = np.zeros(layout.n_nodes, np.int64)
    bal_j = np.zeros(layout.n_nodes, np.int64)
    for k, (off, b) in enumerate(zip(layout.offsets, layout.bins)):
        G, N = G_all[:, off:off + b], N_all[:, off:off + b]
        Gt, Nt = G.sum(axis=1, keepdims=True), N.sum(axis=1, keepdims=True)
        if layout.categorical[k]:
            GL, NL = G[:, :-1], N[:, :-1]
        else:
            GL, NL = np.cumsum(G, axis=1)[:, :-1], np.cumsum(N, axis=1)[:, :-1]
        NR, GR = np.maximum(Nt - NL, 0.0), Gt - GL
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.where(NL + l2 > 0, GL**2 / (NL + l2), 0.0) + np.where(NR + l2 > 0, GR**2 / (NR + l2), 0.0)
        smaller = np.minimum(NL, NR)
        score = np.where(smaller >= min_count, score, -np.inf)
        j = np.argmax(score, axis=1)
        better = score[rows, j] > best
        best, best_k, best_j = np.where(better, score[rows, j], best), np.where(better, k, best_k), \
            np.where(better, j, best_j)
        jb = np.argmax(smaller, axis=1)
        better = smaller[rows, jb] > bal
        bal, bal_k, bal_j = np.where(better, smaller[rows, jb], bal), np.where(better, k, bal_k), \
            np.where(better, jb, bal_j)
    none = ~np.isfinite(best)
    return np.where(none, bal_k, best_k), np.where(none, bal_j, best_j)


def count_noise(layout: LevelLayout, sigma_select: float) -> float:
    """Std of the noise on one count entry (what :func:`select_splits`'s ``min_count`` is measured in)."""
    return float(level_noise_scales(layout, 1, sigma_select)[-1])


# --------------------------------------------------------------------------- adaptive Hessian sketch


def sketch_sums(codes: np.ndarray, hess_units: np.ndarray, present: np.ndarray, features: np.ndarray,
                bins: int) -> np.ndarray:
    """Per sketched (numeric) feature the Hessian sum of the present records in each of ``bins`` fine-grid
    bins (int64, ``(len(features), bins)``): the data of the adaptive Hessian sketch (Maddock et al. 2022,
    paper §4.1)."""
    out = np.zeros((len(features), bins), np.int64)
    rows = np.flatnonzero(present)
    h = hess_units[rows].astype(np.int64)
    for k, f in enumerate(features):
        out[k] = _int_bincount(np.minimum(codes[rows, f].astype(np.int64), bins - 1), h, bins)
    return out


def sketch_noise_scale(features: int, hess_units: int, sigma_sketch: float) -> float:
    """Per-entry noise std making the sketch a Gaussian of multiplier σ_k/√2 (a record adds ≤ h* to one bin of
    each of the ``features`` sketched features: L2 sensitivity √F·h*)."""
    return hess_units * sigma_sketch * math.sqrt(features) / math.sqrt(2.0)


def sketch_candidates(noisy: np.ndarray, candidates: int) -> list[np.ndarray]:
    """Post-processing: per feature the fine-grid edges (indices) at the quantiles j/(K+1), j = 1…K, of the
    noisy Hessian mass, so each candidate interval holds about equal Hessian weight.  Edge e splits bins
    ≤ e from the rest; without positive mass the uniform subset is kept."""
    out = []
    for row in np.asarray(noisy, np.float64):
        n_edges = row.size - 1
        mass = np.cumsum(np.maximum(row, 0.0))[:n_edges]
        total = float(np.maximum(row, 0.0).sum())
        if not total > 0:
            out.append(np.unique(np.linspace(0, n_edges - 1, min(candidates, n_edges)).round().astype(np.int64)))
            continue
        q = total * np.arange(1, candidates + 1) / (candidates + 1)
        out.append(np.unique(np.minimum(np.searchsorted(mass, q), n_edges - 1)))
    return out
