"""Federated greedy trees: the public parts of a ``level`` round (docs/greedy.md, "Federated greedy").

Both parties derive everything here from the pinned plan: the candidate grid
(the public ``split_candidates`` thresholds per numeric feature, one "= level"
candidate per categorical level), the features a level carries (all, or
feature ``r mod m`` for tree r when cyclical), the layout and length of a
level's vector, its per-entry noise, the routing of records through the splits
released so far, and the coordinator's post-processing (noisy histograms →
one split per node, :func:`fedsbdt.common.modes.greedy.levels.select_splits`).

A split travels as ``(feature, threshold)`` exactly as in a released tree; a
site maps it back to its grid candidate and refuses anything off the grid
(:class:`GreedyRequestError`).  Side-effect free: the state machines in
``server/session.py`` and ``client/site.py`` call these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.builders import MIN_COUNT_SIGMAS, Candidates
from fedsbdt.common.modes.greedy.levels import LevelLayout, count_noise, level_layout, level_noise_scales, select_splits


class GreedyRequestError(ValueError):
    """A level request (or a released greedy tree) does not fit the plan's public grid or earlier releases."""


@dataclass(frozen=True)
class GreedyGrid:
    """The plan's public candidate grid and the shape of its level rounds."""

    schema: object  # fedsbdt.common.schema.Schema
    depth: int
    cyclical: bool
    candidates: Candidates
    edges: list
    is_cat: np.ndarray
    cand_start: np.ndarray  # first candidate index of every feature

    @classmethod
    def for_plan(cls, schema, hp) -> "GreedyGrid":
        cand, edges = Candidates.grid(schema, hp.split_candidates)
        return cls(schema, hp.depth, hp.cyclical, cand, edges,
                   np.array([f.is_categorical for f in schema.features]),
                   np.searchsorted(cand.feature, np.arange(schema.n_features)))

    # ------------------------------------------------------------------ shapes

    def features(self, tree: int) -> np.ndarray:
        """The features tree ``tree``'s levels carry: all of them, or ``tree mod m`` (cyclical, XGB_cyc)."""
        m = self.schema.n_features
        return np.array([tree % m]) if self.cyclical else np.arange(m)

    def layout(self, tree: int, level: int) -> LevelLayout:
        return level_layout(self.schema, self.edges, level, self.features(tree))

    def max_vector_len(self) -> int:
        """The longest level vector of any tree (the deepest level carrying the most features)."""
        trees = range(self.schema.n_features) if self.cyclical else (0,)
        return max(self.layout(r, self.depth - 1).length for r in trees)

    def noise_scales(self, tree: int, level: int, grad_units: int, sigma_select: float, shares: int = 1) -> np.ndarray:
        """Per-entry noise std (integer units) of one of ``shares`` equal shares of the level's noise."""
        return level_noise_scales(self.layout(tree, level), grad_units, sigma_select, shares)

    def max_noise_scale(self, grad_units: int, sigma_select: float, shares: int) -> float:
        trees = range(self.schema.n_features) if self.cyclical else (0,)
        return max(float(self.noise_scales(r, 0, grad_units, sigma_select, shares).max()) for r in trees)

    # ------------------------------------------------------------------ splits on the grid

    def candidate_index(self, tree: int, features, thresholds) -> np.ndarray:
        """The grid candidate of every ``(feature, threshold)``; GreedyRequestError if one is not a candidate
        of tree ``tree`` (wrong feature for a cyclical tree, or a threshold off the plan's grid)."""
        features = np.asarray(features, np.int64)
        thresholds = np.asarray(thresholds, np.float64)
        if features.shape != thresholds.shape or features.ndim != 1:
            raise GreedyRequestError("splits must be matching lists of features and thresholds")
        allowed = set(self.features(tree).tolist())
        cand = self.candidates
        out = np.empty(features.size, np.int64)
        for i, (f, t) in enumerate(zip(features.tolist(), thresholds.tolist())):
            if f not in allowed:
                raise GreedyRequestError(f"node {i}: feature {f} is not a candidate feature of tree {tree}")
            lo = int(self.cand_start[f])
            hi = int(self.cand_start[f + 1]) if f + 1 < self.cand_start.size else cand.feature.size
            j = np.flatnonzero(cand.threshold[lo:hi] == t)
            if j.size != 1:
                raise GreedyRequestError(f"node {i}: threshold {t!r} of feature {f} is not on the plan's grid")
            out[i] = lo + int(j[0])
        return out

    def codes(self, X: np.ndarray) -> np.ndarray:
        """Grid codes of the records (bin of every feature), what routing and level sums read."""
        return kernels.bin_codes(X, self.edges, self.is_cat)

    def route(self, codes: np.ndarray, chosen: np.ndarray, level: int) -> np.ndarray:
        """Each record's node (0 … 2^level − 1) at ``level``, through the candidates ``chosen`` of the
        2^level − 1 inner nodes above it (heap order; left child 2q, right 2q + 1 within a level)."""
        cand = self.candidates
        node = np.zeros(codes.shape[0], np.int64)
        rows = np.arange(codes.shape[0])
        for e in range(level):
            c = chosen[2**e - 1 + node]
            code = codes[rows, cand.feature[c]].astype(np.int64)
            node = 2 * node + ~((cand.lo[c] <= code) & (code < cand.hi[c]))
        return node

    # ------------------------------------------------------------------ the coordinator's post-processing

    def select(self, noisy: np.ndarray, tree: int, level: int, scale: float, l2: float,
               sigma_select: float) -> tuple[np.ndarray, np.ndarray]:
        """(features, thresholds) of the 2^level nodes of ``level``: the arg max of the gain on the noisy
        level histograms (post-processing; the same rule as central ``selection = "histogram"``)."""
        layout = self.layout(tree, level)
        k, j = select_splits(noisy, layout, scale, l2,
                             min_count=MIN_COUNT_SIGMAS * count_noise(layout, sigma_select))
        c = self.cand_start[layout.features[k]] + j
        return self.candidates.feature[c].astype(np.int32), self.candidates.threshold[c].astype(np.float64)
