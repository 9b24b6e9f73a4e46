"""S-BDT boosting: per-site leaf sums, DP noise scales and leaf values.

The split between "compute per-leaf sums on some records" (:class:`LocalData`,
run at every site) and "turn noisy sums into leaf values" (:func:`leaf_values`,
run once on the aggregate) is what lets the same code serve the centralised
engine (one party, full noise) and the federation (many parties, secure sum,
noise shares).  Everything summed is an int64 vector in fixed-point units, so
the federated sum equals the centralised sum exactly.

Round vector layout (length 2·2^d): ``[w_0 … w_{L−1}, u_0 … u_{L−1}]`` —
clipped Hessian sums then clipped gradient sums per leaf (Alg. 5 lines 2, 4).
Initial-score vector (length 2): ``[record count, clipped label sum]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import kernels, multiclass
from .accountant import PrivacyCalibration
from .candidates import schema_candidates
from .config import Hyperparameters
from .fixedpoint import FixedPointCodec
from .model import scale_labels
from .rdp_filter import FilterTable
from .splits import Splits, grid_thresholds

TASK_CODE = {"regression": kernels.REGRESSION, "binary": kernels.BINARY}


# --------------------------------------------------------------------------- encoding and noise


@dataclass(frozen=True)
class Encoding:
    """Fixed-point codecs of the three summed quantities (their bound = the clip = the sensitivity)."""

    grad: FixedPointCodec
    hess: FixedPointCodec
    label: FixedPointCodec
    classes: int = 1  # K > 1: multi-class, K trees per round (common/multiclass.py)

    @classmethod
    def for_task(cls, hp: Hyperparameters, task: str, classes: int = 1) -> "Encoding":
        return cls(FixedPointCodec(hp.grad_clip, hp.scale_bits),
                   FixedPointCodec(hp.hess_clip_for(task), hp.scale_bits),
                   FixedPointCodec(hp.label_clip, hp.scale_bits), classes)

    @classmethod
    def for_schema(cls, hp: Hyperparameters, schema) -> "Encoding":
        return cls.for_task(hp, schema.task, max(schema.n_classes, 1))

    @property
    def scale(self) -> float:
        return self.grad.scale


def leaf_noise_scales(hp: Hyperparameters, enc: Encoding, sigma: float, shares: int = 1) -> np.ndarray:
    """Per-coordinate std of the leaf noise in integer units (Thm. 16, Alg. 5 lines 3 and 5).

    Hessian sums: ``h*·σ/√(2·r1)``; gradient sums: ``g*·σ/√(2·r2)`` — with the
    sensitivities h*, g* taken as the integer clip bounds.  With ``shares = t``
    each of t parties adds a share of variance 1/t of that (distributed mode).
    Multi-class: :func:`fedsbdt.common.multiclass.leaf_noise_scales`.
    """
    if enc.classes > 1:
        return multiclass.leaf_noise_scales(hp, enc, sigma, shares)
    L = hp.leaves
    sh = enc.hess.bound_units * sigma / math.sqrt(2.0 * hp.r1) / math.sqrt(shares)
    sg = enc.grad.bound_units * sigma / math.sqrt(2.0 * hp.r2) / math.sqrt(shares)
    return np.concatenate([np.full(L, sh), np.full(L, sg)])


def init_noise_scales(hp: Hyperparameters, enc: Encoding, cal: PrivacyCalibration) -> np.ndarray:
    """Discrete-Laplace scales for ``[count, label sum]``: 1/ε_ds and m*/ε_init (Alg. 3 lines 1, 4)."""
    if enc.classes > 1:
        return multiclass.init_noise_scales(enc.classes, cal)
    return np.array([1.0 / cal.eps_ds, enc.label.bound_units / cal.eps_init])


def leaf_values(noisy_sums: np.ndarray, hp: Hyperparameters, enc: Encoding) -> np.ndarray:
    """DPLeaf post-processing (Alg. 5 line 6): ``clamp(ũ / (w̃ + λ), −β, β)`` per leaf.

    A negative noisy Hessian sum w̃ (noise swamped an almost empty leaf) gives
    the leaf value 0, as the reference implementation does: this is
    post-processing of the released sums, so it costs no privacy, and it
    avoids a leaf of the wrong sign and maximal size.  Multi-class: ``(K, L)`` values.
    """
    if enc.classes > 1:
        return multiclass.leaf_values(noisy_sums, hp, enc)
    return kernels.leaf_values(np.asarray(noisy_sums, dtype=np.int64), hp.leaves, enc.hess.scale, enc.grad.scale,
                               hp.l2, hp.leaf_clip)


def init_score(noisy: np.ndarray, task: str, enc: Encoding) -> float:
    """Alg. 3 lines 3–9 from the noisy ``[count, label sum]``.  Multi-class: K centred log priors."""
    if enc.classes > 1:
        return multiclass.init_score(noisy, enc.classes)
    count = max(float(noisy[0]), 1.0)
    mean = float(enc.label.decode(np.asarray(noisy[1:2]))[0]) / count
    if task == "regression":
        return float(np.clip(mean, -1.0, 1.0))
    p = float(np.clip(mean, 1e-3, 1.0 - 1e-3))
    return math.log(p / (1.0 - p))


# --------------------------------------------------------------------------- per-site state


@dataclass
class Contribution:
    """What one party computed for one round, before noise and masking."""

    sums: np.ndarray  # int64 (2L): per-leaf clipped Hessian and gradient sums
    leaf: np.ndarray  # int32 (n): leaf of every local record in this round's tree
    new_spent: np.ndarray | None  # int64 (n): ledger after this round (filter on), to persist before sending
    active: int  # records that passed the filter (private: never leaves the site)
    sampled: int  # records in the Poisson subsample (private)


def split_edges(schema, split_candidates: int) -> list | None:
    """Public candidate thresholds per feature (None for categorical ones), or None without candidates.

    Mirrors the candidate formula of :func:`fedsbdt.common.splits.random_splits` (the schema's placed
    candidates where it declares them, common/candidates.py).
    They only let :class:`LocalData` walk trees on one-byte codes; if they
    ever disagree with the splits, the affected trees silently take the
    float path (:func:`kernels.code_bounds`), so results never change.
    """
    if not 0 < split_candidates <= 255:
        return None
    placed = schema_candidates(schema, split_candidates)  # the schema's own placements (scale, cuts)
    return [None if f.is_categorical else
            placed[j] if placed[j] is not None else
            grid_thresholds(np.full(split_candidates, f.lo), np.full(split_candidates, f.hi),
                            np.arange(1, split_candidates + 1), split_candidates)
            for j, f in enumerate(schema.features)]


class LocalData:
    """One party's records and training state (predictions, Rényi ledger).

    ``edges`` (optional, public): candidate thresholds per feature, see
    :func:`split_edges`; with them trees are walked on one-byte codes of the
    records (same leaves, less memory traffic).  ``backend``: the kernel module
    (:mod:`fedsbdt.common.kernels`, numba, by default; :mod:`fedsbdt.common.kernels_numpy` gives
    the same results without loading numba, for a long-running site daemon).
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, ids: np.ndarray, task: str, hp: Hyperparameters,
                 label_range: tuple[float, float] | None = None, arrival: np.ndarray | None = None,
                 is_categorical: np.ndarray | None = None, *, edges: list | None = None,
                 backend=None):
        self.kernels = kernels if backend is None else backend
        self.X = np.ascontiguousarray(X, dtype=np.float64)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.task = task
        self.hp = hp
        self.enc = Encoding.for_task(hp, task)
        self.y = scale_labels(y, label_range) if task == "regression" else np.asarray(y, dtype=np.float64)
        self.arrival = np.zeros(len(self.ids), np.int64) if arrival is None else np.asarray(arrival, np.int64)
        self.is_cat = (np.zeros(self.X.shape[1], bool) if is_categorical is None
                       else np.asarray(is_categorical, dtype=bool))
        self.pred = np.zeros(len(self.ids))
        self.spent = np.zeros(len(self.ids), dtype=np.int64)  # ledger units (rdp_filter)
        self._edges = None
        if edges is not None and len(edges) == self.X.shape[1]:
            self._edges = [None if e is None else np.unique(np.asarray(e, np.float64)) for e in edges]
            if not all(e is None or e.size <= 255 for e in self._edges):
                self._edges = None
        self._packed = None if self._edges is None else self.kernels.pack_edges(self._edges)
        self._codes_key = None  # (X, is_cat) the codes were built from
        self._codes = None
        self._arrival_key = None  # (arrival, its maximum)
        self._grads = None  # (pred, y, their grad_hess_units)
        self._kept_leaves = None  # (splits, the leaf of every record in that tree)

    def _all_available(self, round_id: int) -> bool:
        if self._arrival_key is None or self._arrival_key[0] is not self.arrival:
            self._arrival_key = (self.arrival, int(self.arrival.max()) if self.arrival.size else 0)
        return round_id >= self._arrival_key[1]

    def _record_codes(self) -> np.ndarray | None:
        if self._edges is None:
            return None
        if self._codes_key is None or self._codes_key[0] is not self.X or self._codes_key[1] is not self.is_cat:
            self._codes = self.kernels.bin_codes(self.X, self._edges, self.is_cat, column_major=self.hp.cyclical)
            self._codes_key = (self.X, self.is_cat)
        return self._codes

    @property
    def n(self) -> int:
        return len(self.ids)

    def init_sums(self) -> np.ndarray:
        """``[count, Σ clamp(y)]`` over records present at the start (Alg. 3 lines 1, 3, 7)."""
        present = self.arrival <= 0
        lo = -self.hp.label_clip if self.task == "regression" else 0.0
        labels = np.clip(self.y[present], lo, self.hp.label_clip)
        return np.array([int(present.sum()), int(self.enc.label.encode(labels).sum())], dtype=np.int64)

    def set_init_score(self, score: float) -> None:
        self.pred = np.full(self.n, float(score))

    def grad_hess_units(self) -> tuple[np.ndarray, np.ndarray]:
        """Every record's clipped gradient and Hessian in integer units at the current predictions (Alg. 5
        lines 2 and 4), kept until the predictions change."""
        if not self._grads_current():
            enc = self.enc
            self._grads = self.pred, self.y, self.kernels.grad_hess_units(
                self.pred, self.y, TASK_CODE[self.task], enc.scale, enc.grad.bound_units, enc.hess.bound_units)
        return self._grads[2]

    def _grads_current(self) -> bool:
        return self._grads is not None and self._grads[0] is self.pred and self._grads[1] is self.y

    def contribution(self, splits: Splits, round_id: int, randomness, table: FilterTable | None) -> Contribution:
        """Alg. 2 lines 6–9 for the local records: gradients, filter, subsample, leaf sums."""
        hp, enc = self.hp, self.enc
        available = None if self._all_available(round_id) else self.arrival <= round_id
        sampled = randomness.subsample(hp.subsample, self.ids, round_id)
        leaf = self.leaf_index(splits)
        filter_args = None if table is None else (table.cost_units, self.spent, table.budget_units)
        grads = self._grads[2] if self._grads_current() else None  # as the splits computed them
        sums, new_spent, n_active, n_sampled = self.kernels.round_sums(
            leaf, self.pred, self.y, TASK_CODE[self.task], enc.scale, enc.grad.bound_units, enc.hess.bound_units,
            sampled, available, hp.leaves, filter_args, grads)
        return Contribution(sums, leaf, new_spent, n_active, n_sampled)

    def keep_leaves(self, splits: Splits, leaf: np.ndarray) -> None:
        """Keep the leaf of every local record in the tree ``splits`` (this very object), as its builder found
        them routing the records down the tree: :meth:`leaf_index` then need not walk it again."""
        self._kept_leaves = splits, np.asarray(leaf, np.int32)

    def leaf_index(self, splits: Splits) -> np.ndarray:
        """Leaf of every local record in the tree ``splits`` (int32)."""
        if self._kept_leaves is not None and self._kept_leaves[0] is splits:
            return self._kept_leaves[1]
        if splits.default_left is not None and self.has_missing():  # NaN by the split's default direction
            return self.kernels.leaf_index(self.X, splits.features, splits.thresholds, self.is_cat, self.hp.depth,
                                           default_left=splits.default_left)
        codes = self._record_codes()
        if codes is not None:
            b = self.kernels.code_bounds(splits.features, splits.thresholds, self.is_cat, self._packed)
            if b is not None:
                return self.kernels.leaf_index_codes(codes, splits.features, b[0], b[1], self.hp.depth)
        return self.kernels.leaf_index(self.X, splits.features, splits.thresholds, self.is_cat, self.hp.depth)

    def has_missing(self) -> bool:
        """True if some local value is missing (NaN); such records need the float walk with directions."""
        key = getattr(self, "_missing_key", None)
        if key is None or key[0] is not self.X:
            self._missing_key = (self.X, bool(np.isnan(self.X).any()))
        return self._missing_key[1]

    def commit(self, c: Contribution) -> None:
        """Adopt the ledger of a contribution (after it was persisted)."""
        if c.new_spent is not None:
            self.spent = c.new_spent

    def apply(self, leaf: np.ndarray, values: np.ndarray) -> None:
        """Add the released tree to the local predictions."""
        self.pred = self.kernels.apply_leaves(self.pred, leaf, values, self.hp.learning_rate)
