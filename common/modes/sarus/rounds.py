"""Federated Sarus DP-XGBoost: the public parts of its rounds (docs/sarus.md "Federation").

Per tree r, on every site's own Poisson subsample of rate γ (drawn once per tree, kept in the site's
database), the federation runs d + 2 secure-aggregation rounds, each a Gaussian release (distributed
discrete-Gaussian shares, or the coordinator's noise in central mode):

1. ``sketch`` (``Purpose.SKETCH``): per numeric feature the equal-width count histogram of the subsample on
   the public fine grid (4K bins, as central Sarus).  One record adds 1 to one bin of each of the m
   histograms: L2 sensitivity √m.  The coordinator keeps, per feature, the K edges at the weighted
   quantiles of the noisy histogram (:func:`fedsbdt.common.modes.greedy.levels.sketch_candidates`, the central code's
   post-processing); the released noisy histograms travel with every later request of the tree, and each
   site recomputes the candidates from them (:meth:`SarusGrid.tree_grid`).
2. ``level`` e = 0 … d − 1: per node, per feature, per bin between the tree's candidates the clipped
   gradient sum and the count (:func:`fedsbdt.common.modes.greedy.levels.level_sums`, as federated greedy).  The coordinator
   reads each node's noisy count off the count histograms, lets a node split only if it reaches 2N
   (``min_child_weight`` decided privately, :func:`fedsbdt.common.modes.sarus.mechanism.may_split`), and takes the arg max of the
   clamped gain ``G_L²/(h·max(n_L,N)+λ) + G_R²/(h·max(n_R,N)+λ)`` over every (feature, candidate) pair
   (:func:`select`) — post-processing; no party ever holds the exact gains the exponential mechanism needs.
3. ``leaves`` (``Purpose.TREE``): per leaf the gradient sum and the count; the coordinator sums the leaves
   below a node that stopped and releases ``clamp(G/(h·max(n,N)+λ), ±β)`` (:func:`leaf_values`).

Budget (paper §4.4 carried over to Gaussian scales): a Gaussian of noise multiplier z costs the RDP
``α/(2z²)``; the tree's slope is split sketch : selection : leaves = 1/3 : 1/3 : 1/3, the selection third
over the d levels.  The tree is one :class:`~fedsbdt.common.accountant.PoissonSampledEvent` of the composed
Gaussians (:func:`tree_event`), charged with the tight subsampling bound of S-BDT's Thm. 14 — valid since a
composition of Gaussians has an RDP curve linear in α (Lemma 15,
:func:`fedsbdt.common.accountant.gaussian_multiplier`).  Side-effect free: ``server/session.py`` and
``common/modes/sarus/site.py`` call these functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.accountant import (AccountingError, ComposedEvent, GaussianEvent, PoissonSampledEvent,
                               PrivacyCalibration, _bisect_sigma, compose, default_alpha_max, event_epsilon_rdp,
                               event_rdp, init_score_events)
from fedsbdt.common.builders import Candidates, leaf_regions
from fedsbdt.common.modes.greedy.levels import LevelLayout, level_noise_scales, sketch_candidates, sketch_noise_scale
from fedsbdt.common.modes.sarus.mechanism import LEAF_SHARE, SELECT_SHARE, SKETCH_SHARE, clamped_score, leaf_value, may_split

from fedsbdt.common.modes.greedy.rounds import GreedyGrid


class SarusRequestError(ValueError):
    """A Sarus request carries a sketch or splits that do not fit the plan or the tree's released sketch."""


# --------------------------------------------------------------------------- budget and accounting


def split_sigmas(sigma_tree: float, depth: int) -> tuple[float, float, float]:
    """(σ_sketch, σ_level, σ_leaf) of a tree of slope ``1/σ_tree²`` (a Gaussian of multiplier σ/√2 has RDP
    α/σ²; slopes add): sketch and leaves a third each, each of the d levels a third / d (paper §4.4)."""
    return (sigma_tree / math.sqrt(SKETCH_SHARE), sigma_tree / math.sqrt(SELECT_SHARE / depth),
            sigma_tree / math.sqrt(LEAF_SHARE))


