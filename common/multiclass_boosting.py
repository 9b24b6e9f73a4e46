"""One party's multi-class training state: K margins per record, K class trees per round (common/multiclass.py).

:class:`MulticlassLocalData` is :class:`~fedsbdt.common.boosting.LocalData` with a
``(n, K)`` margin matrix; the round's public splits, the subsample and the
leaf of every record are shared by the K class trees.
"""
from __future__ import annotations

import numpy as np

from . import multiclass
from .boosting import Contribution, Encoding, LocalData
from .rdp_filter import FilterTable
from .splits import Splits


class MulticlassLocalData(LocalData):
    """Records with class-index labels ``y ∈ {0 … K−1}`` and margins ``pred`` of shape ``(n, K)``."""

    def __init__(self, *args, classes: int, **kw):
        super().__init__(*args, **kw)
        self.classes = int(classes)
        self.enc = Encoding.for_task(self.hp, self.task, self.classes)
        self.pred = np.zeros((self.n, self.classes))

    def init_sums(self) -> np.ndarray:
        """``[N, n_0 … n_{K−1}]`` over the records present at the start."""
        return multiclass.init_sums(self.y, self.arrival <= 0, self.classes)

    def set_init_score(self, score) -> None:
        self.pred = np.tile(np.broadcast_to(np.asarray(score, np.float64), (self.classes,)), (self.n, 1))

    def contribution(self, splits: Splits, round_id: int, randomness, table: FilterTable | None) -> Contribution:
        """The 2·K·L round vector of the available, subsampled records (no filter: check_supported)."""
        if table is not None:  # refused by multiclass.check_supported before any release
            raise ValueError("the individual Rényi filter does not support multiclass")
        hp, enc = self.hp, self.enc
        sampled = randomness.subsample(hp.subsample, self.ids, round_id)
        available = np.ones(self.n, bool) if self._all_available(round_id) else self.arrival <= round_id
        leaf = self.leaf_index(splits)
        selected = sampled & available
        gq, hq = multiclass.grad_hess_units(self.pred[selected], self.y[selected], enc.scale,
                                            enc.grad.bound_units, enc.hess.bound_units)
        sums = multiclass.leaf_sums(leaf[selected], gq, hq, np.ones(gq.shape[0], bool), hp.leaves)
        return Contribution(sums, leaf, None, int(available.sum()), int(selected.sum()))

    def apply(self, leaf: np.ndarray, values: np.ndarray) -> None:
        """Add the round's K class trees (values ``(K, L)`` or flat ``K·L``) to the margins."""
        v = np.asarray(values, np.float64).reshape(self.classes, -1)
        self.pred = self.pred + self.hp.learning_rate * v[:, np.asarray(leaf, np.int64)].T


def local_data_for(schema, X, y, ids, hp, arrival=None, edges=None, backend=None) -> LocalData:
    """The per-party state for ``schema``'s task (multiclass: :class:`MulticlassLocalData`); ``backend``: the
    kernel module (see :class:`~fedsbdt.common.boosting.LocalData`)."""
    is_cat = np.array([f.is_categorical for f in schema.features])
    if schema.task == "multiclass":
        return MulticlassLocalData(X, y, ids, schema.task, hp, schema.label_range, arrival, is_cat, edges=edges,
                                   classes=schema.n_classes, backend=backend)
    return LocalData(X, y, ids, schema.task, hp, schema.label_range, arrival, is_cat, edges=edges, backend=backend)