def tree_event(sigma_tree: float, depth: int, gamma: float) -> PoissonSampledEvent:
    """One federated Sarus tree as data: on a Poisson subsample of rate γ, the sketch, ``depth`` levels (the
    nodes of a level hold disjoint records: one release each) and the leaves, all Gaussian."""
    sk, lv, lf = split_sigmas(sigma_tree, depth)
    return PoissonSampledEvent(gamma, compose(GaussianEvent(sk / math.sqrt(2.0)),
                                              compose(GaussianEvent(lv / math.sqrt(2.0)), count=depth),
                                              GaussianEvent(lf / math.sqrt(2.0))))


def training_event(sigma_tree: float, depth: int, gamma: float, rounds: int, eps_init: float,
                   eps_ds: float) -> ComposedEvent:
    """Everything a federated Sarus run releases: the initial score and ``rounds`` trees."""
    return compose(init_score_events(eps_init, eps_ds), compose(tree_event(sigma_tree, depth, gamma), count=rounds))


@lru_cache(maxsize=64)
def calibrate_federated(epsilon: float, delta: float, rounds: int, depth: int, gamma: float,
                        init_share: float = 0.0, eps_ds: float = 0.0, accountant: str = "rdp") -> PrivacyCalibration:
    """The smallest σ_tree whose whole release (:func:`training_event`) is (ε, δ)-DP by the RDP ledger.

    ``sigma`` is σ_leaf, ``sigma_select`` σ_level, ``sigma_sketch`` σ_sketch (:func:`split_sigmas`).
    Only ``accountant = "rdp"``: the releases are Gaussian (not the paper's pure DP) and discrete
    (sums of discrete shares), which dp-accounting's continuous PLD does not dominate."""
    if accountant != "rdp":
        raise AccountingError(f"a federation accounts Sarus trees by the RDP ledger (accountant = \"rdp\"), not "
                              f"{accountant!r}: its releases are discrete Gaussians, not the paper's pure-DP Laplace")
    if not (epsilon > 0 and math.isfinite(epsilon)) or not 0 < delta < 1:
        raise AccountingError(f"need ε > 0 and 0 < δ < 1, got ε = {epsilon}, δ = {delta}")
    if rounds < 1 or depth < 1:
        raise AccountingError("at least one accounted tree of depth ≥ 1 is needed")
    eps_init = init_share * epsilon
    eps_ds = eps_ds if init_share > 0 else 0.0
    alpha_max = default_alpha_max(epsilon, delta)

    def eps_of(sigma_tree: float) -> float:
        return event_epsilon_rdp(training_event(sigma_tree, depth, gamma, rounds, eps_init, eps_ds), delta,
                                 alpha_max)[0]

    sigma_tree = _bisect_sigma(eps_of, epsilon)
    eps, alpha = event_epsilon_rdp(training_event(sigma_tree, depth, gamma, rounds, eps_init, eps_ds), delta,
                                   alpha_max)
    rho = float(event_rdp(compose(tree_event(sigma_tree, depth, gamma), count=rounds), np.array([alpha]))[0])
    sk, lv, lf = split_sigmas(sigma_tree, depth)
    return PrivacyCalibration("rdp", lf, alpha, rho, eps, delta, rounds, gamma, eps_init, eps_ds,
                              sigma_select=lv, sigma_sketch=sk, eps_rdp=eps)


def epsilon_curve(privacy: dict, points: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """ε after r accounted federated Sarus trees by the RDP ledger at the model's δ (the report's curve)."""
    T = int(privacy.get("rounds_accounted", 0) or 0)
    sigma_tree = float(privacy["sigma_sketch"]) * math.sqrt(SKETCH_SHARE)  # :func:`split_sigmas` inverted
    if T < 1 or depth < 1:
        return np.zeros(0), np.zeros(0)
    rs = np.unique(np.linspace(1, T, min(points, T)).round().astype(int))
    gamma, e_init, e_ds = float(privacy["subsample"]), float(privacy["eps_init"]), float(privacy["eps_ds"])
    delta = float(privacy["delta"])
    alpha_max = default_alpha_max(float(privacy.get("target_epsilon", privacy["epsilon"])), delta)
    return rs, np.array([event_epsilon_rdp(training_event(sigma_tree, depth, gamma, int(r), e_init, e_ds), delta,
                                           alpha_max)[0] for r in rs])


def plan_calibration(hp) -> PrivacyCalibration:
    """:func:`calibrate_federated` for a plan's hyperparameters."""
    return calibrate_federated(hp.epsilon, hp.delta, hp.accounted_rounds, hp.depth, hp.subsample, hp.init_share,
                               hp.eps_ds, hp.accountant)


# --------------------------------------------------------------------------- the public grid of a plan


def _leaf_layout(leaves: int) -> LevelLayout:
    """The leaf round's vector ``[G per leaf | n per leaf]``: one node per leaf, one bin."""
    return LevelLayout(leaves, np.array([0], np.int64), np.array([1], np.int64), np.array([False]))


@dataclass(frozen=True)
class SarusGrid:
    """The plan's fine sketch grid and the shapes and noise of its sketch, level and leaf vectors."""

    schema: object  # fedsbdt.common.schema.Schema
    depth: int
    candidates: int  # K: candidates the sketch keeps per numeric feature
    fine: Candidates
    fine_edges: list
    is_cat: np.ndarray
    numeric: np.ndarray  # the sketched (numeric) features
    count_units: int  # C: a record counts C integer units (fixed point, like the gradient sums)

    @classmethod
    def for_plan(cls, schema, hp, count_units: int) -> "SarusGrid":
        """``count_units``: the plan's gradient bound in units, so count entries carry noise of the same
        magnitude and sums of discrete-Gaussian shares stay close to one (``Plan.check_discrete_noise``)."""
        fine, edges = Candidates.grid(schema, min(255, 4 * hp.split_candidates))  # as central SarusTrees
        is_cat = np.array([f.is_categorical for f in schema.features])
        return cls(schema, hp.depth, hp.split_candidates, fine, edges, is_cat, np.flatnonzero(~is_cat),
                   int(count_units))

    def scale_counts(self, v: np.ndarray) -> np.ndarray:
        """``[sums | counts]`` with the counts in units of C (a vector, or its noise scales)."""
        v = np.array(v, copy=True)
        v[v.size // 2:] *= self.count_units
        return v

    def counts_of(self, v: np.ndarray) -> np.ndarray:
        """``[sums | counts]`` released in units back to ``[sums | counts]`` (float; post-processing)."""
        v = np.asarray(v, np.float64).copy()
        v[v.size // 2:] /= self.count_units
        return v

    # ------------------------------------------------------------------ the sketch

    @property
    def sketch_bins(self) -> np.ndarray:
        return np.array([len(self.fine_edges[f]) + 1 for f in self.numeric], np.int64)

    @property
    def sketch_len(self) -> int:
        return int(self.sketch_bins.sum())

    def fine_codes(self, X: np.ndarray) -> np.ndarray:
        return kernels.bin_codes(X, self.fine_edges, self.is_cat)

    def sketch_vector(self, codes: np.ndarray, present: np.ndarray) -> np.ndarray:
        """One party's sketch: per numeric feature the count of its present records in every fine bin (× C)."""
        rows = np.flatnonzero(present)
        parts = [np.bincount(np.minimum(codes[rows, f].astype(np.int64), b - 1), minlength=b)
                 for f, b in zip(self.numeric, self.sketch_bins)]
        return (np.concatenate(parts) if parts else np.zeros(0)).astype(np.int64) * self.count_units

    def sketch_noise_scales(self, sigma_sketch: float, shares: int = 1) -> np.ndarray:
        """Per-entry std (units) of one of ``shares`` shares: multiplier σ_k/√2 at L2 sensitivity √m·C."""
        s = sketch_noise_scale(self.numeric.size, self.count_units, sigma_sketch) / math.sqrt(shares)
        return np.full(self.sketch_len, s)

    def check_sketch(self, sketch) -> np.ndarray:
        s = np.asarray(sketch, np.int64)
        if s.shape != (self.sketch_len,):
            raise SarusRequestError(f"the released sketch has {s.size} bins, the plan's grid {self.sketch_len}")
        return s

    def tree_grid(self, sketch) -> GreedyGrid:
        """Post-processing of a released (noisy) sketch: per numeric feature the K fine edges at the weighted
        quantiles (:func:`sketch_candidates`), categorical features all their levels — the tree's candidate
        grid, in the federated greedy form (routing, level layouts, candidate checks)."""
        s = self.check_sketch(sketch) / self.count_units
        edges = list(self.fine_edges)
        offsets = np.concatenate([[0], np.cumsum(self.sketch_bins)])
        for i, f in enumerate(self.numeric):
            keep = sketch_candidates(s[None, offsets[i]:offsets[i + 1]], self.candidates)[0]
            edges[f] = self.fine_edges[f][keep]
        cand = Candidates.from_edges(self.schema, edges)
        return GreedyGrid(self.schema, self.depth, False, cand, edges, self.is_cat,
                          np.searchsorted(cand.feature, np.arange(self.schema.n_features)))

    # ------------------------------------------------------------------ levels and leaves

    def max_level_len(self) -> int:
        """The longest level vector any sketch can give: K edges (K + 1 bins) per numeric feature."""
        per_node = sum(min(len(f.levels), kernels.NO_LEVEL) + 1 if f.is_categorical else self.candidates + 1
                       for f in self.schema.features)
        return 2 * 2 ** (self.depth - 1) * per_node

    def leaf_layout(self) -> LevelLayout:
        return _leaf_layout(2**self.depth)

    def leaf_vector(self, node: np.ndarray, grad_units: np.ndarray, present: np.ndarray) -> np.ndarray:
        """One party's leaf vector ``[G per leaf | n per leaf]`` (``node``: each record's leaf)."""
        return self.level_vector(np.zeros((node.size, 1), np.uint8), node, grad_units, present, self.leaf_layout())

    def level_vector(self, codes, node, grad_units, present, layout: LevelLayout) -> np.ndarray:
        """One party's ``[G | n·C]`` histograms of ``layout`` (:func:`fedsbdt.common.modes.greedy.levels.level_sums`)."""
        from fedsbdt.common.modes.greedy.levels import level_sums

        return self.scale_counts(level_sums(codes, node, grad_units, present, layout))

    def level_noise_scales(self, layout: LevelLayout, grad_units: int, sigma: float, shares: int = 1) -> np.ndarray:
        """Per-entry std (units) of one of ``shares`` shares of a level's (or the leaves') noise (multiplier σ/√2;
        :func:`fedsbdt.common.modes.greedy.levels.level_noise_scales` with the counts in units of C)."""
        return self.scale_counts(level_noise_scales(layout, grad_units, sigma, shares))

    def leaf_noise_scales(self, grad_units: int, sigma_leaf: float, shares: int = 1) -> np.ndarray:
        """Per-entry std (units) of one of ``shares`` shares of the leaves' noise (multiplier σ_leaf/√2)."""
        return self.level_noise_scales(self.leaf_layout(), grad_units, sigma_leaf, shares)


# --------------------------------------------------------------------------- the coordinator's post-processing


def node_counts(noisy: np.ndarray, layout: LevelLayout) -> np.ndarray:
    """Each node's noisy count from a level's noisy count histograms: every carried feature's histogram sums
    to it, with noise variance ∝ its bins; their inverse-variance weighted mean (post-processing)."""
    v = np.asarray(noisy, np.float64).reshape(2, layout.n_nodes, layout.per_node)[1]
    totals = np.stack([v[:, o:o + b].sum(axis=1) for o, b in zip(layout.offsets, layout.bins)], axis=1)
    w = 1.0 / layout.bins.astype(np.float64)
    return totals @ w / w.sum()


def select(grid: GreedyGrid, noisy: np.ndarray, level: int, parent_stopped: np.ndarray, scale: float,
           min_child_weight: int, l2: float, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """(candidate index, stopped) per node of ``level`` from its noisy histograms (post-processing).

    A node splits only if its parent split and its noisy count (:func:`node_counts`) reaches 2N; it then
    takes the arg max over every (feature, candidate) pair of the clamped gain (noisy counts below 0 read
    as 0), the first in grid order on ties.  A stopped node keeps candidate 0 of the tree's grid (a dummy:
    its leaves share one released value)."""
    layout = grid.layout(0, level)
    v = np.asarray(noisy, np.float64).reshape(2, layout.n_nodes, layout.per_node)
    n_node = node_counts(noisy, layout)
    stopped = np.array([bool(parent_stopped[q]) or not may_split(n_node[q], min_child_weight)
                        for q in range(layout.n_nodes)])
    best = np.full(layout.n_nodes, -np.inf)
    chosen = np.zeros(layout.n_nodes, np.int64)
    rows = np.arange(layout.n_nodes)
    for k, (off, b) in enumerate(zip(layout.offsets, layout.bins)):
        G, N = v[0][:, off:off + b], v[1][:, off:off + b]
        Gt, Nt = G.sum(axis=1, keepdims=True), N.sum(axis=1, keepdims=True)
        if layout.categorical[k]:
            GL, NL = G[:, :-1], N[:, :-1]
        else:
            GL, NL = np.cumsum(G, axis=1)[:, :-1], np.cumsum(N, axis=1)[:, :-1]
        if GL.shape[1] == 0:
            continue
        u = clamped_score((GL / scale), np.maximum(NL, 0), min_child_weight, l2, weight) + \
            clamped_score(((Gt - GL) / scale), np.maximum(Nt - NL, 0), min_child_weight, l2, weight)
        j = np.argmax(u, axis=1)
        better = u[rows, j] > best
        best = np.where(better, u[rows, j], best)
        chosen = np.where(better, grid.cand_start[layout.features[k]] + j, chosen)
    return np.where(stopped, 0, chosen), stopped


def leaf_values(noisy: np.ndarray, stopped: np.ndarray, depth: int, scale: float, min_child_weight: int, l2: float,
                weight: float, leaf_clip: float) -> np.ndarray:
    """The released leaf values from the noisy ``[G | n]`` per leaf (post-processing): the leaves below a
    stopped node are summed into its region, ``V = G/(h·max(n, N) + λ)`` (noisy n below 0 read as 0),
    clamped to ±β — every leaf of a region carries its value."""
    v = np.asarray(noisy, np.float64).reshape(2, 2**depth)
    region = leaf_regions(np.asarray(stopped, bool), depth)
    G = np.bincount(region, weights=v[0], minlength=2 ** (depth + 1))
    n = np.bincount(region, weights=v[1], minlength=2 ** (depth + 1))
    values = leaf_value(G / scale, np.maximum(n, 0.0), min_child_weight, l2, weight)
    return np.clip(values, -leaf_clip, leaf_clip)[region]


def check_splits(grid: GreedyGrid, tree: int, features, thresholds) -> np.ndarray:
    """The candidate index of every split on the tree's grid (from its released sketch), else
    :class:`SarusRequestError`."""
    from fedsbdt.common.modes.greedy.rounds import GreedyRequestError

    try:
        return grid.candidate_index(tree, features, thresholds)
    except GreedyRequestError as e:
        raise SarusRequestError(f"the splits of tree {tree} are not among the candidates of its released sketch "
                                f"({e})") from None


# --------------------------------------------------------------------------- plan checks


def plan_refusal(hp, schema) -> str | None:
    """Why a federated plan cannot run Sarus trees with ``hp``, or None."""
    if schema.task == "multiclass":
        return "tree_builder = 'sarus' is for regression and binary tasks"
    if hp.accountant != "rdp":
        return ("a federation releases Sarus trees with Gaussian noise (no party holds the exact gains the paper's "
                "exponential mechanism needs): set accountant = \"rdp\" (docs/sarus.md \"Federation\")")
    return None


def share_coordinates(plan) -> list[tuple[tuple[float, float], ...]]:
    """Per Sarus release, the (full noise std, sensitivity) of the coordinates one record touches, in integer
    units: the sketch's counts (Δ = C), a level's gradient and count entries (Δ = g* units, C) and the
    leaves' (the same) — what the plan's share-closeness and range checks read."""
    grid, cal, g = plan.sarus_grid, plan.calibration(), plan.encoding.grad.bound_units
    m = plan.schema.n_features
    C = grid.count_units
    level = grid.level_noise_scales(LevelLayout(1, np.arange(m), np.ones(m, np.int64), grid.is_cat), g,
                                    cal.sigma_select)
    leaf = grid.leaf_noise_scales(g, cal.sigma)
    groups = [((float(level[0]), g), (float(level[-1]), C)), ((float(leaf[0]), g), (float(leaf[-1]), C))]
    if grid.numeric.size:
        groups.insert(0, ((float(grid.sketch_noise_scales(cal.sigma_sketch)[0]), C),))
    return groups


# --------------------------------------------------------------------------- the coordinator's tree in progress


class SarusTree:
    """The state of the Sarus tree in progress: its released sketch (and grid) and which nodes of the chosen
    levels stopped.  Post-processing only; the coordinator's tree rounds (common/modes/sarus/coordinator.py)
    hold one, and a site rebuilds one from a request's sketch."""

    def __init__(self, plan, sketch: np.ndarray | None = None, stopped=()) -> None:
        self.plan, self.grid = plan, plan.sarus_grid
        self.hp, self.enc, self.cal = plan.hyperparameters, plan.encoding, plan.calibration()
        self.weight = self.hp.hess_clip_for(plan.schema.task)  # h: every record's Hessian taken as h*
        self.reset()
        if sketch is not None:
            self.set_sketch(sketch)
        self.stopped = [np.asarray(s, bool) for s in stopped]

    def reset(self) -> None:
        self.sketch, self.tree_grid, self.stopped = None, None, []

    def set_sketch(self, sketch: np.ndarray) -> None:
        self.sketch = np.asarray(sketch, np.int64)
        self.tree_grid = self.grid.tree_grid(self.sketch)

    def next_purpose(self, levels: int):
        from fedsbdt.common.federation.wire import Purpose

        if self.sketch is None:
            return Purpose.SKETCH
        return Purpose.LEVEL if levels < self.hp.depth else Purpose.TREE

    def vector_len(self, purpose, level: int) -> int:
        from fedsbdt.common.federation.wire import Purpose

        if purpose == Purpose.SKETCH:
            return self.grid.sketch_len
        if purpose == Purpose.LEVEL:
            return self.tree_grid.layout(0, level).length
        return 2 * self.hp.leaves

    def choose(self, noisy: np.ndarray, level: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features, thresholds, stopped) of the level's nodes (:func:`select`); the state does not change."""
        parent = np.zeros(2**level, bool) if level == 0 else np.repeat(self.stopped[level - 1], 2)
        c, stopped = select(self.tree_grid, self.grid.counts_of(noisy), level, parent, self.enc.scale,
                            self.hp.min_child_weight, self.hp.l2, self.weight)
        cand = self.tree_grid.candidates
        return cand.feature[c].astype(np.int32), cand.threshold[c].astype(np.float64), stopped

    def leaf_values(self, noisy: np.ndarray) -> np.ndarray:
        return leaf_values(self.grid.counts_of(noisy), np.concatenate(self.stopped), self.hp.depth, self.enc.scale,
                           self.hp.min_child_weight, self.hp.l2, self.weight, self.hp.leaf_clip)
